package access

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

func TestAccessCheck(t *testing.T) {
	a := withToken(t, "s3cret", &Access{Bound: "127.0.0.1:7717", AllowOrigins: []string{"https://app.example"}})
	ok := func(mod func(*contract.Event)) contract.Event {
		ev := contract.Event{
			Kind:   contract.EventOpened,
			Path:   "/api/ws",
			Query:  "token=s3cret",
			Host:   "127.0.0.1:7717",
			Remote: "127.0.0.1:50000",
			Header: map[string][]string{},
		}
		if mod != nil {
			mod(&ev)
		}
		return ev
	}
	tests := []struct {
		name string
		ev   contract.Event
		want int
	}{
		{"query token", ok(nil), 0},
		{"token beside a malformed pair", ok(func(e *contract.Event) { e.Query = "attach=%zz&token=s3cret" }), 0},
		{"bearer token", ok(func(e *contract.Event) { e.Query = ""; e.Header["Authorization"] = []string{"Bearer s3cret"} }), 0},
		{"cookie token", ok(func(e *contract.Event) { e.Query = ""; e.Header["Cookie"] = []string{"a=b; tether_7717=s3cret"} }), 0},
		{"no token", ok(func(e *contract.Event) { e.Query = "" }), wire.CloseUnauthorized},
		{"wrong token", ok(func(e *contract.Event) { e.Query = "token=nope" }), wire.CloseUnauthorized},
		{"token prefix", ok(func(e *contract.Event) { e.Query = "token=s3cre" }), wire.CloseUnauthorized},
		{"wrong bearer", ok(func(e *contract.Event) { e.Query = ""; e.Header["Authorization"] = []string{"Bearer x"} }), wire.CloseUnauthorized},
		{"bad token and bad origin is 4401", ok(func(e *contract.Event) { e.Query = ""; e.Header["Origin"] = []string{"http://evil.example"} }), wire.CloseUnauthorized},
		{"wrong host", ok(func(e *contract.Event) { e.Host = "evil.example:7717" }), wire.CloseForbidden},
		{"wrong port", ok(func(e *contract.Event) { e.Host = "127.0.0.1:1" }), wire.CloseForbidden},
		{"localhost alias", ok(func(e *contract.Event) { e.Host = "localhost:7717" }), 0},
		{"same origin http", ok(func(e *contract.Event) { e.Header["Origin"] = []string{"http://127.0.0.1:7717"} }), 0},
		{"same origin https", ok(func(e *contract.Event) { e.Header["Origin"] = []string{"https://127.0.0.1:7717"} }), 0},
		{"allowed origin", ok(func(e *contract.Event) { e.Header["Origin"] = []string{"https://app.example"} }), 0},
		{"foreign origin", ok(func(e *contract.Event) { e.Header["Origin"] = []string{"http://evil.example"} }), wire.CloseForbidden},
		{"null origin", ok(func(e *contract.Event) { e.Header["Origin"] = []string{"null"} }), wire.CloseForbidden},
		{"non-loopback peer", ok(func(e *contract.Event) { e.Remote = "192.0.2.7:4000" }), wire.CloseNotLoopback},
		{"ipv6 loopback peer", ok(func(e *contract.Event) { e.Remote = "[::1]:4000" }), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := a.Check(tt.ev); got != tt.want {
				t.Errorf("Check = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestAccessNonLoopbackListenerAdmitsRemotePeers(t *testing.T) {
	a := withToken(t, "t", &Access{Bound: "192.0.2.1:7717"})
	ev := contract.Event{Query: "token=t", Host: "192.0.2.1:7717", Remote: "192.0.2.9:1234"}
	if got := a.Check(ev); got != 0 {
		t.Errorf("Check = %d, want 0", got)
	}
}

// TestAccessUnixSocket: a transport on a Unix socket ("unix:PATH") gets
// the token and Host checks; the loopback-peer check does not apply (its
// peers are local processes and have no address).
func TestAccessUnixSocket(t *testing.T) {
	a := withToken(t, "t", &Access{Bound: "unix:/run/tether/unix.sock"})
	tests := []struct {
		name string
		ev   contract.Event
		want int
	}{
		{"token and own address", contract.Event{Query: "token=t", Host: "unix:/run/tether/unix.sock", Remote: "unix"}, 0},
		{"no token", contract.Event{Host: "unix:/run/tether/unix.sock", Remote: "unix"}, wire.CloseUnauthorized},
		{"another host", contract.Event{Query: "token=t", Host: "127.0.0.1:7717", Remote: "unix"}, wire.CloseForbidden},
		{"another socket", contract.Event{Query: "token=t", Host: "unix:/tmp/other.sock", Remote: "unix"}, wire.CloseForbidden},
		{"no peer address", contract.Event{Query: "token=t", Host: "unix:/run/tether/unix.sock"}, 0},
	}
	for _, tt := range tests {
		if got := a.Check(tt.ev); got != tt.want {
			t.Errorf("%s: Check = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestAccessHosts: the accepted Host and Origin values for loopback,
// wildcard and proxied listeners, and the strict Origin parse.
func TestAccessHosts(t *testing.T) {
	ifaceIP := ""
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() {
				ifaceIP = n.IP.String()
				break
			}
		}
	}
	loop := withToken(t, "t", &Access{Bound: "127.0.0.1:7717"})
	wild := withToken(t, "t", &Access{Bound: "0.0.0.0:7720"})
	wild6 := withToken(t, "t", &Access{Bound: "[::]:7720"})
	proxied := withToken(t, "t", &Access{Bound: "127.0.0.1:7717", AllowHosts: []string{"tether.example", "exact.example:8443"}})
	tests := []struct {
		a      *Access
		host   string
		origin string
		want   int
	}{
		{loop, "127.0.0.1:7717", "", 0},
		{loop, "localhost:7717", "http://localhost:7717", 0},
		{loop, "[::1]:7717", "http://[::1]:7717", 0},
		{loop, "127.0.0.1:7718", "", wire.CloseForbidden},
		{loop, "rebind.attacker.example:7717", "", wire.CloseForbidden},
		{wild, "127.0.0.1:7720", "http://127.0.0.1:7720", 0},
		{wild, "localhost:7720", "http://localhost:7720/", 0},
		{wild6, "[::1]:7720", "", 0},
		{wild, "0.0.0.0:7720", "", wire.CloseForbidden},
		{wild, "evil.example:7720", "", wire.CloseForbidden},
		{wild, "127.0.0.1:7721", "", wire.CloseForbidden},
		{proxied, "tether.example", "https://tether.example", 0},
		{proxied, "tether.example:443", "https://tether.example:443", 0},
		{proxied, "exact.example:8443", "https://exact.example:8443", 0},
		{proxied, "exact.example:9000", "", wire.CloseForbidden},
		{proxied, "tether.example", "https://other.example", wire.CloseForbidden},
		// Strict origins.
		{loop, "127.0.0.1:7717", "http://evil.com@127.0.0.1:7717", wire.CloseForbidden},
		{loop, "127.0.0.1:7717", "http://127.0.0.1:7717?q=1", wire.CloseForbidden},
		{loop, "127.0.0.1:7717", "http://127.0.0.1:7717#f", wire.CloseForbidden},
		{loop, "127.0.0.1:7717", "http://127.0.0.1:7717/path", wire.CloseForbidden},
		{loop, "127.0.0.1:7717", "ftp://127.0.0.1:7717", wire.CloseForbidden},
		{loop, "127.0.0.1:7717", "null", wire.CloseForbidden},
		{loop, "127.0.0.1:7717", "http://127.0.0.1:7717/", 0},
	}
	if ifaceIP != "" {
		tests = append(tests,
			struct {
				a            *Access
				host, origin string
				want         int
			}{wild, net.JoinHostPort(ifaceIP, "7720"), "http://" + net.JoinHostPort(ifaceIP, "7720"), 0},
			struct {
				a            *Access
				host, origin string
				want         int
			}{loop, net.JoinHostPort(ifaceIP, "7717"), "", wire.CloseForbidden})
	}
	for _, tt := range tests {
		t.Run(tt.a.Bound+"/"+tt.host+"/"+tt.origin, func(t *testing.T) {
			ev := contract.Event{Query: "token=t", Host: tt.host, Remote: "127.0.0.1:1", Header: map[string][]string{}}
			if tt.origin != "" {
				ev.Header["Origin"] = []string{tt.origin}
			}
			if got := tt.a.Check(ev); got != tt.want {
				t.Errorf("Check(Host %q, Origin %q) on %s = %d, want %d", tt.host, tt.origin, tt.a.Bound, got, tt.want)
			}
		})
	}
}

func TestBrowserAddr(t *testing.T) {
	for in, want := range map[string]string{"0.0.0.0:7720": "127.0.0.1:7720", "[::]:7720": "127.0.0.1:7720", ":7720": "127.0.0.1:7720", "127.0.0.1:7717": "127.0.0.1:7717", "[::1]:9": "[::1]:9"} {
		if got := BrowserAddr(in); got != want {
			t.Errorf("BrowserAddr(%q) = %q, want %q", in, got, want)
		}
	}
}

// memStore is a CredentialStore in memory.
type memStore struct {
	mu    sync.Mutex
	creds map[string]store.Credential
	fail  error // every write fails with it when set
}

func newMemStore() *memStore { return &memStore{creds: make(map[string]store.Credential)} }

func (m *memStore) Credentials(context.Context) ([]store.Credential, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []store.Credential
	for _, c := range m.creds {
		out = append(out, c)
	}
	return out, nil
}

func (m *memStore) PutCredential(_ context.Context, c store.Credential) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	for h, o := range m.creds {
		if o.ID == c.ID {
			delete(m.creds, h)
		}
	}
	m.creds[c.Hash] = c
	return nil
}

func (m *memStore) DeleteCredential(_ context.Context, hash string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	delete(m.creds, hash)
	return nil
}

// withToken gives a its listener's cookie name and a book holding token
// as the access token.
func withToken(t testing.TB, token string, a *Access) *Access {
	t.Helper()
	a.Book = NewBook(newMemStore(), zerolog.Nop())
	if err := a.Book.SetAccessToken(context.Background(), AdminName, token); err != nil {
		t.Fatal(err)
	}
	a.Cookie = CookieName(a.Bound)
	return a
}
