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
	"sync"

	"github.com/tether-agent/tether/contract"
)

// Access decides whether a new connection may talk to the host. Its
// fields are constant after construction.
type Access struct {
	// Token is the access token clients must present.
	Token string
	// Bound is the public listener's host:port (or unix:PATH).
	Bound string
	// AllowHosts are extra accepted Host names: "NAME" accepts NAME with
	// any port or none (as behind a reverse proxy), "NAME:PORT" exactly
	// that.
	AllowHosts []string
	// AllowOrigins are extra accepted Origin values.
	AllowOrigins []string

	once  sync.Once
	local map[string]bool // on a wildcard listener: this machine's interface addresses
}

// Check returns 0 when the connection described by ev is admitted, else
// the close code to refuse it with. The order is fixed: token (4401),
// Host and Origin (4403), loopback peer (4408).
func (a *Access) Check(ev contract.Event) int {
	if !a.tokenOK(ev) {
		return contract.CloseUnauthorized
	}
	if !a.HostOK(ev.Host) {
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

// TokenOK reports whether t is the access token, compared in constant time
// (hashes first, so the length does not leak either).
func (a *Access) TokenOK(t string) bool {
	want := sha256.Sum256([]byte(a.Token))
	g := sha256.Sum256([]byte(t))
	return t != "" && subtle.ConstantTimeCompare(g[:], want[:]) == 1
}

// tokenOK looks for the token in ?token=, Authorization: Bearer and the
// tether_token cookie.
func (a *Access) tokenOK(ev contract.Event) bool {
	ok := false
	// ParseQuery keeps the well-formed pairs of a malformed query, so a
	// good token next to a bad attach is still found (then 4400, not 4401).
	q, _ := url.ParseQuery(ev.Query)
	for _, t := range q["token"] {
		ok = a.TokenOK(t) || ok
	}
	if auths, found := header(ev.Header, "Authorization"); found {
		for _, h := range auths {
			if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
				ok = a.TokenOK(strings.TrimSpace(h[7:])) || ok
			}
		}
	}
	if cookies, found := header(ev.Header, "Cookie"); found {
		r := http.Request{Header: http.Header{"Cookie": cookies}}
		for _, c := range r.Cookies() {
			if c.Name == "tether_token" {
				ok = a.TokenOK(c.Value) || ok
			}
		}
	}
	return ok
}

// splitHost splits "name", "name:port", "[v6]" or "[v6]:port" into a
// lower-case host and a port ("" when none).
func splitHost(hp string) (host, port string) {
	if h, p, err := net.SplitHostPort(hp); err == nil {
		return strings.ToLower(h), p
	}
	return strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(hp, "["), "]")), ""
}

// sameHost compares two host names or addresses (IPs by value).
func sameHost(a, b string) bool {
	if ia, ib := net.ParseIP(a), net.ParseIP(b); ia != nil && ib != nil {
		return ia.Equal(ib)
	}
	return a == b
}

// HostOK reports whether hostport (a Host header) names this host: the
// bound host:port; localhost, 127.0.0.1 and [::1] with the bound port on
// a loopback or wildcard listener; every address of this machine's
// interfaces with the port on a wildcard listener; and each AllowHosts
// entry. A Host without a port stands for port 80 or 443.
func (a *Access) HostOK(hostport string) bool {
	h, p := splitHost(hostport)
	if h == "" {
		return false
	}
	for _, allowed := range a.AllowHosts {
		ah, ap := splitHost(allowed)
		if sameHost(h, ah) && (ap == "" || ap == p) {
			return true
		}
	}
	if strings.HasPrefix(a.Bound, "unix:") {
		return strings.EqualFold(hostport, a.Bound)
	}
	bh, bp := splitHost(a.Bound)
	if p != bp && !(p == "" && (bp == "80" || bp == "443")) {
		return false
	}
	if sameHost(h, bh) && !a.wildcard() {
		return true
	}
	if a.loopback() || a.wildcard() {
		if h == "localhost" || sameHost(h, "127.0.0.1") || sameHost(h, "::1") {
			return true
		}
	}
	if a.wildcard() {
		a.once.Do(a.findLocal)
		if ip := net.ParseIP(h); ip != nil {
			return a.local[ip.String()]
		}
	}
	return false
}

// findLocal collects this machine's interface addresses.
func (a *Access) findLocal() {
	a.local = map[string]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return
	}
	for _, ad := range addrs {
		if n, ok := ad.(*net.IPNet); ok {
			a.local[n.IP.String()] = true
		}
	}
}

// originOK parses origin strictly — scheme://host[:port], an optional
// trailing "/", nothing else (userinfo, a path, a query or a fragment make
// it refused) — and accepts it when it is one of AllowOrigins or an
// http(s) origin whose host:port this host accepts as a Host. "null" is
// never accepted.
func (a *Access) originOK(origin string) bool {
	o := strings.TrimSuffix(origin, "/")
	if o == "null" || o == "" || strings.ContainsAny(o, "?#@\\ ") {
		return false
	}
	u, err := url.Parse(o)
	if err != nil || u.Opaque != "" || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.Host == "" {
		return false
	}
	scheme := strings.ToLower(u.Scheme)
	canon := scheme + "://" + strings.ToLower(u.Host)
	for _, allowed := range a.AllowOrigins {
		if strings.EqualFold(strings.TrimSuffix(allowed, "/"), canon) {
			return true
		}
	}
	if scheme != "http" && scheme != "https" {
		return false
	}
	hostport := u.Host
	if u.Port() == "" {
		port := "80"
		if scheme == "https" {
			port = "443"
		}
		hostport = net.JoinHostPort(u.Hostname(), port)
	}
	return a.HostOK(hostport)
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

// wildcard reports whether the listener is bound to every address
// (0.0.0.0, [::] or an empty host).
func (a *Access) wildcard() bool {
	if strings.HasPrefix(a.Bound, "unix:") {
		return false
	}
	host, _, err := net.SplitHostPort(a.Bound)
	if err != nil {
		return false
	}
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// BrowserAddr is the address a browser on this machine opens for a
// listener bound to addr: 127.0.0.1 for a wildcard listener, else addr.
func BrowserAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

func isLoopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
