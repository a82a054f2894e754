package access

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// Proxy is a reverse proxy that authenticates people (oauth2-proxy,
// Caddy forward_auth) and names the user in a request header
// (docs/SECURITY.md, "Behind a reverse proxy"). A request from one of
// From that carries Header is that user, whatever else it carries; from
// any other address the header is ignored. Its fields are constant after
// construction.
type Proxy struct {
	// Header is the request header naming the user, e.g.
	// X-Forwarded-User.
	Header string
	// From are the proxy's addresses: only requests whose peer is in one
	// of them are read for Header.
	From []netip.Prefix
	// Users maps each user to its scopes (--auth-proxy-users). When nil
	// every user the proxy names is admin; else a user not in it is
	// refused.
	Users map[string][]string
}

// Reasons of a 4401 for a request from the proxy.
const (
	// ReasonProxyEmpty: the header was there but empty.
	ReasonProxyEmpty = "empty proxy user"
	// ReasonProxyAmbiguous: the header came more than once, or named
	// several users.
	ReasonProxyAmbiguous = "ambiguous proxy user"
	// ReasonProxyUnknown: the user is not in the users file.
	ReasonProxyUnknown = "unknown user"
)

// maxProxyUser bounds a user name from the proxy (it is journaled as
// who did what).
const maxProxyUser = 256

// ErrProxyConfig is a bad --auth-proxy-* flag or users file.
var ErrProxyConfig = errors.New("auth proxy")

// NewProxy makes the proxy of --auth-proxy-header header and
// --auth-proxy-from from (each a CIDR, a bare address, or a comma list
// of them); users is the parsed users file, nil for none. Both header
// and from are needed.
func NewProxy(header string, from []string, users map[string][]string) (*Proxy, error) {
	header = strings.TrimSpace(header)
	switch {
	case header == "" && len(from) == 0:
		return nil, fmt.Errorf("%w: --auth-proxy-users needs --auth-proxy-header and --auth-proxy-from", ErrProxyConfig)
	case header == "":
		return nil, fmt.Errorf("%w: --auth-proxy-from needs --auth-proxy-header (the header the proxy names the user in)", ErrProxyConfig)
	case len(from) == 0:
		return nil, fmt.Errorf("%w: --auth-proxy-header needs --auth-proxy-from (the proxy's addresses; from any other the header is ignored)", ErrProxyConfig)
	case !validHeaderName(header):
		return nil, fmt.Errorf("%w: --auth-proxy-header %q is not a header name", ErrProxyConfig, header)
	}
	switch http.CanonicalHeaderKey(header) {
	case "Authorization", "Cookie", "Host", "Origin", "Upgrade", "Connection":
		return nil, fmt.Errorf("%w: --auth-proxy-header %s: that header has another meaning; use the one the proxy sets, e.g. X-Forwarded-User", ErrProxyConfig, header)
	}
	p := &Proxy{Header: http.CanonicalHeaderKey(header), Users: users}
	for _, f := range from {
		for _, s := range strings.Split(f, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			pre, err := parsePrefix(s)
			if err != nil {
				return nil, fmt.Errorf("%w: --auth-proxy-from %q: want a CIDR such as 127.0.0.1/32 or ::1/128: %w", ErrProxyConfig, s, err)
			}
			p.From = append(p.From, pre)
		}
	}
	if len(p.From) == 0 {
		return nil, fmt.Errorf("%w: --auth-proxy-from names no address", ErrProxyConfig)
	}
	return p, nil
}

// parsePrefix parses a CIDR or a bare address (a prefix of one address).
func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		ip = ip.Unmap()
		return netip.PrefixFrom(ip, ip.BitLen()), nil
	}
	pre, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if pre.Addr().Is4In6() {
		pre = netip.PrefixFrom(pre.Addr().Unmap(), pre.Bits()-96)
		if pre.Bits() < 0 {
			return netip.Prefix{}, errors.New("an IPv4-mapped prefix shorter than /96")
		}
	}
	return pre.Masked(), nil
}

func validHeaderName(h string) bool {
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", c)) {
			return false
		}
	}
	return h != ""
}

// Trusts reports whether remote (a peer's host:port, or a bare address)
// is one of the proxy's addresses. A Unix socket's peer has no address
// and is never trusted.
func (p *Proxy) Trusts(remote string) bool {
	ip, err := netip.ParseAddr(remote)
	if err != nil {
		ap, err := netip.ParseAddrPort(remote)
		if err != nil {
			return false
		}
		ip = ap.Addr()
	}
	ip = ip.Unmap().WithZone("")
	return slices.ContainsFunc(p.From, func(pre netip.Prefix) bool { return pre.Contains(ip) })
}

// Binding returns the header of the Admit of a connection p admitted:
// a transport whose connection spans several requests (/acp over
// Streamable HTTP) binds each later request to the user header's value
// it came with, read, as here, only from p's addresses; from any other
// peer the header counts as absent.
func (p *Proxy) Binding() map[string][]string {
	from := make([]string, len(p.From))
	for i, pre := range p.From {
		from[i] = pre.String()
	}
	return map[string][]string{contract.AdmitBindHeader: {p.Header}, contract.AdmitBindFrom: from}
}

// decide returns the decision of a request from the proxy, and false
// when the proxy has no say on ev: it came from another address, or it
// carries no header. One value naming one user is needed; the user is
// admin, or has the scopes Users gives it (not in Users: refused).
func (p *Proxy) decide(ev contract.Event) (Decision, bool) {
	if p == nil || !p.Trusts(ev.Remote) {
		return Decision{}, false
	}
	vals, ok := ev.Header[p.Header]
	if !ok {
		return Decision{}, false
	}
	refuse := func(reason string) (Decision, bool) {
		return Decision{Code: wire.CloseUnauthorized, Reason: reason, Via: ViaProxy, Given: true}, true
	}
	if len(vals) != 1 {
		return refuse(ReasonProxyAmbiguous)
	}
	name := strings.TrimSpace(vals[0])
	switch {
	case name == "":
		return refuse(ReasonProxyEmpty)
	case strings.Contains(name, ","):
		return refuse(ReasonProxyAmbiguous)
	case len(name) > maxProxyUser || strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return refuse("bad proxy user")
	}
	scopes := []string{ScopeAdmin}
	if p.Users != nil {
		s, ok := p.Users[name]
		if !ok {
			return refuse(ReasonProxyUnknown)
		}
		scopes = slices.Clone(s)
	}
	return Decision{Who: Identity{Name: name, Scopes: scopes}, Via: ViaProxy, Given: true}, true
}

// ReadProxyUsers reads an --auth-proxy-users file (ParseProxyUsers): a
// regular file that others cannot change — owned by this user or root,
// writable by neither group nor others — since it says who may do what.
func ReadProxyUsers(path string) (map[string][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: --auth-proxy-users: %w", ErrProxyConfig, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: --auth-proxy-users: %w", ErrProxyConfig, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: --auth-proxy-users %s: not a regular file", ErrProxyConfig, path)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return nil, fmt.Errorf("%w: --auth-proxy-users %s: mode %04o lets other users change who may do what: chmod go-w %s", ErrProxyConfig, path, perm, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() && st.Uid != 0 {
		return nil, fmt.Errorf("%w: --auth-proxy-users %s: owned by uid %d, not by this user (uid %d) or root", ErrProxyConfig, path, st.Uid, os.Getuid())
	}
	return ParseProxyUsers(io.LimitReader(f, 16<<20), path)
}

// ParseProxyUsers parses a users file, name being its name in errors
// (name:LINE: what is wrong). Each line is a user and its scopes,
// separated by blanks:
//
//	# who may do what behind the proxy
//	alice@example.com  admin
//	bob                session:KEY:view pty:TOKEN:view
//	carol              new
//
// A "#" starts a comment; blank lines are skipped; each scope is one of
// ParseScope's forms and at least one is needed; a user comes once.
func ParseProxyUsers(r io.Reader, name string) (map[string][]string, error) {
	users := make(map[string][]string)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		user := fields[0]
		switch {
		case len(user) > maxProxyUser || strings.Contains(user, ","):
			return nil, fmt.Errorf("%w: %s:%d: user %.40q is longer than %d bytes or has a comma", ErrProxyConfig, name, n, user, maxProxyUser)
		case len(fields) == 1:
			return nil, fmt.Errorf("%w: %s:%d: user %q has no scope (write e.g. %q or %q)", ErrProxyConfig, name, n, user, user+" admin", user+" new")
		case users[user] != nil:
			return nil, fmt.Errorf("%w: %s:%d: user %q given twice", ErrProxyConfig, name, n, user)
		}
		scopes := make([]string, 0, len(fields)-1)
		for _, f := range fields[1:] {
			s, err := ParseScope(f)
			if err != nil {
				return nil, fmt.Errorf("%w: %s:%d: %w", ErrProxyConfig, name, n, err)
			}
			if !slices.Contains(scopes, s) {
				scopes = append(scopes, s)
			}
		}
		users[user] = scopes
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrProxyConfig, name, err)
	}
	return users, nil
}
