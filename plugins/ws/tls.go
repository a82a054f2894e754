package ws

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

// certCheckEvery is how often, at most, a TLS handshake looks at whether
// the certificate files changed.
const certCheckEvery = time.Second

// fileStamp is what tells that a file changed.
type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}, nil
}

// loadedCert is a certificate and the stamps of the files it came from.
type loadedCert struct {
	cert      *tls.Certificate
	certStamp fileStamp
	keyStamp  fileStamp
}

// certSource serves the certificate read from a PEM certificate and key
// file pair, and reads them again when either file's modification time or
// size changes (looked at by a handshake at most every checkEvery), so a
// renewed certificate is served without a restart. A pair that does not
// load (e.g. while a renewal has replaced one file but not yet the other)
// is logged and the previous certificate kept.
type certSource struct {
	certFile, keyFile string
	checkEvery        time.Duration
	log               zerolog.Logger

	cur     atomic.Pointer[loadedCert]
	checked atomic.Int64 // unix nanos of the last look at the files
	lastErr atomic.Value // string: the last reload error logged
}

// newCertSource reads the pair once: a pair that does not load fails Start.
func newCertSource(certFile, keyFile string, checkEvery time.Duration, log zerolog.Logger) (*certSource, error) {
	cs := &certSource{certFile: certFile, keyFile: keyFile, checkEvery: checkEvery, log: log}
	lc, err := cs.load()
	if err != nil {
		return nil, fmt.Errorf("start: tls: %w: %w", err, contract.ErrInvalidArgument)
	}
	cs.cur.Store(lc)
	cs.checked.Store(time.Now().UnixNano())
	cs.lastErr.Store("")
	return cs, nil
}

func (cs *certSource) load() (*loadedCert, error) {
	// Stamps first: a file changed during the read is read again later.
	cst, err := stampOf(cs.certFile)
	if err != nil {
		return nil, err
	}
	kst, err := stampOf(cs.keyFile)
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(cs.certFile, cs.keyFile)
	if err != nil {
		return nil, err
	}
	return &loadedCert{cert: &cert, certStamp: cst, keyStamp: kst}, nil
}

// getCertificate is the tls.Config.GetCertificate of the listener.
func (cs *certSource) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	now := time.Now().UnixNano()
	last := cs.checked.Load()
	if now-last >= int64(cs.checkEvery) && cs.checked.CompareAndSwap(last, now) {
		cs.refresh() // one handshake at a time looks; the others use the current one
	}
	return cs.cur.Load().cert, nil
}

// refresh reloads the pair if either file changed.
func (cs *certSource) refresh() {
	cur := cs.cur.Load()
	cst, cerr := stampOf(cs.certFile)
	kst, kerr := stampOf(cs.keyFile)
	if cerr == nil && kerr == nil && cst == cur.certStamp && kst == cur.keyStamp {
		return
	}
	lc, err := cs.load()
	if err != nil {
		if msg := err.Error(); cs.lastErr.Swap(msg) != msg {
			cs.log.Warn().Err(err).Str("cert", cs.certFile).Str("key", cs.keyFile).
				Msg("tls: the changed certificate does not load; still serving the previous one")
		}
		return
	}
	cs.lastErr.Store("")
	cs.cur.Store(lc)
	cs.log.Info().Str("cert", cs.certFile).Time("not_after", lc.cert.Leaf.NotAfter).Msg("tls: certificate reloaded")
}

// tlsConfig is the server's TLS configuration: TLS 1.2 or later, HTTP/1.1
// only (a WebSocket upgrade is an HTTP/1.1 request).
func (cs *certSource) tlsConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"http/1.1"},
		GetCertificate: cs.getCertificate,
	}
}
