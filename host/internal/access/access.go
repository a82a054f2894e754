// Package access decides whether a new connection may talk to the host:
// its credential (the access token, a scoped credential, a page
// sign-in, or the user a trusted reverse proxy names), the Host and
// Origin checks against DNS rebinding and cross-site pages, and the
// loopback-peer check, in that order, before any frame of the
// connection is read.
package access

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// Access decides whether a new connection may talk to the host. Its
// fields are constant after construction.
type Access struct {
	// Book holds the credentials the host accepts (its access token,
	// page sign-ins, and in a cluster every host's).
	Book *Book
	// Cookie is the name of this listener's page cookie (CookieName of
	// Bound): a browser keeps one per host and port.
	Cookie string
	// Bound is the public listener's host:port (or unix:PATH).
	Bound string
	// AllowHosts are extra accepted Host names: "NAME" accepts NAME with
	// any port or none (as behind a reverse proxy), "NAME:PORT" exactly
	// that.
	AllowHosts []string
	// AllowOrigins are extra accepted Origin values.
	AllowOrigins []string
	// Secure marks the page cookie Secure: the listener serves TLS.
	Secure bool
	// Proxy, when set, is a reverse proxy whose user header names who a
	// request from it is (--auth-proxy-header, --auth-proxy-from).
	Proxy *Proxy

	once  sync.Once
	local map[string]bool // on a wildcard listener: this machine's interface addresses
}

// LegacyCookie is the page cookie of tether before it was named per
// listener: it held the access token itself. It is still accepted, and a
// page load replaces it with the listener's own.
const LegacyCookie = "tether_token"

// CookieName is the page cookie's name for a listener bound to bound:
// tether_PORT, so that a browser signed into hosts on several ports of
// one machine keeps a sign-in for each; tether_unix_HASH for a Unix
// socket.
func CookieName(bound string) string {
	if path, ok := strings.CutPrefix(bound, "unix:"); ok {
		return "tether_unix_" + Hash(path)[:8]
	}
	if _, port, err := net.SplitHostPort(bound); err == nil && port != "" {
		return "tether_" + port
	}
	return "tether_page"
}

// Via says where a connection's credential came from.
type Via uint8

// Where a credential was found.
const (
	ViaNone   Via = iota // no credential at all
	ViaQuery             // ?token=
	ViaBearer            // Authorization: Bearer
	ViaCookie            // the listener's page cookie
	ViaLegacy            // the old tether_token cookie
	ViaProxy             // a trusted reverse proxy's user header
)

// Decision is what Check decided of a new connection.
type Decision struct {
	// Code is 0 when the connection is admitted, else the close code to
	// refuse it with.
	Code int
	// Reason says why, for a refusal.
	Reason string
	// Who is the verified identity of an admitted connection.
	Who Identity
	// Via is where its credential was found; Given reports whether a
	// credential was presented at all (a refusal's page says which).
	Via   Via
	Given bool
}

// Check returns 0 when the connection described by ev is admitted, else
// the close code to refuse it with (see Decide).
func (a *Access) Check(ev contract.Event) int { return a.Decide(ev).Code }

// Decide decides whether the connection described by ev is admitted,
// and as whom. The order is fixed: credential (4401), Host and Origin
// (4403), loopback peer (4408).
func (a *Access) Decide(ev contract.Event) Decision {
	d := a.credential(ev)
	if d.Code != 0 {
		return d
	}
	if !a.HostOK(ev.Host) {
		return Decision{Code: wire.CloseForbidden, Reason: "forbidden host or origin", Given: true}
	}
	if origins, ok := header(ev.Header, "Origin"); ok {
		for _, o := range origins {
			if !a.originOK(o) {
				return Decision{Code: wire.CloseForbidden, Reason: "forbidden host or origin", Given: true}
			}
		}
	}
	if a.loopback() && !isLoopback(ev.Remote) {
		return Decision{Code: wire.CloseNotLoopback, Reason: "loopback only", Given: true}
	}
	return d
}

func header(h map[string][]string, name string) ([]string, bool) {
	v, ok := h[http.CanonicalHeaderKey(name)]
	return v, ok
}

// Verify returns the identity secret names (Book.Verify).
func (a *Access) Verify(secret string) (Identity, error) {
	if a.Book == nil {
		return Identity{}, ErrUnknownCredential
	}
	return a.Book.Verify(secret)
}

// credential looks for a credential in a trusted proxy's user header,
// ?token=, Authorization: Bearer, the listener's page cookie and the
// legacy cookie, in that order: the first place that has one decides (a
// wrong ?token= is not rescued by a good cookie: its user should learn
// that the URL is stale; a request the proxy names a user in is that
// user, whatever token it carries). Several values in one place are
// tried each, except the proxy's: it must name one user.
func (a *Access) credential(ev contract.Event) Decision {
	if d, ok := a.Proxy.decide(ev); ok {
		return d
	}
	// ParseQuery keeps the well-formed pairs of a malformed query, so a
	// good token next to a bad attach is still found (then 4400, not 4401).
	q, _ := url.ParseQuery(ev.Query)
	var places [4][]string
	places[0] = q["token"]
	if auths, found := header(ev.Header, "Authorization"); found {
		for _, h := range auths {
			if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
				places[1] = append(places[1], strings.TrimSpace(h[7:]))
			}
		}
	}
	if cookies, found := header(ev.Header, "Cookie"); found {
		r := http.Request{Header: http.Header{"Cookie": cookies}}
		for _, c := range r.Cookies() {
			switch c.Name {
			case a.Cookie:
				places[2] = append(places[2], c.Value)
			case LegacyCookie:
				places[3] = append(places[3], c.Value)
			}
		}
	}
	for i, vals := range places {
		if len(vals) == 0 {
			continue
		}
		var err error
		for _, v := range vals {
			var who Identity
			if who, err = a.Verify(v); err == nil {
				return Decision{Who: who, Via: Via(i + 1), Given: true}
			}
		}
		reason := "unauthorized"
		if errors.Is(err, ErrCredentialExpired) {
			reason = "credential expired"
		}
		return Decision{Code: wire.CloseUnauthorized, Reason: reason, Via: Via(i + 1), Given: true}
	}
	return Decision{Code: wire.CloseUnauthorized, Reason: "unauthorized"}
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

// ReasonNoCredential is the reason of a 4401 for a request that carried
// no credential at all (a page says so, rather than "wrong token").
const ReasonNoCredential = "no credential"

// NeedsCookie reports whether the page request ev, admitted as d, gets
// the listener's page cookie: it signed in with ?token= (and has no
// page cookie of that credential yet), or still carries the old cookie.
// A request named by the proxy never does: the proxy vouches for each
// request, and a cookie would outlive its sign-out there.
func (a *Access) NeedsCookie(ev contract.Event, d Decision) bool {
	switch d.Via {
	case ViaLegacy:
		return true
	case ViaQuery:
		return !a.hasPageOf(ev, d.Who.Credential)
	}
	return false
}

// hasPageOf reports whether ev carries a valid page cookie made from the
// credential id.
func (a *Access) hasPageOf(ev contract.Event, id string) bool {
	cookies, found := header(ev.Header, "Cookie")
	if !found || a.Book == nil {
		return false
	}
	r := http.Request{Header: http.Header{"Cookie": cookies}}
	for _, c := range r.CookiesNamed(a.Cookie) {
		if who, err := a.Book.Verify(c.Value); err == nil && a.Book.Parent(who.Credential) == id {
			return true
		}
	}
	return false
}

// PageCookies signs the browser of page request ev, admitted as d, in:
// a new page sign-in made from d's credential, set as the listener's
// cookie (HttpOnly, SameSite=Strict, Path=/, Secure under TLS, for
// PageTTL), and the old cookie cleared when it came with it. It returns
// the response headers to set.
func (a *Access) PageCookies(ctx context.Context, ev contract.Event, d Decision) (map[string][]string, error) {
	secret, err := a.Book.SignIn(ctx, d.Who)
	if err != nil {
		return nil, err
	}
	c := &http.Cookie{
		Name: a.Cookie, Value: secret, Path: "/", MaxAge: int(PageTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: a.Secure,
	}
	set := []string{c.String()}
	if cookies, found := header(ev.Header, "Cookie"); found {
		r := http.Request{Header: http.Header{"Cookie": cookies}}
		if _, err := r.Cookie(LegacyCookie); err == nil {
			old := &http.Cookie{Name: LegacyCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
				SameSite: http.SameSiteStrictMode, Secure: a.Secure}
			set = append(set, old.String())
		}
	}
	return map[string][]string{"Set-Cookie": set}, nil
}
