package ws_test

import (
	"crypto/sha256"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
	"github.com/tether-agent/tether/plugins/ws/web"
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

// TestPageToken checks the page's access rules with a page token hash:
// which requests get the page, which get the 401 page, and which set the
// cookie, with exactly which attributes.
func TestPageToken(t *testing.T) {
	_, addr := startServer(t, contract.StartRequest{PageTokenSHA256: sha256.Sum256([]byte(pageToken))},
		func(s *ws.Server) { s.Static = web.Handler() })
	base := "http://" + addr
	good := "tether_token=" + pageToken
	tests := []struct {
		name       string
		method     string
		path       string
		header     http.Header
		wantStatus int
		wantBody   string // a substring
		wantCookie string // the whole Set-Cookie, or "" for none
	}{
		{
			name: "good query token", path: "/?token=" + pageToken,
			wantStatus: 200, wantBody: pageMarker,
			wantCookie: "tether_token=" + pageToken + "; Path=/; Max-Age=34560000; HttpOnly; SameSite=Strict",
		},
		{
			name: "good query token with attach", path: "/?attach=abcdefghijklmnop&token=" + pageToken,
			wantStatus: 200, wantBody: pageMarker,
			wantCookie: "tether_token=" + pageToken + "; Path=/; Max-Age=34560000; HttpOnly; SameSite=Strict",
		},
		{
			name: "good cookie", path: "/", header: http.Header{"Cookie": {good}},
			wantStatus: 200, wantBody: pageMarker,
		},
		{
			name: "good cookie among others", path: "/index.html", header: http.Header{"Cookie": {"a=1; tether_token=old; " + good}},
			wantStatus: 200, wantBody: pageMarker,
		},
		{
			name: "bearer", path: "/", header: http.Header{"Authorization": {"Bearer " + pageToken}},
			wantStatus: 200, wantBody: pageMarker,
		},
		{
			name: "nothing", path: "/",
			wantStatus: 401, wantBody: "had none",
		},
		{
			name: "nothing, index.html", path: "/index.html",
			wantStatus: 401, wantBody: "tether serve",
		},
		{
			name: "wrong query token", path: "/?token=nope",
			wantStatus: 401, wantBody: "not this server's token",
		},
		{
			name: "empty query token", path: "/?token=",
			wantStatus: 401, wantBody: "not this server",
		},
		{
			name: "wrong query token, good cookie", path: "/?token=nope", header: http.Header{"Cookie": {good}},
			wantStatus: 401, wantBody: "not this server",
		},
		{
			name: "token with a suffix", path: "/?token=" + pageToken + "x",
			wantStatus: 401, wantBody: "not this server",
		},
		{
			name: "wrong cookie", path: "/", header: http.Header{"Cookie": {"tether_token=nope"}},
			wantStatus: 401, wantBody: "not this server",
		},
		{
			name: "wrong bearer", path: "/", header: http.Header{"Authorization": {"Bearer nope"}},
			wantStatus: 401, wantBody: "not this server",
		},
		{
			name: "head without token", method: http.MethodHead, path: "/",
			wantStatus: 401,
		},
		{
			name: "script is public", path: "/app.js",
			wantStatus: 200, wantBody: "/api/pty",
		},
		{
			name: "vendored file is public", path: "/vendor/xterm.js",
			wantStatus: 200, wantBody: "Terminal",
		},
		{
			name: "healthz is public", path: "/healthz",
			wantStatus: 200, wantBody: "ok",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
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
			if got := strings.Join(resp.Header.Values("Set-Cookie"), "\n"); got != tt.wantCookie {
				t.Errorf("Set-Cookie: got %q, want %q", got, tt.wantCookie)
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
				if method == http.MethodGet && !strings.Contains(body, "&lt;state-dir&gt;/token") {
					t.Error("the 401 page does not name the token file")
				}
			}
		})
	}
}

// TestPageCookieFlow follows what a browser does: open the printed URL,
// then the bare URL with the cookie it was given, then a WebSocket
// upgrade, whose Opened event must carry the cookie for the host.
func TestPageCookieFlow(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{PageTokenSHA256: sha256.Sum256([]byte(pageToken))},
		func(s *ws.Server) { s.Static = web.Handler() })
	r := link(t, s)
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	cl := &http.Client{Jar: jar, Transport: &http.Transport{DisableKeepAlives: true}, Timeout: waitTimeout}
	base := "http://" + addr

	if resp, body := pageGet(t, cl, http.MethodGet, base+"/?token="+url.QueryEscape(pageToken), nil); resp.StatusCode != 200 || !strings.Contains(body, pageMarker) {
		t.Fatalf("GET /?token=: got %d, want the page", resp.StatusCode)
	}
	for _, path := range []string{"/", "/index.html", "/"} {
		if resp, body := pageGet(t, cl, http.MethodGet, base+path, nil); resp.StatusCode != 200 || !strings.Contains(body, pageMarker) {
			t.Errorf("GET %s with the cookie: got %d, want the page", path, resp.StatusCode)
		}
	}

	u, _ := url.Parse(base + "/api/pty")
	cookies := jar.Cookies(u)
	if len(cookies) != 1 || cookies[0].Name != ws.TokenCookie || cookies[0].Value != pageToken {
		t.Fatalf("the jar holds %v for /api/pty, want the token cookie", cookies)
	}
	hdr := http.Header{"Cookie": {cookies[0].String()}}
	c := dial(t, addr, "/api/pty?attach=abcdefghijklmnop", hdr)
	e := r.opened(t, c)
	if got := e.Header["Cookie"]; len(got) != 1 || got[0] != "tether_token="+pageToken {
		t.Errorf("Opened: Cookie %q, want the token cookie for the host to check", got)
	}
	if strings.Contains(e.Query, "token") {
		t.Errorf("Opened: query %q carries a token", e.Query)
	}
}

// TestPageTokenTLS checks that the cookie is Secure under TLS.
func TestPageTokenTLS(t *testing.T) {
	cert := newTestCert(t, 1)
	certFile, keyFile := tlsFiles(t, cert)
	_, addr := startServer(t, contract.StartRequest{
		TLSCertFile: certFile, TLSKeyFile: keyFile,
		PageTokenSHA256: sha256.Sum256([]byte(pageToken)),
	}, func(s *ws.Server) { s.Static = web.Handler() })
	resp, body := httpsGet(t, clientTLS(cert), "https://"+addr+"/?token="+pageToken, nil)
	if resp.StatusCode != 200 || !strings.Contains(body, pageMarker) {
		t.Fatalf("GET /?token= over TLS: got %d, want the page", resp.StatusCode)
	}
	want := "tether_token=" + pageToken + "; Path=/; Max-Age=34560000; HttpOnly; Secure; SameSite=Strict"
	if got := resp.Header.Get("Set-Cookie"); got != want {
		t.Errorf("Set-Cookie: got %q, want %q", got, want)
	}
	resp, _ = httpsGet(t, clientTLS(cert), "https://"+addr+"/", nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET / over TLS without a token: got %d, want 401", resp.StatusCode)
	}
}

// TestPageWithoutToken checks a host that sends no page token hash: the
// page stays public, and a ?token= is carried into the cookie (the host
// checks it on every upgrade).
func TestPageWithoutToken(t *testing.T) {
	_, addr := startServer(t, contract.StartRequest{}, func(s *ws.Server) { s.Static = web.Handler() })
	base := "http://" + addr
	resp, body := pageGet(t, nil, http.MethodGet, base+"/", nil)
	if resp.StatusCode != 200 || !strings.Contains(body, pageMarker) || resp.Header.Get("Set-Cookie") != "" {
		t.Errorf("GET /: got %d (Set-Cookie %q), want the page and no cookie", resp.StatusCode, resp.Header.Get("Set-Cookie"))
	}
	resp, body = pageGet(t, nil, http.MethodGet, base+"/?token=anything", nil)
	if resp.StatusCode != 200 || !strings.Contains(body, pageMarker) {
		t.Errorf("GET /?token=: got %d, want the page", resp.StatusCode)
	}
	if got, want := resp.Header.Get("Set-Cookie"), "tether_token=anything; Path=/; Max-Age=34560000; HttpOnly; SameSite=Strict"; got != want {
		t.Errorf("Set-Cookie: got %q, want %q", got, want)
	}
}

// TestPageTokenUnfitForCookie checks that a right token that a cookie
// cannot carry still gets the page, and no broken cookie.
func TestPageTokenUnfitForCookie(t *testing.T) {
	const tok = `semi;colon"quote`
	_, addr := startServer(t, contract.StartRequest{PageTokenSHA256: sha256.Sum256([]byte(tok))},
		func(s *ws.Server) { s.Static = web.Handler() })
	resp, body := pageGet(t, nil, http.MethodGet, "http://"+addr+"/?token="+url.QueryEscape(tok), nil)
	if resp.StatusCode != 200 || !strings.Contains(body, pageMarker) {
		t.Errorf("GET /?token=: got %d, want the page", resp.StatusCode)
	}
	if got := resp.Header.Get("Set-Cookie"); got != "" {
		t.Errorf("Set-Cookie: got %q, want none", got)
	}
	// Bearer still works for it.
	resp, _ = pageGet(t, nil, http.MethodGet, "http://"+addr+"/", http.Header{"Authorization": {"Bearer " + tok}})
	if resp.StatusCode != 200 {
		t.Errorf("GET / with Bearer: got %d, want 200", resp.StatusCode)
	}
}
