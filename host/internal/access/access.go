// Package access decides whether a new connection may talk to the host:
// the access token, the Host and Origin checks against DNS rebinding and
// cross-site pages, and the loopback-peer check, in that order, before any
// frame of the connection is read.
package access

import (
	"crypto/sha256"
	"crypto/subtle"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/tether-agent/tether/contract"
)

// Access decides whether a new connection may talk to the host (token, Host and Origin, loopback peer).
// Its fields are constant after construction.
type Access struct {
	// Token is the access token clients must present.
	Token string
	// Bound is the public listener's host:port.
	Bound string
	// AllowOrigins are extra accepted Origin values.
	AllowOrigins []string
}

// Check returns 0 when the connection described by ev is admitted, else
// the close code to refuse it with. The order is fixed: token (4401),
// Host and Origin (4403), loopback peer (4408).
func (a *Access) Check(ev contract.Event) int {
	if !a.tokenOK(ev) {
		return contract.CloseUnauthorized
	}
	if !a.hostOK(ev.Host) {
		return contract.CloseForbidden
	}
	if origins, ok := header(ev.Header, "Origin"); ok {
		for _, o := range origins {
			if !a.originOK(o) {
				return contract.CloseForbidden
			}
		}
	}
	if a.loopback() && !isLoopback(ev.Remote) {
		return contract.CloseNotLoopback
	}
	return 0
}

func header(h map[string][]string, name string) ([]string, bool) {
	v, ok := h[http.CanonicalHeaderKey(name)]
	return v, ok
}

// tokenOK looks for the token in ?token=, Authorization: Bearer and the
// tether_token cookie, comparing in constant time (hashes first, so the
// length does not leak either).
func (a *Access) tokenOK(ev contract.Event) bool {
	want := sha256.Sum256([]byte(a.Token))
	match := func(got string) bool {
		g := sha256.Sum256([]byte(got))
		return got != "" && subtle.ConstantTimeCompare(g[:], want[:]) == 1
	}
	ok := false
	// ParseQuery keeps the well-formed pairs of a malformed query, so a
	// good token next to a bad attach is still found (then 4400, not 4401).
	q, _ := url.ParseQuery(ev.Query)
	for _, t := range q["token"] {
		ok = match(t) || ok
	}
	if auths, found := header(ev.Header, "Authorization"); found {
		for _, h := range auths {
			if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
				ok = match(strings.TrimSpace(h[7:])) || ok
			}
		}
	}
	if cookies, found := header(ev.Header, "Cookie"); found {
		r := http.Request{Header: http.Header{"Cookie": cookies}}
		for _, c := range r.Cookies() {
			if c.Name == "tether_token" {
				ok = match(c.Value) || ok
			}
		}
	}
	return ok
}

// hostOK accepts the bound host:port, and on a loopback listener also
// localhost:PORT (a name that cannot be rebound to another address).
func (a *Access) hostOK(host string) bool {
	if strings.EqualFold(host, a.Bound) {
		return true
	}
	if a.loopback() {
		_, port, err := net.SplitHostPort(a.Bound)
		if err == nil && strings.EqualFold(host, net.JoinHostPort("localhost", port)) {
			return true
		}
	}
	return false
}

func (a *Access) originOK(origin string) bool {
	for _, allowed := range a.AllowOrigins {
		if origin == allowed {
			return true
		}
	}
	if origin == "null" {
		return false
	}
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Path != "" && u.Path != "/" {
		return false
	}
	return a.hostOK(u.Host)
}

// loopback reports whether the listener is bound to a loopback address,
// so that peers must be loopback too (4408). A Unix socket ("unix:PATH",
// the address of a transport that binds one) is not a network listener:
// only processes on this machine can reach it, its file mode decides
// which, and its peers have no address to check, so the peer check does
// not apply; the token check does.
func (a *Access) loopback() bool {
	if strings.HasPrefix(a.Bound, "unix:") {
		return false
	}
	host, _, err := net.SplitHostPort(a.Bound)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback() || strings.EqualFold(host, "localhost")
}

func isLoopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
