package web_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tether-agent/tether/plugins/ws/web"
)

// get serves one request and returns the response.
func get(tb testing.TB, h http.Handler, method, target string, header http.Header) *http.Response {
	tb.Helper()
	req := httptest.NewRequest(method, target, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(tb testing.TB, resp *http.Response) string {
	tb.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("reading body: %v", err)
	}
	return string(b)
}

func TestServe(t *testing.T) {
	h := web.Handler()
	tests := []struct {
		path     string
		wantType string
		wantBody string // a substring
	}{
		{"/", "text/html; charset=utf-8", `<script src="app.js">`},
		{"/index.html", "text/html; charset=utf-8", `id="terminal"`},
		{"/app.js", "text/javascript; charset=utf-8", "/api/pty"},
		{"/chat.js", "text/javascript; charset=utf-8", "/api/ws"},
		{"/app.css", "text/css; charset=utf-8", "#statusbar"},
		{"/vendor/xterm.js", "text/javascript; charset=utf-8", "Terminal"},
		{"/vendor/xterm.css", "text/css; charset=utf-8", ".xterm"},
		{"/vendor/addon-fit.js", "text/javascript; charset=utf-8", "FitAddon"},
		{"/vendor/LICENSE.xterm", "text/plain; charset=utf-8", "The xterm.js authors"},
		{"/vendor/LICENSE.addon-fit", "text/plain; charset=utf-8", "The xterm.js authors"},
		{"/vendor/addon-web-links.js", "text/javascript; charset=utf-8", "WebLinksAddon"},
		{"/vendor/LICENSE.addon-web-links", "text/plain; charset=utf-8", "The xterm.js authors"},
		{"/vendor/addon-search.js", "text/javascript; charset=utf-8", "SearchAddon"},
		{"/vendor/LICENSE.addon-search", "text/plain; charset=utf-8", "The xterm.js authors"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			resp := get(t, h, "GET", tt.path, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status: got %d, want 200", resp.StatusCode)
			}
			if got := resp.Header.Get("Content-Type"); got != tt.wantType {
				t.Errorf("Content-Type: got %q, want %q", got, tt.wantType)
			}
			if got := resp.Header.Get("Cache-Control"); got != "no-cache" {
				t.Errorf("Cache-Control: got %q, want no-cache", got)
			}
			if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("X-Content-Type-Options: got %q, want nosniff", got)
			}
			if resp.Header.Get("ETag") == "" {
				t.Error("no ETag")
			}
			isPage := strings.HasSuffix(tt.wantType, "html; charset=utf-8")
			if got := resp.Header.Get("Content-Security-Policy"); (got != "") != isPage {
				t.Errorf("Content-Security-Policy: got %q, want it only on the page", got)
			}
			if b := body(t, resp); !strings.Contains(b, tt.wantBody) {
				t.Errorf("body does not contain %q", tt.wantBody)
			}
		})
	}
}

func TestNotFound(t *testing.T) {
	h := web.Handler()
	for _, p := range []string{
		"/nope", "/vendor/", "/vendor", "/static/index.html", "/vendor/README.md",
		"/vendor/xterm.js.map", "/api/pty", "/app.js/", "//app.js", "/../app.js", "/index.html/",
	} {
		t.Run(p, func(t *testing.T) {
			resp := get(t, h, "GET", "http://localhost"+p, nil)
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("status: got %d, want 404", resp.StatusCode)
			}
		})
	}
}

func TestMethods(t *testing.T) {
	h := web.Handler()
	resp := get(t, h, "HEAD", "/app.js", nil)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("HEAD: got %d, want 200", resp.StatusCode)
	}
	if b := body(t, resp); b != "" {
		t.Errorf("HEAD body: got %d bytes, want none", len(b))
	}
	resp = get(t, h, "POST", "/", nil)
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: got %d, want 405", resp.StatusCode)
	}
	if got := resp.Header.Get("Allow"); got != "GET, HEAD" {
		t.Errorf("Allow: got %q, want %q", got, "GET, HEAD")
	}
}

func TestRevalidate(t *testing.T) {
	h := web.Handler()
	etag := get(t, h, "GET", "/", nil).Header.Get("ETag")
	resp := get(t, h, "GET", "/", http.Header{"If-None-Match": {etag}})
	if resp.StatusCode != http.StatusNotModified {
		t.Errorf("If-None-Match %s: got %d, want 304", etag, resp.StatusCode)
	}
	if other := get(t, h, "GET", "/app.js", nil).Header.Get("ETag"); other == etag {
		t.Errorf("/ and /app.js share the ETag %s", etag)
	}
}

// TestPageReferences checks that every script and stylesheet the page
// names is served.
func TestPageReferences(t *testing.T) {
	h := web.Handler()
	page := body(t, get(t, h, "GET", "/", nil))
	refs := regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(page, -1)
	if len(refs) < 5 {
		t.Fatalf("got %d references in the page, want at least 5", len(refs))
	}
	for _, m := range refs {
		if strings.HasPrefix(m[1], "data:") {
			continue
		}
		resp := get(t, h, "GET", "/"+m[1], nil)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: got %d, want 200", m[1], resp.StatusCode)
		}
	}
}

// TestVendorChecksums checks the vendored files against the checksums in
// static/vendor/README.md, so an update cannot be half done.
func TestVendorChecksums(t *testing.T) {
	dir := filepath.Join("static", "vendor")
	f, err := os.Open(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line := regexp.MustCompile(`^([0-9a-f]{64})  (\S+)$`)
	listed := make(map[string]bool)
	for sc := bufio.NewScanner(f); sc.Scan(); {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		listed[m[2]] = true
		served := body(t, get(t, web.Handler(), "GET", "/vendor/"+m[2], nil))
		sum := sha256.Sum256([]byte(served))
		if got := hex.EncodeToString(sum[:]); got != m[1] {
			t.Errorf("%s: got sha256 %s, want %s (README.md)", m[2], got, m[1])
		}
	}
	// Every vendored script and style sheet has its checksum, and each has
	// its licence next to it.
	built, err := filepath.Glob(filepath.Join(dir, "*.[jc]s*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range built {
		name := filepath.Base(p)
		if !listed[name] {
			t.Errorf("%s: no checksum in README.md", name)
		}
		if ext := filepath.Ext(name); ext == ".js" {
			lic := "LICENSE." + strings.TrimSuffix(name, ext)
			if _, err := os.Stat(filepath.Join(dir, lic)); err != nil {
				t.Errorf("%s: no %s next to it", name, lic)
			}
		}
	}
	if len(listed) != len(built) {
		t.Errorf("got %d checksums in README.md for %d vendored files", len(listed), len(built))
	}
}
