package access

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// TestProxyDecide: a trusted proxy's user header names who a request is,
// from the proxy's addresses only; anything else goes by the token.
func TestProxyDecide(t *testing.T) {
	users := map[string][]string{"alice": {ScopeAdmin}, "bob": {"session:k1:view", ScopeNew}}
	withUsers, err := NewProxy("x-forwarded-user", []string{"127.0.0.1/32", "10.0.0.0/8,fd00::/8"}, users)
	if err != nil {
		t.Fatal(err)
	}
	everyone, err := NewProxy("X-Forwarded-User", []string{"127.0.0.1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := func(remote, query string, hdr map[string][]string) contract.Event {
		return contract.Event{Kind: contract.EventOpened, Path: "/api/ws", Query: query,
			Host: "127.0.0.1:7717", Remote: remote, Header: hdr}
	}
	user := func(vs ...string) map[string][]string { return map[string][]string{"X-Forwarded-User": vs} }
	tests := []struct {
		name       string
		proxy      *Proxy
		bound      string
		ev         contract.Event
		wantCode   int
		wantReason string
		wantWho    string
		wantScopes []string
		wantVia    Via
	}{
		{name: "trusted peer with header is that user", proxy: withUsers, ev: ev("127.0.0.1:5000", "", user("alice")),
			wantWho: "alice", wantScopes: []string{ScopeAdmin}, wantVia: ViaProxy},
		{name: "users file gives the scopes", proxy: withUsers, ev: ev("127.0.0.1:5000", "", user("bob")),
			wantWho: "bob", wantScopes: []string{"session:k1:view", ScopeNew}, wantVia: ViaProxy},
		{name: "without a users file every user is admin", proxy: everyone, ev: ev("127.0.0.1:5000", "", user("zed")),
			wantWho: "zed", wantScopes: []string{ScopeAdmin}, wantVia: ViaProxy},
		{name: "unknown user is refused", proxy: withUsers, ev: ev("127.0.0.1:5000", "", user("mallory")),
			wantCode: wire.CloseUnauthorized, wantReason: ReasonProxyUnknown},
		{name: "unknown user is refused even with a good token", proxy: withUsers, ev: ev("127.0.0.1:5000", "token=s3cret", user("mallory")),
			wantCode: wire.CloseUnauthorized, wantReason: ReasonProxyUnknown},
		{name: "header wins over a token", proxy: withUsers, ev: ev("127.0.0.1:5000", "token=s3cret", user("bob")),
			wantWho: "bob", wantScopes: []string{"session:k1:view", ScopeNew}, wantVia: ViaProxy},
		{name: "empty header is refused", proxy: withUsers, ev: ev("127.0.0.1:5000", "token=s3cret", user("  ")),
			wantCode: wire.CloseUnauthorized, wantReason: ReasonProxyEmpty},
		{name: "header twice is refused", proxy: withUsers, ev: ev("127.0.0.1:5000", "", user("alice", "bob")),
			wantCode: wire.CloseUnauthorized, wantReason: ReasonProxyAmbiguous},
		{name: "header twice with the same user is refused", proxy: withUsers, ev: ev("127.0.0.1:5000", "", user("alice", "alice")),
			wantCode: wire.CloseUnauthorized, wantReason: ReasonProxyAmbiguous},
		{name: "a list of users is refused", proxy: withUsers, ev: ev("127.0.0.1:5000", "", user("alice, bob")),
			wantCode: wire.CloseUnauthorized, wantReason: ReasonProxyAmbiguous},
		{name: "trusted peer without header goes by the token", proxy: withUsers, ev: ev("127.0.0.1:5000", "token=s3cret", nil),
			wantWho: AdminName, wantScopes: []string{ScopeAdmin}, wantVia: ViaQuery},
		{name: "trusted peer without header or token is refused", proxy: withUsers, ev: ev("127.0.0.1:5000", "", nil),
			wantCode: wire.CloseUnauthorized, wantReason: "unauthorized"},
		{name: "untrusted peer: header ignored, no token refused", proxy: withUsers, ev: ev("127.0.0.2:5000", "", user("alice")),
			wantCode: wire.CloseUnauthorized, wantReason: "unauthorized"},
		{name: "untrusted peer: header ignored, token admits as admin", proxy: withUsers, ev: ev("127.0.0.2:5000", "token=s3cret", user("bob")),
			wantWho: AdminName, wantScopes: []string{ScopeAdmin}, wantVia: ViaQuery},
		{name: "untrusted peer: an empty header is ignored too", proxy: withUsers, ev: ev("127.0.0.2:5000", "token=s3cret", user("")),
			wantWho: AdminName, wantScopes: []string{ScopeAdmin}, wantVia: ViaQuery},
		{name: "bare address trusts only itself", proxy: everyone, ev: ev("127.0.0.3:5000", "", user("zed")),
			wantCode: wire.CloseUnauthorized, wantReason: "unauthorized"},
		{name: "IPv4-mapped peer in an IPv4 CIDR", proxy: withUsers, ev: ev("[::ffff:127.0.0.1]:5000", "", user("alice")),
			wantWho: "alice", wantScopes: []string{ScopeAdmin}, wantVia: ViaProxy},
		{name: "IPv6 peer in an IPv6 CIDR", proxy: withUsers, bound: "[::]:7717", ev: ev("[fd00::5]:5000", "", user("alice")),
			wantWho: "alice", wantScopes: []string{ScopeAdmin}, wantVia: ViaProxy},
		{name: "IPv6 peer outside the CIDRs", proxy: withUsers, bound: "[::]:7717", ev: ev("[fe80::1%eth0]:5000", "", user("alice")),
			wantCode: wire.CloseUnauthorized, wantReason: "unauthorized"},
		{name: "unix socket peer is never trusted", proxy: withUsers, bound: "unix:/run/t.sock", ev: ev("@", "", user("alice")),
			wantCode: wire.CloseUnauthorized, wantReason: "unauthorized"},
		{name: "no proxy configured: header ignored", proxy: nil, ev: ev("127.0.0.1:5000", "", user("alice")),
			wantCode: wire.CloseUnauthorized, wantReason: "unauthorized"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bound := tt.bound
			if bound == "" {
				bound = "127.0.0.1:7717"
			}
			a := withToken(t, "s3cret", &Access{Bound: bound, Proxy: tt.proxy})
			e := tt.ev
			if strings.HasPrefix(bound, "unix:") {
				e.Host = bound
			}
			d := a.Decide(e)
			if d.Code != tt.wantCode || d.Code != 0 && d.Reason != tt.wantReason {
				t.Fatalf("Decide = %d %q, want %d %q", d.Code, d.Reason, tt.wantCode, tt.wantReason)
			}
			if d.Code != 0 {
				return
			}
			if d.Who.Name != tt.wantWho || !slices.Equal(d.Who.Scopes, tt.wantScopes) || d.Via != tt.wantVia {
				t.Errorf("admitted as %q %v via %d, want %q %v via %d", d.Who.Name, d.Who.Scopes, d.Via, tt.wantWho, tt.wantScopes, tt.wantVia)
			}
			if d.Via == ViaProxy {
				if d.Who.Credential != "" {
					t.Errorf("a proxy user's Credential = %q, want none", d.Who.Credential)
				}
				if got := ScopesOf(a.Book, d.Who); !slices.Equal(got, tt.wantScopes) {
					t.Errorf("ScopesOf = %v, want %v", got, tt.wantScopes)
				}
			}
		})
	}
}

// TestProxyNoPageCookie: a page the proxy names a user for gets no page
// cookie, even with a good ?token= beside the header.
func TestProxyNoPageCookie(t *testing.T) {
	p, err := NewProxy("X-Forwarded-User", []string{"127.0.0.1/32"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := withToken(t, "s3cret", &Access{Bound: "127.0.0.1:7717", Proxy: p})
	ev := contract.Event{Kind: contract.EventOpened, Page: true, Path: "/", Query: "token=s3cret", Host: "127.0.0.1:7717",
		Remote: "127.0.0.1:5000", Header: map[string][]string{"X-Forwarded-User": {"alice"}}}
	d := a.Decide(ev)
	if d.Code != 0 || d.Via != ViaProxy {
		t.Fatalf("Decide = %d via %d, want admitted via the proxy", d.Code, d.Via)
	}
	if a.NeedsCookie(ev, d) {
		t.Error("NeedsCookie = true for a proxy user, want false")
	}
	ev.Remote = "127.0.0.2:5000" // the same request from elsewhere signs in with its token
	if d := a.Decide(ev); d.Code != 0 || !a.NeedsCookie(ev, d) {
		t.Errorf("from an untrusted peer: Decide = %d, NeedsCookie = %v; want admitted with a cookie", d.Code, a.NeedsCookie(ev, d))
	}
}

func TestNewProxy(t *testing.T) {
	tests := []struct {
		name    string
		header  string
		from    []string
		wantErr string // "" for none
		want    []string
	}{
		{"header and CIDR", "X-Forwarded-User", []string{"127.0.0.1/32"}, "", []string{"127.0.0.1/32"}},
		{"repeated and comma list", "X-Email", []string{"10.0.0.0/8, 192.168.1.0/24", "::1/128"}, "", []string{"10.0.0.0/8", "192.168.1.0/24", "::1/128"}},
		{"bare addresses", "X-User", []string{"127.0.0.1", "::1"}, "", []string{"127.0.0.1/32", "::1/128"}},
		{"host bits masked", "X-User", []string{"10.1.2.3/8"}, "", []string{"10.0.0.0/8"}},
		{"IPv4-mapped CIDR", "X-User", []string{"::ffff:10.0.0.0/104"}, "", []string{"10.0.0.0/8"}},
		{"header alone", "X-User", nil, "needs --auth-proxy-from", nil},
		{"CIDR alone", "", []string{"127.0.0.1/32"}, "needs --auth-proxy-header", nil},
		{"only commas", "X-User", []string{" , "}, "names no address", nil},
		{"bad CIDR", "X-User", []string{"127.0.0.1/33"}, `--auth-proxy-from "127.0.0.1/33"`, nil},
		{"host name", "X-User", []string{"proxy.example"}, `--auth-proxy-from "proxy.example"`, nil},
		{"bad header name", "X User", []string{"127.0.0.1/32"}, "not a header name", nil},
		{"Authorization", "authorization", []string{"127.0.0.1/32"}, "another meaning", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewProxy(tt.header, tt.from, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrProxyConfig) {
					t.Fatalf("err = %v, want one with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, pre := range p.From {
				got = append(got, pre.String())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("From = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestParseProxyUsers(t *testing.T) {
	good := `# who may do what
alice@example.com  admin   # everything
bob	session:k1:view pty:abc:view

carol new new
`
	users, err := ParseProxyUsers(strings.NewReader(good), "users")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"alice@example.com": {"admin"}, "bob": {"session:k1:view", "pty:abc:view"}, "carol": {"new"}}
	if len(users) != len(want) {
		t.Errorf("users = %v, want %v", users, want)
	}
	for u, s := range want {
		if !slices.Equal(users[u], s) {
			t.Errorf("users[%q] = %v, want %v", u, users[u], s)
		}
	}
	bad := []struct{ name, text, want string }{
		{"no scope", "alice admin\nbob\n", "users:2: user \"bob\" has no scope"},
		{"bad scope", "# c\n\nalice root\n", "users:3: bad scope \"root\""},
		{"twice", "alice admin\nalice new\n", "users:2: user \"alice\" given twice"},
		{"comma", "a,b admin\n", "users:1:"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseProxyUsers(strings.NewReader(tt.text), "users")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one with %q", err, tt.want)
			}
		})
	}
}

// TestReadProxyUsers: the users file says who may do what, so one that
// others can change is refused.
func TestReadProxyUsers(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "users")
	if err := os.WriteFile(path, []byte("alice admin\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if users, err := ReadProxyUsers(path); err != nil || !slices.Equal(users["alice"], []string{"admin"}) {
		t.Fatalf("ReadProxyUsers = %v, %v; want alice admin", users, err)
	}
	for _, mode := range []os.FileMode{0o664, 0o646} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadProxyUsers(path); err == nil || !strings.Contains(err.Error(), "chmod go-w") {
			t.Errorf("mode %04o: err = %v, want a refusal saying chmod go-w", mode, err)
		}
	}
	if _, err := ReadProxyUsers(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: err = %v, want not a regular file", err)
	}
	if _, err := ReadProxyUsers(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file: no error")
	}
}
