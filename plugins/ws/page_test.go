package ws_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
	"github.com/tether-agent/tether/plugins/ws/web"
	"github.com/tether-agent/tether/wire"
)

const pageToken = "s3cret-token_1234"

// pageGet makes one request without keep-alive and returns the response
// with its body read.
func pageGet(t testing.TB, cl *http.Client, method, target string, hdr http.Header) (*http.Response, string) {
	t.Helper()
	if cl == nil {
		cl = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: waitTimeout}
	}
	req, err := http.NewRequest(method, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v[0]
			continue
		}
		req.Header[k] = v
	}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, target, err)
	}
	return resp, string(b)
}

const pageMarker = `<script src="app.js">` // in the page, not in the 401 page

// pageHost plays the host's part for page requests: it links the
// transport and answers each page request as decide says, counting them.
type pageHost struct {
	mu   sync.Mutex // guards the fields below
	asks []contract.Event
}

func startPageHost(t testing.TB, s *ws.Server, decide func(contract.Event) contract.Command) *pageHost {
	t.Helper()
	h := &pageHost{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.Link(ctx, func(ctx context.Context, evs []contract.Event) error {
			for _, e := range evs {
				if e.Kind != contract.EventOpened || !e.Page {
					continue
				}
				h.mu.Lock()
				h.asks = append(h.asks, e)
				h.mu.Unlock()
				if decide == nil {
					continue // never answers
				}
				cmd := decide(e)
				cmd.Conn = e.Conn
				if err := s.Exec(ctx, []contract.Command{cmd}); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Link: got error %v, want nil", err)
		}
	})
	return h
}

func (h *pageHost) asked() []contract.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]contract.Event(nil), h.asks...)
}

// TestPageAsksTheHost checks the page's access rules with PageAuth: a
// page is served only when the host admits its request, with the
// host's headers; a refusal gets the page for its code; scripts and
// /healthz are public and never asked about.
func TestPageAsksTheHost(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{PageAuth: true}, func(s *ws.Server) { s.Static = web.Handler() })
	const cookie = "tether_1234=pagecred; Path=/; Max-Age=34560000; HttpOnly; SameSite=Strict"
	h := startPageHost(t, s, func(e contract.Event) contract.Command {
		q, _ := url.ParseQuery(e.Query)
		switch tok := q.Get("token"); {
		case tok == pageToken:
			return contract.Command{Kind: contract.CommandAdmit, Header: map[string][]string{"Set-Cookie": {cookie, "tether_token=; Path=/; Max-Age=0"}}}
		case tok == "expired":
			return contract.Command{Kind: contract.CommandClose, Code: wire.CloseUnauthorized, Reason: "credential expired"}
		case len(e.Header["X-Forwarded-User"]) > 0:
			return contract.Command{Kind: contract.CommandClose, Code: wire.CloseUnauthorized, Reason: "unknown user"}
		case tok != "":
			return contract.Command{Kind: contract.CommandClose, Code: wire.CloseUnauthorized, Reason: "unauthorized"}
		case e.Host == "evil.example":
			return contract.Command{Kind: contract.CommandClose, Code: wire.CloseForbidden, Reason: "forbidden host or origin"}
		case len(e.Header["Cookie"]) > 0:
			return contract.Command{Kind: contract.CommandAdmit}
		}
		return contract.Command{Kind: contract.CommandClose, Code: wire.CloseUnauthorized, Reason: "no credential"}
	})
	base := "http://" + addr
	tests := []struct {
		name       string
		method     string
		path       string
		header     http.Header
		wantStatus int
		wantBody   string   // a substring
		wantCookie []string // every Set-Cookie
		wantAsked  bool
	}{
		{name: "admitted with headers", path: "/?token=" + pageToken, wantStatus: 200, wantBody: pageMarker,
			wantCookie: []string{cookie, "tether_token=; Path=/; Max-Age=0"}, wantAsked: true},
		{name: "admitted, index.html", path: "/index.html", header: http.Header{"Cookie": {"tether_1234=pagecred"}},
			wantStatus: 200, wantBody: pageMarker, wantAsked: true},
		{name: "no credential", path: "/", wantStatus: 401, wantBody: "had none", wantAsked: true},
		{name: "wrong credential", path: "/?token=nope", wantStatus: 401, wantBody: "not one this server accepts", wantAsked: true},
		{name: "expired credential", path: "/?token=expired", wantStatus: 401, wantBody: "expired", wantAsked: true},
		{name: "a proxy's user not let in", path: "/", header: http.Header{"X-Forwarded-User": {"mallory"}}, wantStatus: 401, wantBody: "does not list you", wantAsked: true},
		{name: "head, refused", method: http.MethodHead, path: "/", wantStatus: 401, wantAsked: true},
		{name: "forbidden host", path: "/", header: http.Header{"Host": {"evil.example"}}, wantStatus: 403, wantBody: "forbidden", wantAsked: true},
		{name: "script is public", path: "/app.js", wantStatus: 200, wantBody: "/api/pty"},
		{name: "vendored file is public", path: "/vendor/xterm.js", wantStatus: 200, wantBody: "Terminal"},
		{name: "healthz is public", path: "/healthz", wantStatus: 200, wantBody: "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(h.asked())
			method := tt.method
			if method == "" {
				method = http.MethodGet
			}
			resp, body := pageGet(t, nil, method, base+tt.path, tt.header)
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status: got %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if !strings.Contains(body, tt.wantBody) {
				t.Errorf("body: got %.300q, want it to contain %q", body, tt.wantBody)
			}
			if got := resp.Header.Values("Set-Cookie"); strings.Join(got, "\n") != strings.Join(tt.wantCookie, "\n") {
				t.Errorf("Set-Cookie: got %q, want %q", got, tt.wantCookie)
			}
			asks := h.asked()[before:]
			if tt.wantAsked != (len(asks) == 1) || len(asks) > 1 {
				t.Fatalf("host asked %d times, want asked=%v", len(asks), tt.wantAsked)
			}
			if tt.wantAsked {
				if u, _ := url.Parse(tt.path); asks[0].Path != u.Path || asks[0].Query != u.RawQuery || asks[0].Remote == "" {
					t.Errorf("page request: got path %q query %q remote %q, want %q %q and the peer", asks[0].Path, asks[0].Query, asks[0].Remote, u.Path, u.RawQuery)
				}
			}
			if tt.wantStatus == http.StatusUnauthorized {
				for k, want := range map[string]string{
					"Content-Type":     "text/html; charset=utf-8",
					"Cache-Control":    "no-store",
					"WWW-Authenticate": `Bearer realm="tether"`,
				} {
					if got := resp.Header.Get(k); got != want {
						t.Errorf("%s: got %q, want %q", k, got, want)
					}
				}
				if strings.Contains(body, pageMarker) {
					t.Error("the 401 page contains the page")
				}
				proxied := tt.header.Get("X-Forwarded-User") != "" // a person the proxy named holds no token
				if method == http.MethodGet && !proxied && !strings.Contains(body, "&lt;state-dir&gt;/token") {
					t.Error("the 401 page does not name the token file")
				}
				if proxied && strings.Contains(body, "token") {
					t.Error("the 401 page of a proxy's user speaks of a token")
				}
			}
		})
	}
}

// TestPageHostSilent checks that a page request the host does not
// answer gets 503 after the wait, and one waiting while the transport
// stops gets 503 at once.
func TestPageHostSilent(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{PageAuth: true}, func(s *ws.Server) {
		s.Static = web.Handler()
		s.PageAnswerTimeout = 200 * time.Millisecond
	})
	h := startPageHost(t, s, nil)
	resp, body := pageGet(t, nil, http.MethodGet, "http://"+addr+"/", nil)
	if resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(body, pageMarker) {
		t.Errorf("GET / with no answer: got %d %.100q, want 503 without the page", resp.StatusCode, body)
	}
	if n := len(h.asked()); n != 1 {
		t.Errorf("host asked %d times, want 1", n)
	}
}

// TestPageWithoutPageAuth checks a host that does not ask for PageAuth:
// the page is public, no request is reported and no cookie set.
func TestPageWithoutPageAuth(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{}, func(s *ws.Server) { s.Static = web.Handler() })
	h := startPageHost(t, s, func(contract.Event) contract.Command { return contract.Command{Kind: contract.CommandAdmit} })
	resp, body := pageGet(t, nil, http.MethodGet, "http://"+addr+"/?token=anything", nil)
	if resp.StatusCode != 200 || !strings.Contains(body, pageMarker) || resp.Header.Get("Set-Cookie") != "" {
		t.Errorf("GET /: got %d (Set-Cookie %q), want the page and no cookie", resp.StatusCode, resp.Header.Get("Set-Cookie"))
	}
	if n := len(h.asked()); n != 0 {
		t.Errorf("host asked %d times, want 0", n)
	}
}
