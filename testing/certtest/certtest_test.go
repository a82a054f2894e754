package certtest_test

import (
	"crypto/tls"
	"crypto/x509"
	"testing"

	"github.com/tether-agent/tether/testing/certtest"
)

// TestIssue: a certificate verifies for 127.0.0.1 and localhost, as a
// server's and as a client's, against its own CA and not another's.
func TestIssue(t *testing.T) {
	ca, other := certtest.NewCA(t, "a"), certtest.NewCA(t, "b")
	certFile, keyFile := ca.Issue(t, "host")
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"127.0.0.1", "localhost", "::1"} {
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool, DNSName: name, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("%s, usage %v: %v", name, usage, err)
			}
			if _, err := cert.Verify(x509.VerifyOptions{Roots: other.Pool, DNSName: name, KeyUsages: []x509.ExtKeyUsage{usage}}); err == nil {
				t.Errorf("%s verifies against another CA", name)
			}
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool, DNSName: "example.com"}); err == nil {
		t.Error("verifies for example.com")
	}
}
