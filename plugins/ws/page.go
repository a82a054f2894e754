package ws

import (
	"net/http"
	"strings"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// gated reports whether a Static path is a page, which the host must
// let through. The other files (scripts, style sheets, licences) stay
// public: they hold no secret, and a page that loaded can then tell its
// user why its WebSocket was refused, e.g. when cookies are blocked.
func gated(path string) bool {
	return path == "/" || strings.HasSuffix(path, "/") || strings.HasSuffix(path, ".html")
}

// pageAnswerTimeout bounds the wait for the host's answer to a page
// request; past it the request gets HTTP 503.
const pageAnswerTimeout = 10 * time.Second

// serveStatic serves Static. With PageAuth, a page is served only when
// the host admits its request (an opened event with Page set), with the
// headers the host's admit carries (its page cookie); a refusal gets the
// 401 or 403 page, and no answer in time 503. Without it every path is
// public.
func (s *Server) serveStatic(w http.ResponseWriter, r *http.Request, cfg *config) {
	if cfg.pageAuth && gated(r.URL.Path) {
		cmd, ok := s.askHost(r)
		switch {
		case !ok:
			http.Error(w, "the host did not answer; try again", http.StatusServiceUnavailable)
			return
		case cmd.Kind != contract.CommandAdmit:
			s.log.Debug().Str("remote", r.RemoteAddr).Int("code", cmd.Code).Str("reason", cmd.Reason).Msg("page refused")
			refused(w, r, cmd.Code, cmd.Reason)
			return
		}
		for k, vs := range cmd.Header {
			for _, v := range vs {
				w.Header().Add(k, v)
			}
		}
	}
	s.Static.ServeHTTP(w, r)
}

// askHost reports r to the host as a page request and waits for its one
// command (admit or close); false when none came in time, or the
// transport stopped.
func (s *Server) askHost(r *http.Request) (contract.Command, bool) {
	answer := make(chan contract.Command, 1)
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return contract.Command{}, false
	}
	s.lastID++
	id := s.lastID
	s.pages[id] = answer
	s.events.Push(contract.Event{
		Kind:   contract.EventOpened,
		Conn:   id,
		Page:   true,
		Path:   r.URL.Path,
		Query:  r.URL.RawQuery,
		Header: r.Header.Clone(),
		Remote: r.RemoteAddr,
		Host:   r.Host,
	})
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.pages, id)
		s.mu.Unlock()
	}()
	wait := s.PageAnswerTimeout
	if wait <= 0 {
		wait = pageAnswerTimeout
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case cmd := <-answer:
		return cmd, true
	case <-t.C:
		s.log.Warn().Str("remote", r.RemoteAddr).Msg("the host did not answer a page request in time: 503")
	case <-r.Context().Done():
	case <-s.stopCh:
	}
	return contract.Command{}, false
}

// pageAnsweredLocked hands the host's command for page request id to its
// handler; false when id is no page request waiting.
func (s *Server) pageAnsweredLocked(cmd *contract.Command) bool {
	ch, ok := s.pages[cmd.Conn]
	if !ok {
		return false
	}
	delete(s.pages, cmd.Conn)
	ch <- *cmd // buffered, one command per request
	return true
}

// unauthorizedCSP is the 401 page's policy: no scripts, its own inline
// style only.
const unauthorizedCSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// unauthorizedPage is the 401 page; %s is the first paragraph.
const unauthorizedPage = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tether — access token needed</title>
<style>
body { font: 16px/1.5 system-ui, sans-serif; max-width: 40em; margin: 3em auto; padding: 0 1em; color: #222; }
code { background: #eee; padding: 0 .2em; }
</style>
</head>
<body>
<h1>Access token needed</h1>
<p>%s</p>
<p>Open the URL that <code>tether serve</code> printed when it started
(<code>http://HOST:PORT/?token=…</code>). This browser then keeps the token
in a cookie, so this address works without it afterwards.</p>
<p>Lost the URL? The token is kept in the file <code>&lt;state-dir&gt;/token</code>
(the host's <code>--state-dir</code>: by default <code>$XDG_STATE_HOME/tether</code>,
else <code>~/.local/state/tether</code>), and <code>tether serve</code> prints the
URL again when it starts.</p>
</body>
</html>
`

var (
	// unauthorizedMissing is the 401 page for a request with no token.
	unauthorizedMissing = []byte(strings.Replace(unauthorizedPage, "%s",
		"This tether server asks for its access token, and this request had none.", 1))
	// unauthorizedWrong is the 401 page for a request with a wrong token.
	unauthorizedWrong = []byte(strings.Replace(unauthorizedPage, "%s",
		"The access token this request carried is not one this server accepts: it is mistyped, "+
			"was revoked, or the server now uses another one (<code>--token</code>, <code>TETHER_TOKEN</code> or a new token file).", 1))
	// unauthorizedExpired is the 401 page for an expired credential.
	unauthorizedExpired = []byte(strings.Replace(unauthorizedPage, "%s",
		"The credential this request carried has expired: ask for a new link.", 1))
)

// unauthorizedProxyPage is the 401 page for a person a reverse proxy
// signed in whom the host does not let in (docs/PROTOCOL.md, section 18,
// "People from a reverse proxy"); %s is the first paragraph.
const unauthorizedProxyPage = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tether — not let in</title>
<style>
body { font: 16px/1.5 system-ui, sans-serif; max-width: 40em; margin: 3em auto; padding: 0 1em; color: #222; }
code { background: #eee; padding: 0 .2em; }
</style>
</head>
<body>
<h1>Not let in</h1>
<p>%s</p>
<p>Ask whoever runs this tether server.</p>
</body>
</html>
`

// The host's reasons for refusing a user its reverse proxy named, and
// the 401 page of each.
var unauthorizedProxy = map[string][]byte{
	"unknown user": []byte(strings.Replace(unauthorizedProxyPage, "%s",
		"You are signed in, but not as a user this server lets in: its <code>--auth-proxy-users</code> file does not list you.", 1)),
	"empty proxy user": []byte(strings.Replace(unauthorizedProxyPage, "%s",
		"The proxy in front of this server passed this request on without naming who you are.", 1)),
	"ambiguous proxy user": []byte(strings.Replace(unauthorizedProxyPage, "%s",
		"The proxy in front of this server named more than one user for this request.", 1)),
}

// refused answers a page request the host refused with code: the 401
// page for 4401 (saying whether a credential was given, or why a user
// named by a reverse proxy is not let in), 403 for a forbidden Host or
// Origin or a peer that is not loopback, else 503.
func refused(w http.ResponseWriter, r *http.Request, code int, reason string) {
	status, body := http.StatusServiceUnavailable, []byte(reason+"\n")
	switch code {
	case wire.CloseUnauthorized:
		status, body = http.StatusUnauthorized, unauthorizedWrong
		switch reason {
		case "no credential":
			body = unauthorizedMissing
		case "credential expired":
			body = unauthorizedExpired
		default:
			if b, ok := unauthorizedProxy[reason]; ok {
				body = b
			}
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="tether"`)
	case wire.CloseForbidden, wire.CloseNotLoopback:
		status, body = http.StatusForbidden, []byte("forbidden: "+reason+"\n")
	}
	h := w.Header()
	if status == http.StatusUnauthorized {
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Content-Security-Policy", unauthorizedCSP)
	} else {
		h.Set("Content-Type", "text/plain; charset=utf-8")
	}
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}
