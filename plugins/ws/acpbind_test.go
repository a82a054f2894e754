package ws_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/tether-agent/tether/contract"
)

// fromClient is an HTTP client whose connections come from the local
// address src (Linux answers all of 127.0.0.0/8 on lo).
func fromClient(t *testing.T, src string) *http.Client {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: waitTimeout}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// TestACPHTTPProxyBinding: a connection the host admitted by its
// reverse proxy's user header (its Admit names the header and the
// proxy's addresses) is bound to that user. Another user of the same
// proxy with the connection id gets 403 on POST, GET and DELETE; a
// request without the header is 401, and so is one that sends the
// right user's header from a peer that is not the proxy; the user's own
// requests still work.
func TestACPHTTPProxyBinding(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{})
	const user = "X-Forwarded-User"
	h := jsonHdr("", "")
	h.Set(user, "alice")
	conn, key := f.initializeAs(h, map[string][]string{
		contract.AdmitBindHeader: {"x-forwarded-user"}, contract.AdmitBindFrom: {"127.0.0.1/32", "::1/128"},
	})
	frames := len(f.rec.forConn(conn))

	other := *f
	other.cl = fromClient(t, "127.0.0.2") // not the proxy
	newReq := `{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}`
	for _, tc := range []struct {
		name   string
		f      *acpFix
		method string
		as     []string // the user header's values
		want   int
	}{
		{"another proxy user's POST", f, http.MethodPost, []string{"bob"}, 403},
		{"another proxy user's GET", f, http.MethodGet, []string{"bob"}, 403},
		{"another proxy user's DELETE", f, http.MethodDelete, []string{"bob"}, 403},
		{"a POST naming two users", f, http.MethodPost, []string{"alice", "bob"}, 403},
		{"a POST from the proxy naming nobody", f, http.MethodPost, nil, 401},
		{"a GET from the proxy naming nobody", f, http.MethodGet, nil, 401},
		{"a DELETE from the proxy naming nobody", f, http.MethodDelete, nil, 401},
		{"the user's header on a POST from another peer", &other, http.MethodPost, []string{"alice"}, 401},
		{"the user's header on a GET from another peer", &other, http.MethodGet, []string{"alice"}, 401},
		{"the user's header on a DELETE from another peer", &other, http.MethodDelete, []string{"alice"}, 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := jsonHdr(key, "")
			h.Set("Accept", "text/event-stream")
			if tc.as != nil {
				h[user] = tc.as
			}
			body := ""
			if tc.method == http.MethodPost {
				body = newReq
			}
			if got, _, resp := tc.f.do(tc.method, h, body); got != tc.want {
				t.Errorf("got %d (%q), want %d", got, resp, tc.want)
			}
		})
	}
	if got := len(f.rec.forConn(conn)); got != frames {
		t.Errorf("the host got %d events of the connection from the attackers, want none", got-frames)
	}
	// alice's connection is untouched, and hers.
	cs := f.open(key, "", "", http.Header{user: {"alice"}})
	ah := jsonHdr(key, "")
	ah.Set(user, "alice")
	if got, _, body := f.do(http.MethodPost, ah, newReq); got != http.StatusAccepted {
		t.Fatalf("alice's POST: got %d (%q), want 202", got, body)
	}
	exec(t, f.s, sendText(conn, `{"jsonrpc":"2.0","id":1,"result":{"sessionId":"S"}}`))
	if ev := cs.next(); !strings.Contains(ev.data, `"S"`) {
		t.Errorf("got %+v, want the answer", ev)
	}
	if got, _, body := f.do(http.MethodDelete, ah, ""); got != http.StatusAccepted {
		t.Errorf("alice's DELETE: got %d (%q), want 202", got, body)
	}
}
