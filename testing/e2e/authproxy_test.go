package e2e_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
	"github.com/tether-agent/tether/wire"
)

// relayFrom is a TCP relay in front of the host s whose connections to
// it come from the local address src: what the host sees as the peer.
// It returns the relay's address; the relay stops at cleanup.
func relayFrom(tb testing.TB, s *e2e.Server, src string) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			track(in)
			out, err := d.Dial("tcp", s.Addr)
			if err != nil {
				in.Close()
				continue
			}
			track(out)
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(out, in); out.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// dialAs opens /api/ws on s through relay with hdr (Host set to the
// host's own) and, when token is set, that token. It returns the client
// (closed at cleanup) and the close code it was refused with (0:
// admitted, its gateway.ready consumed).
func dialAs(tb testing.TB, s *e2e.Server, relay string, hdr http.Header, token string) (*wsclient.Client, int, string) {
	tb.Helper()
	h := hdr.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set("Host", s.Addr)
	c, err := wsclient.Dial(ctxT(tb, 10*time.Second), "ws://"+relay+"/api/ws", wsclient.Options{Token: token, Header: h})
	if err != nil {
		tb.Fatalf("dial through %s: %v", relay, err)
	}
	tb.Cleanup(func() { c.Close() })
	if code, reason := c.CloseCode(); code != 0 {
		return c, code, reason
	}
	e, err := c.NextEvent(ctxT(tb, 10*time.Second))
	if err != nil || e.Type != wire.EventReady {
		code, reason := c.CloseCode()
		return c, code, reason
	}
	var ready wire.Ready
	if err := e.Decode(&ready); err != nil || ready.Identity == nil {
		tb.Fatalf("gateway.ready %s: no identity (%v)", e.Raw, err)
	}
	return c, 0, ready.Identity.Name + " " + strings.Join(ready.Identity.Scopes, ",")
}

// TestAuthProxy: behind --auth-proxy-from 127.0.0.1/32 the user header
// names who a connection from 127.0.0.1 is — with the users file's
// scopes, journaled as that user — and is ignored from 127.0.0.2, where
// the token alone counts. A page the proxy names a user for is served
// without a page cookie; /api/pty goes by the same user.
func TestAuthProxy(t *testing.T) {
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, []byte("# who may do what\nalice admin\nvera session:nothing:view\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "cat",
		"--auth-proxy-from", "127.0.0.1/32", "--auth-proxy-header", "X-Forwarded-User", "--auth-proxy-users", users}})
	proxy, other := relayFrom(t, s, "127.0.0.1"), relayFrom(t, s, "127.0.0.2")
	as := func(name string) http.Header { return http.Header{"X-Forwarded-User": {name}} }

	t.Run("the proxy's user is admitted as that user", func(t *testing.T) {
		c, code, who := dialAs(t, s, proxy, as("alice"), "")
		if code != 0 || who != "alice admin" {
			t.Fatalf("dial as alice from the proxy: code %d, identity %q; want admitted as alice admin", code, who)
		}
		var snap wire.Snapshot
		call(t, c, wire.MethodCreate, nil, &snap)
		call(t, c, wire.MethodSubmit, map[string]any{"session_id": snap.SessionID, "text": "hello"}, nil)
		e, err := c.WaitEvent(ctxT(t, 10*time.Second), func(e wsclient.Event) bool { return e.Type == wire.EventMessageStart })
		if err != nil {
			t.Fatalf("no message.start: %v", err)
		}
		var start struct {
			By string `json:"by"`
		}
		if err := e.Decode(&start); err != nil || start.By != "alice" {
			t.Errorf("message.start %s: by %q, want alice", e.Raw, start.By)
		}
	})
	t.Run("a view-only user gets 4030 creating a session", func(t *testing.T) {
		c, code, who := dialAs(t, s, proxy, as("vera"), "")
		if code != 0 || who != "vera session:nothing:view" {
			t.Fatalf("dial as vera: code %d, identity %q; want admitted with her scope", code, who)
		}
		err := c.Call(ctxT(t, 10*time.Second), wire.MethodCreate, nil, nil)
		var re *client.Error
		if !errors.As(err, &re) || re.Code != wire.CodeForbidden {
			t.Errorf("session.create as vera: %v, want 4030", err)
		}
	})
	t.Run("a user not in the users file is 4401", func(t *testing.T) {
		if _, code, reason := dialAs(t, s, proxy, as("mallory"), s.Token); code != wire.CloseUnauthorized || reason != "unknown user" {
			t.Errorf("dial as mallory with a token: code %d %q, want 4401 unknown user", code, reason)
		}
	})
	t.Run("an empty user from the proxy is 4401", func(t *testing.T) {
		if _, code, _ := dialAs(t, s, proxy, as(""), s.Token); code != wire.CloseUnauthorized {
			t.Errorf("empty header: code %d, want 4401", code)
		}
	})
	t.Run("from another peer the header is ignored: no token is 4401", func(t *testing.T) {
		if _, code, _ := dialAs(t, s, other, as("alice"), ""); code != wire.CloseUnauthorized {
			t.Errorf("dial as alice from 127.0.0.2: code %d, want 4401", code)
		}
	})
	t.Run("from another peer the token counts", func(t *testing.T) {
		if _, code, who := dialAs(t, s, other, as("vera"), s.Token); code != 0 || who != "admin admin" {
			t.Errorf("dial as vera with the token from 127.0.0.2: code %d, identity %q; want admitted as admin", code, who)
		}
	})
	t.Run("/api/pty gets the proxy's user", func(t *testing.T) {
		attach := func(relay string, hdr http.Header, token string) int {
			o := client.PTYOptions{Options: client.Options{Host: s.Addr, Header: hdr, Token: token}}
			p, err := client.AttachURL(ctxT(t, 10*time.Second), "ws://"+relay+"/api/pty?attach="+attachToken(t), o)
			var ce *client.CloseError
			switch {
			case errors.As(err, &ce):
				return ce.Code
			case err != nil:
				t.Fatalf("attach through %s: %v", relay, err)
			}
			p.Close()
			return 0
		}
		if code := attach(proxy, as("alice"), ""); code != 0 {
			t.Errorf("a new PTY as alice from the proxy: code %d, want admitted", code)
		}
		if code := attach(proxy, as("vera"), s.Token); code != wire.CloseForbidden {
			t.Errorf("a new PTY as view-only vera (a token beside): code %d, want 4403", code)
		}
		if code := attach(other, as("alice"), ""); code != wire.CloseUnauthorized {
			t.Errorf("a new PTY as alice from 127.0.0.2: code %d, want 4401", code)
		}
	})
	t.Run("the proxy's page gets no page cookie", func(t *testing.T) {
		page := func(relay string, hdr http.Header) (int, []string) {
			req, err := http.NewRequestWithContext(ctxT(t, 10*time.Second), http.MethodGet, "http://"+relay+"/", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Host = s.Addr
			req.Header = hdr
			cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := cl.Do(req)
			if err != nil {
				t.Fatalf("GET / through %s: %v", relay, err)
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			return resp.StatusCode, resp.Header.Values("Set-Cookie")
		}
		if code, set := page(proxy, as("alice")); code != http.StatusOK || len(set) != 0 {
			t.Errorf("page as alice from the proxy: %d, Set-Cookie %q; want 200 and no cookie", code, set)
		}
		if code, _ := page(other, as("alice")); code != http.StatusUnauthorized {
			t.Errorf("page as alice from 127.0.0.2: %d, want 401", code)
		}
	})
}
