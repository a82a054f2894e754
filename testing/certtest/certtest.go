// Package certtest writes throwaway certificate authorities and the
// certificates they sign, as PEM files, for tests of TLS and mutual TLS
// on loopback (like httptest's certificates, but to files a real process
// can be given).
package certtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// serial numbers the certificates of one test process.
var serial atomic.Int64

// CA is a certificate authority of a test.
type CA struct {
	// File is the CA's certificate as a PEM file.
	File string
	// Pool trusts the CA.
	Pool *x509.CertPool

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

// NewCA makes a certificate authority called name, valid for an hour,
// its certificate written to a new directory of tb's.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("certtest: CA %s: %v", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("certtest: CA %s: %v", name, err)
	}
	ca := &CA{cert: cert, key: key, dir: tb.TempDir(), Pool: x509.NewCertPool()}
	ca.Pool.AddCert(cert)
	ca.File = filepath.Join(ca.dir, name+"-ca.pem")
	writePEM(tb, ca.File, "CERTIFICATE", der)
	return ca
}

// Issue signs a certificate called name for 127.0.0.1, ::1 and
// localhost, good for both TLS servers and TLS clients, and writes it and
// its private key (mode 0600) next to the CA's file.
func (ca *CA) Issue(tb testing.TB, name string) (certFile, keyFile string) {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("certtest: certificate %s: %v", name, err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatalf("certtest: key of %s: %v", name, err)
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+"-key.pem")
	writePEM(tb, certFile, "CERTIFICATE", der)
	writePEM(tb, keyFile, "EC PRIVATE KEY", kb)
	return certFile, keyFile
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("certtest: key: %v", err)
	}
	return key
}

func writePEM(tb testing.TB, path, typ string, der []byte) {
	tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatalf("certtest: %v", err)
	}
}
