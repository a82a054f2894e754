package e2e_test

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/wire"
)

// selfSigned writes a certificate for 127.0.0.1 and localhost and its key
// to dir, and returns their paths and a pool that trusts it.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	certFile, keyFile, cert := selfSignedSerial(t, dir, 1)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// selfSignedSerial writes a self-signed certificate for 127.0.0.1 and
// localhost with the given serial number, and its key, to dir as cert.pem
// and key.pem, and returns their paths and the certificate.
func selfSignedSerial(t *testing.T, dir string, serial int64) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: "tether test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err = x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

// TestTLSEverywhere serves HTTPS/WSS with a certificate made in the test:
// the printed URL is https, the page (with its Secure cookie), /healthz,
// the JSON-RPC gateway and the PTY endpoint work over TLS, and `tether
// attach` joins a PTY over wss.
func TestTLSEverywhere(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	s := e2e.Start(t, e2e.Config{Args: []string{"--tls-cert", certFile, "--tls-key", keyFile, "--pty-command", "cat"}})
	if !strings.HasPrefix(s.Stdout(), "tether listening on https://") {
		t.Fatalf("listening line %q, want an https URL", s.Stdout())
	}
	base := "https://" + s.Addr
	tlsCfg := &tls.Config{RootCAs: pool}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true}}
	resp, err := hc.Get(base + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz over TLS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/healthz over TLS: %d", resp.StatusCode)
	}
	resp, err = hc.Get(base + "/?token=" + s.Token)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if ck := resp.Header.Get("Set-Cookie"); resp.StatusCode != 200 || !strings.Contains(ck, "Secure") || !strings.Contains(ck, "HttpOnly") {
		t.Errorf("page over TLS: %d, Set-Cookie %q; want 200 and a Secure HttpOnly cookie", resp.StatusCode, ck)
	}
	// Plain HTTP on the TLS port is refused.
	if r, err := http.Get("http://" + s.Addr + "/healthz"); err == nil {
		r.Body.Close()
		if r.StatusCode == 200 {
			t.Error("plain HTTP answered 200 on the TLS listener")
		}
	}

	ctx := ctxT(t, 20*time.Second)
	c, err := client.Dial(ctx, base, client.Options{Token: s.Token, TLSConfig: tlsCfg, Origin: base})
	if err != nil {
		t.Fatalf("JSON-RPC over wss: %v", err)
	}
	defer c.Close()
	snap, err := c.Create(ctx, wire.CreateParams{Title: "over tls"})
	if err != nil || snap.SessionID == "" {
		t.Fatalf("session.create over wss: %+v, %v", snap, err)
	}
	p, err := client.AttachPTY(ctx, base, wire.NewAttachToken(), client.PTYOptions{Options: client.Options{Token: s.Token, TLSConfig: tlsCfg}})
	if err != nil {
		t.Fatalf("PTY over wss: %v", err)
	}
	if _, err := p.Write([]byte("over tls\n")); err != nil {
		t.Fatal(err)
	}
	var got []byte
	buf := make([]byte, 4096)
	for !strings.Contains(string(got), "over tls") {
		n, err := p.Read(buf)
		if err != nil {
			t.Fatalf("PTY output over wss: %v (so far %q)", err, got)
		}
		got = append(got, buf[:n]...)
	}
	p.Close()

	// tether attach, trusting the certificate through SSL_CERT_FILE.
	cmd := exec.Command(e2e.Build(t), "attach", "--url", base, "--state-dir", s.StateDir, "--new")
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+certFile, "TETHER_TOKEN=")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr e2e.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	fmt.Fprintln(stdin, "echo attach-over-wss")
	found := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "attach-over-wss") {
				found <- true
				return
			}
		}
		found <- false
	}()
	select {
	case ok := <-found:
		if !ok {
			t.Fatalf("tether attach over wss ended without the echo; stderr:\n%s", stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("tether attach over wss: no echo within 20 s; stderr:\n%s", stderr.String())
	}
}

// TestTLSRenewal renews the certificate the way an operator does: the
// files are replaced (renamed over, as certbot and most tools do), then
// the host gets SIGHUP, which swaps the transport for a fresh process that
// serves the new pair; `tether plugins reload ws` does the same. Each
// step is checked by the serial number of the certificate served.
func TestTLSRenewal(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, certA := selfSignedSerial(t, dir, 1)
	pool := x509.NewCertPool()
	pool.AddCert(certA)
	s := e2e.Start(t, e2e.Config{Args: []string{"--tls-cert", certFile, "--tls-key", keyFile, "--pty-command", ""}})
	served := func() int64 {
		t.Helper()
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: &tls.Config{RootCAs: pool}}
		c, err := d.DialContext(ctxT(t, 10*time.Second), "tcp", s.Addr)
		if err != nil {
			t.Fatalf("TLS handshake with %s: %v", s.Addr, err)
		}
		defer c.Close()
		return c.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	renew := func(serial int64) {
		t.Helper()
		next := t.TempDir()
		c, k, cert := selfSignedSerial(t, next, serial)
		pool.AddCert(cert)
		if err := os.Rename(k, keyFile); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(c, certFile); err != nil {
			t.Fatal(err)
		}
	}
	if got := served(); got != 1 {
		t.Fatalf("served serial %d at start, want 1", got)
	}
	oldPid := pluginsJSON(t, s.StateDir)["ws"].Pid

	renew(2)
	if err := s.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// Logged once the old process is retired: the new one alone serves.
	swapped := waitLogLine(t, s, "transport plugin swapped", map[string]any{"plugin": "ws"})
	if fmt.Sprint(swapped["pid"]) == fmt.Sprint(oldPid) {
		t.Fatalf("after SIGHUP: ws still pid %d, want a fresh process", oldPid)
	}
	if got := served(); got != 2 {
		t.Errorf("served serial %d after renewal and SIGHUP, want 2", got)
	}

	renew(3)
	if _, errOut, code := e2e.Tether(t, "plugins", "reload", "ws", "--state-dir", s.StateDir); code != 0 {
		t.Fatalf("tether plugins reload ws: exit %d\n%s", code, errOut)
	}
	if got := served(); got != 3 {
		t.Errorf("served serial %d after renewal and tether plugins reload ws, want 3", got)
	}
	if status, _ := httpsGet(t, pool, "https://"+s.Addr+"/healthz"); status != 200 {
		t.Errorf("/healthz over TLS after the renewals: %d, want 200", status)
	}
}

// httpsGet fetches url trusting pool, without keeping the connection.
func httpsGet(t *testing.T, pool *x509.CertPool, url string) (int, string) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
