package embedded

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Who may use the cluster's bus: every process that holds the cluster's
// credentials is a host (it can read every bucket and stream and publish
// on every subject, a relayed PTY's included), and no other process can
// connect at all.
//
// An embedded server (--cluster embedded) takes the cluster's shared
// secret and derives from it, with HMAC-SHA256, one password for client
// connections and another for routes, so that the secret itself never
// crosses a socket; the host's own connection to it is in-process. Off
// loopback it serves TLS to clients and mutual TLS to routes. A host of an
// external cluster presents what its operator gave it (a .creds file, an
// nkey seed, a token, or a user and password), over TLS when asked.
// nats-server and nats.go do all of the checking.

// MinSecretBytes is the least size of a cluster's shared secret.
const MinSecretBytes = 32

// The user names of the embedded server's two passwords.
const (
	clientUser = "tether-host"
	routeUser  = "tether-route"
)

// Errors of the bus's configuration.
var (
	// ErrNoSecret: an embedded server that routes with others was given
	// no shared secret (or one shorter than MinSecretBytes).
	ErrNoSecret = errors.New("no cluster secret")
	// ErrNeedTLS: an embedded server would listen on, or route to, an
	// address off loopback without TLS.
	ErrNeedTLS = errors.New("off loopback without TLS")
)

// derive returns the password for purpose ("client", "route") derived
// from the cluster's secret.
func derive(secret []byte, purpose string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("tether cluster " + purpose + " v1"))
	return hex.EncodeToString(m.Sum(nil))
}

// TLSFiles name the PEM files of the cluster's TLS.
type TLSFiles struct {
	// CA is the certificate authority that signed the cluster's
	// certificates: an embedded server accepts routes only with a client
	// certificate it signed, and a host trusts a server only with a
	// certificate it signed.
	CA string
	// Cert and Key are this host's certificate and private key: an
	// embedded server's for its client port and its routes (both ways);
	// against an external cluster, the client certificate for mutual TLS
	// (optional there).
	Cert, Key string
}

// ServerConfigs returns an embedded server's TLS configurations, read
// from the files: TLS for clients, and mutual TLS for routes (which act
// as client and server both, so the CA verifies either side, as
// nats-server's own cluster configuration does).
func (t *TLSFiles) ServerConfigs() (clients, routes *tls.Config, err error) {
	if t.CA == "" || t.Cert == "" || t.Key == "" {
		return nil, nil, errors.New("TLS needs a CA, a certificate and a key")
	}
	opts := server.TLSConfigOpts{CertFile: t.Cert, KeyFile: t.Key, CaFile: t.CA}
	if clients, err = server.GenTLSConfig(&opts); err != nil {
		return nil, nil, fmt.Errorf("tls: %w", err)
	}
	opts.Verify = true
	if routes, err = server.GenTLSConfig(&opts); err != nil {
		return nil, nil, fmt.Errorf("tls: %w", err)
	}
	routes.ClientAuth = tls.RequireAndVerifyClientCert
	routes.RootCAs = routes.ClientCAs
	return clients, routes, nil
}

// Credentials are what a host presents to an external cluster's NATS
// servers. At most one kind is set; none at all connects with none (the
// servers then let anyone in).
type Credentials struct {
	// CredsFile is a NATS .creds file (a user JWT and its nkey seed).
	CredsFile string
	// NkeyFile holds a user's nkey seed.
	NkeyFile string
	// Token is a server's authorization token.
	Token string
	// User and Password are a user's name and password.
	User, Password string
}

// Options returns the nats.go options that present c, and the TLS of t
// when t is not nil (its CA verifies the servers; Cert and Key, when
// given, are the client certificate).
func (c Credentials) Options(t *TLSFiles) ([]nats.Option, error) {
	var opts []nats.Option
	kinds := 0
	if c.CredsFile != "" {
		kinds++
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.NkeyFile != "" {
		kinds++
		o, err := nats.NkeyOptionFromSeed(c.NkeyFile)
		if err != nil {
			return nil, fmt.Errorf("nkey %s: %w", c.NkeyFile, err)
		}
		opts = append(opts, o)
	}
	if c.Token != "" {
		kinds++
		opts = append(opts, nats.Token(c.Token))
	}
	if c.User != "" || c.Password != "" {
		kinds++
		if c.User == "" || c.Password == "" {
			return nil, errors.New("a user goes with a password")
		}
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if kinds > 1 {
		return nil, errors.New("more than one kind of credential")
	}
	if t != nil {
		if t.CA != "" {
			opts = append(opts, nats.RootCAs(t.CA))
		}
		if (t.Cert == "") != (t.Key == "") {
			return nil, errors.New("a TLS certificate goes with its key")
		}
		if t.Cert != "" {
			opts = append(opts, nats.ClientCert(t.Cert, t.Key))
		}
		opts = append(opts, nats.Secure())
	}
	return opts, nil
}

// Check applies the options of c and t as a connection would, reading
// their files (a .creds file is read only when connecting).
func (c Credentials) Check(t *TLSFiles) error {
	opts, err := c.Options(t)
	if err != nil {
		return err
	}
	o := nats.GetDefaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return err
		}
	}
	return nil
}

// Loopback reports whether addr — host:port, or a URL such as
// nats-route://host:port — names loopback only: a loopback IP, or
// "localhost". An empty host (every interface) and any other name are
// not.
func Loopback(addr string) bool {
	host := addr
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			return false
		}
		host = u.Hostname()
	} else if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// RedactURLs returns urls (comma-separated) with any user information
// masked — a password, or a user name alone, which NATS takes as a
// token — for errors and logs. A host:port is kept as it is.
func RedactURLs(urls []string) string {
	out := make([]string, len(urls))
	for i, s := range urls {
		out[i] = redactURL(s)
	}
	return strings.Join(out, ",")
}

func redactURL(s string) string {
	if !strings.Contains(s, "://") {
		if i := strings.LastIndex(s, "@"); i >= 0 {
			return "xxxxx" + s[i:]
		}
		return s
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "(a URL that does not parse)"
	case u.User == nil:
		return s
	}
	if _, ok := u.User.Password(); !ok {
		u.User = url.User("xxxxx")
		return u.String()
	}
	return u.Redacted()
}
