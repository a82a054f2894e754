package e2e_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
	"github.com/tether-agent/tether/wire"
)

// browser is an HTTP client with a cookie jar, as a browser keeps one
// for every host and port of a machine (cookies are not per port).
type browser struct {
	jar *cookiejar.Jar
	cl  *http.Client
}

func newBrowser(tb testing.TB) *browser {
	tb.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		tb.Fatal(err)
	}
	return &browser{jar: jar, cl: &http.Client{Jar: jar, Timeout: 10 * time.Second,
		Transport: &http.Transport{DisableKeepAlives: true}}}
}

// get fetches target and returns its status, Set-Cookie lines and body.
func (b *browser) get(tb testing.TB, target string) (int, []string, string) {
	tb.Helper()
	resp, err := b.cl.Get(target)
	if err != nil {
		tb.Fatalf("GET %s: %v", target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Values("Set-Cookie"), string(body)
}

// cookieHeader is the Cookie header the browser sends to s.
func (b *browser) cookieHeader(s *e2e.Server) string {
	u, _ := url.Parse(s.URL + "/api/ws")
	var parts []string
	for _, c := range b.jar.Cookies(u) {
		parts = append(parts, c.Name+"="+c.Value)
	}
	return strings.Join(parts, "; ")
}

// dialWithCookies opens /api/ws on s with only the browser's cookies as
// credential, and returns the close code it was refused with (0:
// admitted).
func (b *browser) dialWithCookies(tb testing.TB, s *e2e.Server) int {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := s.DialRaw(ctx, "/api/ws", wsclient.Options{Header: http.Header{"Cookie": {b.cookieHeader(s)}}})
	if err != nil {
		tb.Fatalf("dial %s: %v", s.URL, err)
	}
	defer c.Close()
	return closeCodeOf(tb, c)
}

// closeCodeOf returns 0 when c was admitted (its first event is
// gateway.ready), else the code it was closed with.
func closeCodeOf(tb testing.TB, c *wsclient.Client) int {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if e, err := c.NextEvent(ctx); err == nil && e.Type == "gateway.ready" {
		return 0
	}
	select {
	case <-c.Closed():
	case <-ctx.Done():
		tb.Fatal("socket neither admitted nor closed")
	}
	code, _ := c.CloseCode()
	return code
}

// TestPageCookiePerListener: two hosts on two ports of one machine and
// one cookie jar (a browser): signing into the second does not sign the
// first out. Each cookie is named for its port and holds a page
// credential, never the access token; the bare URLs (bookmarks) and
// WebSockets with only the cookie are accepted on both; one host's page
// credential is not accepted by the other (the hosts share nothing).
func TestPageCookiePerListener(t *testing.T) {
	h1 := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", ""}})
	h2 := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", ""}})
	if h1.Token == h2.Token {
		t.Fatal("two hosts with one token")
	}
	b := newBrowser(t)
	for _, s := range []*e2e.Server{h1, h2} {
		status, set, _ := b.get(t, s.URL+"/?token="+s.Token)
		if status != 200 || len(set) != 1 {
			t.Fatalf("GET %s/?token=: %d, Set-Cookie %q; want 200 and one cookie", s.URL, status, set)
		}
		_, port, _ := strings.Cut(s.Addr, ":")
		c, err := http.ParseSetCookie(set[0])
		if err != nil {
			t.Fatal(err)
		}
		if c.Name != "tether_"+port || c.Value == s.Token || strings.Contains(set[0], s.Token) {
			t.Errorf("%s set %q; want a cookie tether_%s holding a page credential, not the token", s.URL, set[0], port)
		}
	}
	for _, s := range []*e2e.Server{h1, h2} {
		if status, _, body := b.get(t, s.URL+"/"); status != 200 || !strings.Contains(body, "app.js") {
			t.Errorf("the bare URL of %s after signing into both: %d; want the page", s.URL, status)
		}
		if code := b.dialWithCookies(t, s); code != 0 {
			t.Errorf("/api/ws of %s with only the jar's cookies: closed %d; want admitted", s.URL, code)
		}
	}

	// h1's page credential, sent to h2 under h2's cookie name, is not
	// h2's: single hosts share no credential.
	u1, _ := url.Parse(h1.URL)
	var cred string
	_, port1, _ := strings.Cut(h1.Addr, ":")
	for _, c := range b.jar.Cookies(u1) {
		if c.Name == "tether_"+port1 {
			cred = c.Value
		}
	}
	_, port2, _ := strings.Cut(h2.Addr, ":")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := h2.DialRaw(ctx, "/api/ws", wsclient.Options{Header: http.Header{"Cookie": {"tether_" + port2 + "=" + cred}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if code := closeCodeOf(t, c); code != wire.CloseUnauthorized {
		t.Errorf("h1's page credential on h2: %d, want 4401", code)
	}
}

// TestPageCookieOldAndRotated: a browser that still has the old
// tether_token cookie (the token itself) is signed in and given the
// listener's cookie in its place; after the access token changes
// (a new token file), every page credential made from the old one is
// refused with the 401 page.
func TestPageCookieOldAndRotated(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", ""}})
	b := newBrowser(t)
	u, _ := url.Parse(s.URL)
	b.jar.SetCookies(u, []*http.Cookie{{Name: "tether_token", Value: s.Token, Path: "/"}})
	status, set, _ := b.get(t, s.URL+"/")
	if status != 200 || len(set) != 2 || !strings.HasPrefix(set[1], "tether_token=;") {
		t.Fatalf("GET / with the old cookie: %d, Set-Cookie %q; want 200, the new cookie, the old one cleared", status, set)
	}
	if h := b.cookieHeader(s); strings.Contains(h, s.Token) || !strings.Contains(h, "tether_") {
		t.Errorf("cookies after the page load: %q; want the page cookie only, no token", h)
	}
	if code := b.dialWithCookies(t, s); code != 0 {
		t.Fatalf("/api/ws with the new cookie: %d", code)
	}

	// A new access token (the token file replaced, the host restarted on
	// the same port): the old page credential is gone with the old token.
	if err := s.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.StateDir, "token"), []byte("a-new-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := e2e.Start(t, e2e.Config{StateDir: s.StateDir, Args: []string{"--pty-command", "", "--listen", s.Addr}})
	if status, set, body := b.get(t, s2.URL+"/"); status != http.StatusUnauthorized || len(set) != 0 || !strings.Contains(body, "not one this server accepts") {
		t.Errorf("GET / with a page cookie of the old token: %d %q; want 401 and no cookie", status, set)
	}
	if code := b.dialWithCookies(t, s2); code != wire.CloseUnauthorized {
		t.Errorf("/api/ws with a page cookie of the old token: %d, want 4401", code)
	}
}

// TestClusterOneCredential: in a cluster, a client signed in on one host
// is accepted by every host (a load balancer or a reconnect may land
// anywhere): each host's access token works on the others, and so does
// a page credential made on one, presented to another under its cookie
// name, as behind a load balancer with one name. A token no host made is
// refused everywhere.
func TestClusterOneCredential(t *testing.T) {
	hosts := startCluster3(t)
	for _, from := range hosts {
		for _, to := range hosts {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			c, err := to.DialRaw(ctx, "/api/ws", wsclient.Options{Token: from.Token})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if code := closeCodeOf(t, c); code != 0 {
				t.Errorf("%s's token on %s: closed %d, want admitted", from.ID, to.ID, code)
			}
			c.Close()
		}
	}
	b := newBrowser(t)
	status, set, _ := b.get(t, hosts[0].URL+"/?token="+hosts[0].Token)
	if status != 200 || len(set) != 1 {
		t.Fatalf("sign-in on h1: %d %q", status, set)
	}
	c, err := http.ParseSetCookie(set[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, to := range hosts[1:] {
		_, port, _ := strings.Cut(to.Addr, ":")
		// The other hosts learn of the new credential through the
		// cluster's bucket: allow them a moment.
		deadline := time.Now().Add(10 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			ws, err := to.DialRaw(ctx, "/api/ws", wsclient.Options{Header: http.Header{"Cookie": {"tether_" + port + "=" + c.Value}}})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			code := closeCodeOf(t, ws)
			ws.Close()
			if code == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("h1's page credential on %s: closed %d, want admitted", to.ID, code)
			}
		}
	}
	for _, to := range hosts {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ws, err := to.DialRaw(ctx, "/api/ws", wsclient.Options{Token: "0123456789abcdef0123456789abcdef"})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if code := closeCodeOf(t, ws); code != wire.CloseUnauthorized {
			t.Errorf("a made-up token on %s: %d, want 4401", to.ID, code)
		}
		ws.Close()
	}
}
