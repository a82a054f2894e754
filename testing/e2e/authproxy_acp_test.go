package e2e_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
)

// proxyACP is a client of /acp over Streamable HTTP through a relay, as
// the user its X-Forwarded-User names (none: no header), with no token.
type proxyACP struct {
	tb    testing.TB
	s     *e2e.Server
	relay string
	user  []string
	cl    *http.Client
}

func newProxyACP(tb testing.TB, s *e2e.Server, relay string, user ...string) *proxyACP {
	tr := &http.Transport{}
	tb.Cleanup(tr.CloseIdleConnections)
	return &proxyACP{tb: tb, s: s, relay: relay, user: user, cl: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// req makes a request of /acp with key as its Acp-Connection-Id.
func (c *proxyACP) req(ctx context.Context, method, key, body string) *http.Request {
	c.tb.Helper()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.relay+"/acp", strings.NewReader(body))
	if err != nil {
		c.tb.Fatal(err)
	}
	req.Host = c.s.Addr
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if key != "" {
		req.Header.Set("Acp-Connection-Id", key)
	}
	if c.user != nil {
		req.Header["X-Forwarded-User"] = c.user
	}
	return req
}

// do sends one request and returns its status, body and headers; a
// stream's body is not read.
func (c *proxyACP) do(method, key, body string) (int, string, http.Header) {
	c.tb.Helper()
	resp, err := c.cl.Do(c.req(context.Background(), method, key, body))
	if err != nil {
		c.tb.Fatalf("%s /acp through %s: %v", method, c.relay, err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		return resp.StatusCode, "", resp.Header
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// TestAuthProxyACPHTTP: an /acp connection over HTTP that the reverse
// proxy's user header opened (no token) is bound to that user. Another
// user of the same proxy who has its connection id gets 403 on POST,
// GET and DELETE, a request naming nobody 401, and the user's own
// header sent from a peer that is not the proxy 401 (it is ignored
// there, as at admission); the user's requests still work.
func TestAuthProxyACPHTTP(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--auth-proxy-from", "127.0.0.1/32", "--auth-proxy-header", "X-Forwarded-User"}})
	proxy, other := relayFrom(t, s, "127.0.0.1"), relayFrom(t, s, "127.0.0.2")
	alice := newProxyACP(t, s, proxy, "alice")
	st, body, hdr := alice.do(http.MethodPost, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`)
	key := hdr.Get("Acp-Connection-Id")
	if st != http.StatusOK || key == "" {
		t.Fatalf("initialize as alice through the proxy: got %d %q (connection id %q), want 200 and an id", st, body, key)
	}
	list := `{"jsonrpc":"2.0","id":1,"method":"session/list","params":{}}`
	for _, tc := range []struct {
		name   string
		c      *proxyACP
		method string
		want   int
	}{
		{"another proxy user's POST", newProxyACP(t, s, proxy, "bob"), http.MethodPost, 403},
		{"another proxy user's GET", newProxyACP(t, s, proxy, "bob"), http.MethodGet, 403},
		{"another proxy user's DELETE", newProxyACP(t, s, proxy, "bob"), http.MethodDelete, 403},
		{"a POST through the proxy naming nobody", newProxyACP(t, s, proxy), http.MethodPost, 401},
		{"alice's header on a POST from another peer", newProxyACP(t, s, other, "alice"), http.MethodPost, 401},
		{"alice's header on a GET from another peer", newProxyACP(t, s, other, "alice"), http.MethodGet, 401},
		{"alice's header on a DELETE from another peer", newProxyACP(t, s, other, "alice"), http.MethodDelete, 401},
	} {
		b := ""
		if tc.method == http.MethodPost {
			b = list
		}
		if st, body, _ := tc.c.do(tc.method, key, b); st != tc.want {
			t.Errorf("%s: got %d %q, want %d", tc.name, st, body, tc.want)
		}
	}

	// alice's connection is hers still: her stream gets the answer to
	// her POST, and her DELETE ends it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := (&http.Client{Transport: alice.cl.Transport}).Do(alice.req(ctx, http.MethodGet, key, ""))
	if err != nil {
		t.Fatalf("alice's GET: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("alice's GET: got %d, want 200", resp.StatusCode)
	}
	if st, body, _ := alice.do(http.MethodPost, key, list); st != http.StatusAccepted {
		t.Fatalf("alice's POST: got %d %q, want 202", st, body)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("alice's stream ended before the answer to her POST: %v", err)
		}
		if strings.HasPrefix(line, "data: ") && strings.Contains(line, `"id":1`) {
			break
		}
	}
	if st, body, _ := alice.do(http.MethodDelete, key, ""); st != http.StatusAccepted {
		t.Errorf("alice's DELETE: got %d %q, want 202", st, body)
	}
}
