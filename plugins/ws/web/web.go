package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

// site holds the files the page is made of. The vendor README is not
// served, only the built files and their licences.
//
//go:embed static/index.html static/app.js static/chat.js static/app.css static/sw.js
//go:embed static/vendor/*.js static/vendor/*.css static/vendor/LICENSE.*
var site embed.FS

// contentSecurityPolicy is sent with the page. xterm.js adds <style>
// elements for its theme, hence 'unsafe-inline' for styles only.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; " +
	"style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// file is one embedded file, ready to serve.
type file struct {
	name        string // base name, for http.ServeContent
	body        []byte
	contentType string
	etag        string
	page        bool // the HTML page: gets the CSP
}

// handler serves the embedded files by URL path.
type handler struct {
	files map[string]*file // "/app.js", "/vendor/xterm.js", ...
}

// Handler returns the handler for the embedded site: "/" is the page,
// "/app.js", "/app.css" and "/vendor/..." its assets; any other path is
// 404 and any method but GET and HEAD is 405.
func Handler() http.Handler {
	h := &handler{files: make(map[string]*file)}
	err := fs.WalkDir(site, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := site.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		f := &file{
			name:        path.Base(p),
			body:        body,
			contentType: contentType(p),
			etag:        `"` + hex.EncodeToString(sum[:12]) + `"`,
			page:        path.Ext(p) == ".html",
		}
		h.files[strings.TrimPrefix(p, "static")] = f
		return nil
	})
	if err != nil {
		// The files are compiled in; failing to read them is a build bug.
		panic("web: reading embedded site: " + err.Error())
	}
	h.files["/"] = h.files["/index.html"]
	return h
}

// contentType is the Content-Type for an embedded file's name.
func contentType(name string) string {
	switch ext := path.Ext(name); {
	case ext == ".html":
		return "text/html; charset=utf-8"
	case ext == ".js":
		return "text/javascript; charset=utf-8"
	case ext == ".css":
		return "text/css; charset=utf-8"
	case strings.HasPrefix(path.Base(name), "LICENSE"):
		return "text/plain; charset=utf-8"
	default:
		if t := mime.TypeByExtension(ext); t != "" {
			return t
		}
		return "application/octet-stream"
	}
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f, ok := h.files[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Type", f.contentType)
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("ETag", f.etag)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	if f.page {
		hdr.Set("Content-Security-Policy", contentSecurityPolicy)
		hdr.Set("X-Frame-Options", "DENY")
	}
	// A zero modtime: no Last-Modified, the ETag does the revalidation.
	http.ServeContent(w, r, f.name, time.Time{}, bytes.NewReader(f.body))
}
