package ws_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gobws "github.com/gobwas/ws"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
)

// testCert is a self-signed certificate for 127.0.0.1 and localhost.
type testCert struct {
	certPEM, keyPEM []byte
	serial          int64
	x509            *x509.Certificate
}

func newTestCert(t testing.TB, serial int64) testCert {
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
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return testCert{
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		serial:  serial,
		x509:    cert,
	}
}

// write writes the pair to certFile and keyFile, with a modification time
// of mod (so a rewrite within one clock tick is seen as a change too).
func (c testCert) write(t testing.TB, certFile, keyFile string, mod time.Time) {
	t.Helper()
	for _, f := range []struct {
		path string
		data []byte
	}{{certFile, c.certPEM}, {keyFile, c.keyPEM}} {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f.path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
}

// tlsFiles writes c into a temp dir and returns the two paths.
func tlsFiles(t testing.TB, c testCert) (certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	c.write(t, certFile, keyFile, time.Now())
	return certFile, keyFile
}

// clientTLS trusts the certificates given.
func clientTLS(certs ...testCert) *tls.Config {
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c.x509)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// httpsGet fetches url over TLS without keep-alive.
func httpsGet(t testing.TB, cfg *tls.Config, url string, hdr http.Header) (*http.Response, string) {
	t.Helper()
	cl := &http.Client{
		Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true},
		Timeout:   waitTimeout,
	}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp, string(body)
}

// servedSerial returns the serial number of the certificate a handshake
// with addr gets.
func servedSerial(t testing.TB, addr string, cfg *tls.Config) int64 {
	t.Helper()
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: waitTimeout}, Config: cfg}
	nc, err := d.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}
	defer nc.Close()
	return nc.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// TestTLS serves the page, /healthz and a WebSocket over TLS with a
// self-signed certificate made here, and checks what plain HTTP and old
// TLS versions get.
func TestTLS(t *testing.T) {
	cert := newTestCert(t, 1)
	certFile, keyFile := tlsFiles(t, cert)
	static := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("static " + r.URL.Path))
	})
	s, addr := startServer(t, contract.StartRequest{TLSCertFile: certFile, TLSKeyFile: keyFile},
		func(s *ws.Server) { s.Static = static })
	r := link(t, s)
	cfg := clientTLS(cert)

	t.Run("page", func(t *testing.T) {
		resp, body := httpsGet(t, cfg, "https://"+addr+"/", nil)
		if resp.StatusCode != http.StatusOK || body != "static /" {
			t.Errorf("GET /: got %d %q, want 200 %q", resp.StatusCode, body, "static /")
		}
		if resp.TLS == nil || resp.TLS.Version < tls.VersionTLS12 {
			t.Errorf("GET /: TLS state %+v, want TLS 1.2 or later", resp.TLS)
		}
		if resp.ProtoMajor != 1 {
			t.Errorf("GET /: protocol %s, want HTTP/1.1 (a WebSocket upgrade needs it)", resp.Proto)
		}
	})
	t.Run("healthz", func(t *testing.T) {
		resp, body := httpsGet(t, cfg, "https://"+addr+"/healthz", nil)
		if resp.StatusCode != http.StatusOK || body != "ok" {
			t.Errorf("GET /healthz: got %d %q, want 200 ok", resp.StatusCode, body)
		}
	})
	t.Run("wss", func(t *testing.T) {
		d := gobws.Dialer{Timeout: waitTimeout, TLSConfig: cfg}
		nc, br, _, err := d.Dial(context.Background(), "wss://"+addr+"/api/ws?x=1")
		if err != nil {
			t.Fatalf("dial wss: %v", err)
		}
		t.Cleanup(func() { nc.Close() })
		c := &client{t: t, nc: nc, r: nc}
		if br != nil {
			c.r = br
		}
		e := r.opened(t, c)
		if e.Path != "/api/ws" || e.Query != "x=1" || e.Host != addr {
			t.Errorf("Opened: got path %q query %q host %q, want /api/ws x=1 %s", e.Path, e.Query, e.Host, addr)
		}
		exec(t, s, admit(e.Conn), sendText(e.Conn, "over tls"))
		if op, p := c.readMessage(); op != gobws.OpText || string(p) != "over tls" {
			t.Errorf("client: got %v %q, want text %q", op, p, "over tls")
		}
		c.mustWrite(gobws.OpText, []byte("back"))
		if f := r.waitFrom(t, "the client's frame", 0, isFrame(e.Conn)); string(f.Data) != "back" {
			t.Errorf("Frame: got %q, want %q", f.Data, "back")
		}
		exec(t, s, contract.Command{Kind: contract.CommandClose, Conn: e.Conn, Code: 4409, Reason: "superseded"})
		if code, reason := c.mustReadClose(); code != 4409 || reason != "superseded" {
			t.Errorf("close: got %d %q, want 4409 superseded", code, reason)
		}
		r.closed(t, e.Conn)
	})
	t.Run("plain HTTP", func(t *testing.T) {
		status, body := httpDo(t, http.MethodGet, "http://"+addr+"/")
		if status != http.StatusBadRequest || strings.Contains(body, "static") {
			t.Errorf("plain GET /: got %d %q, want 400 and no page", status, body)
		}
	})
	t.Run("TLS 1.1", func(t *testing.T) {
		old := cfg.Clone()
		old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
		nc, err := tls.DialWithDialer(&net.Dialer{Timeout: waitTimeout}, "tcp", addr, old)
		if err == nil {
			nc.Close()
			t.Fatal("a TLS 1.1 handshake succeeded, want it refused")
		}
	})
}

// TestTLSHandshakeTimeout checks that a client that opens TCP and never
// starts the handshake is closed after the header timeout.
func TestTLSHandshakeTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	certFile, keyFile := tlsFiles(t, newTestCert(t, 1))
	s, addr := startServer(t, contract.StartRequest{TLSCertFile: certFile, TLSKeyFile: keyFile, HeaderTimeout: timeout})
	start := time.Now() // before the dial: the server's clock starts after it
	nc := rawDial(t, addr)
	if _, err := readAll(t, nc); err != nil {
		t.Fatalf("read: got %v, want the server to close", err)
	}
	if elapsed := time.Since(start); elapsed < timeout {
		t.Errorf("closed after %v, want no sooner than %v", elapsed, timeout)
	}
	waitFor(t, "its place freed", func() bool { return stats(t, s).Connections == 0 })
}

// TestTLSMaxConnections checks that a connection past the bound gets its
// 503 over TLS.
func TestTLSMaxConnections(t *testing.T) {
	cert := newTestCert(t, 1)
	certFile, keyFile := tlsFiles(t, cert)
	s, addr := startServer(t, contract.StartRequest{TLSCertFile: certFile, TLSKeyFile: keyFile, MaxConnections: 2})
	rawDial(t, addr)
	rawDial(t, addr)
	nc, err := tls.DialWithDialer(&net.Dialer{Timeout: waitTimeout}, "tcp", addr, clientTLS(cert))
	if err != nil {
		t.Fatalf("TLS dial past the bound: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	if _, err := io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(waitTimeout))
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status: got %d, want 503", resp.StatusCode)
	}
	if st := stats(t, s); st.Refused503 != 1 {
		t.Errorf("Stats: got %+v, want 1 refused", st)
	}
}

// TestTLSReload checks that a renewed certificate is served without a
// restart, and that a pair that does not load keeps the previous one.
func TestTLSReload(t *testing.T) {
	a, b, c := newTestCert(t, 1), newTestCert(t, 2), newTestCert(t, 3)
	certFile, keyFile := tlsFiles(t, a)
	_, addr := startServer(t, contract.StartRequest{TLSCertFile: certFile, TLSKeyFile: keyFile},
		func(s *ws.Server) { s.SetCertCheckEvery(0) })
	cfg := clientTLS(a, b, c)
	if got := servedSerial(t, addr, cfg); got != 1 {
		t.Fatalf("serial: got %d, want 1", got)
	}

	later := time.Now().Add(time.Minute)
	b.write(t, certFile, keyFile, later)
	if got := servedSerial(t, addr, cfg); got != 2 {
		t.Errorf("after renewal: serial %d, want 2", got)
	}

	// Half a renewal: c's certificate with b's key does not load.
	if err := os.WriteFile(certFile, c.certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(certFile, later.Add(time.Minute), later.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := servedSerial(t, addr, cfg); got != 2 {
		t.Errorf("with a mismatched pair: serial %d, want the previous 2", got)
	}
	c.write(t, certFile, keyFile, later.Add(2*time.Minute))
	if got := servedSerial(t, addr, cfg); got != 3 {
		t.Errorf("after the renewal completed: serial %d, want 3", got)
	}
}

func TestTLSStartErrors(t *testing.T) {
	cert := newTestCert(t, 1)
	certFile, keyFile := tlsFiles(t, cert)
	other := newTestCert(t, 2)
	otherCert, otherKey := tlsFiles(t, other)
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a PEM file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, cert, key string
	}{
		{"garbage certificate", garbage, keyFile},
		{"garbage key", certFile, garbage},
		{"key of another certificate", certFile, otherKey},
		{"certificate of another key", otherCert, keyFile},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ws.New(testLogger(t))
			_, err := s.Start(context.Background(), contract.StartRequest{Listen: "127.0.0.1:0", TLSCertFile: tt.cert, TLSKeyFile: tt.key})
			if !errors.Is(err, contract.ErrInvalidArgument) {
				t.Errorf("Start: got %v, want ErrInvalidArgument", err)
			}
			if err := s.Stop(context.Background(), contract.StopRequest{}); err != nil {
				t.Errorf("Stop: %v", err)
			}
		})
	}
}
