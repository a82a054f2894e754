package ws

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// TokenCookie is the cookie that carries the access token: set by a page
// request with a good ?token=, sent by the browser with every request of
// the page's origin, its WebSocket upgrades included (the host accepts
// the token from it as from ?token=).
const TokenCookie = "tether_token"

// gated reports whether a Static path is a page, which needs the token.
// The other files (scripts, style sheets, licences) stay public: they
// hold no secret, and a page that loaded can then tell its user why its
// WebSocket was refused, e.g. when cookies are blocked.
func gated(path string) bool {
	return path == "/" || strings.HasSuffix(path, "/") || strings.HasSuffix(path, ".html")
}

// credential is what a request presented for the page.
type credential uint8

const (
	credNone  credential = iota // no token at all
	credWrong                   // a token, not the right one
	credGood                    // the right token
)

// pageCredential checks the token a page request carries against want
// (the token's SHA-256), in constant time. An explicit ?token= decides
// alone (a wrong one is not rescued by a good cookie: its user should
// learn that the URL is stale); else Authorization: Bearer, else the
// tether_token cookie. It returns the good ?token= to keep in the cookie.
func pageCredential(r *http.Request, want *[sha256.Size]byte) (credential, string) {
	match := func(got string) bool {
		sum := sha256.Sum256([]byte(got))
		return got != "" && subtle.ConstantTimeCompare(sum[:], want[:]) == 1
	}
	verdict := func(ok bool) credential {
		if ok {
			return credGood
		}
		return credWrong
	}
	if toks, ok := r.URL.Query()["token"]; ok {
		good := ""
		for _, t := range toks {
			if match(t) {
				good = t
			}
		}
		return verdict(good != ""), good
	}
	if auth := r.Header.Values("Authorization"); len(auth) > 0 {
		ok := false
		for _, h := range auth {
			if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
				ok = match(strings.TrimSpace(h[7:])) || ok
			}
		}
		return verdict(ok), ""
	}
	found, ok := false, false
	for _, c := range r.CookiesNamed(TokenCookie) {
		found = true
		ok = match(c.Value) || ok
	}
	if !found {
		return credNone, ""
	}
	return verdict(ok), ""
}

// serveStatic serves Static. With a page token hash, a page is served
// only to a request with the token (and a good ?token= is kept in the
// cookie); every other page request gets the 401 page. Without one (a
// host that does not send it checks the token of every upgrade itself),
// everything is public and a ?token= is only carried into the cookie, as
// the page used to carry it in its own storage.
func (s *Server) serveStatic(w http.ResponseWriter, r *http.Request, cfg *config) {
	if !cfg.pageGate {
		if tok := r.URL.Query().Get("token"); tok != "" && gated(r.URL.Path) {
			s.setTokenCookie(w, r, tok)
		}
		s.Static.ServeHTTP(w, r)
		return
	}
	if gated(r.URL.Path) {
		cred, tok := pageCredential(r, &cfg.pageToken)
		if cred != credGood {
			s.log.Debug().Str("remote", r.RemoteAddr).Bool("token_given", cred == credWrong).Msg("page refused: 401")
			unauthorized(w, r, cred)
			return
		}
		if tok != "" {
			s.setTokenCookie(w, r, tok)
		}
	}
	s.Static.ServeHTTP(w, r)
}

// tokenCookieMaxAge is the cookie's lifetime in seconds: 400 days, the
// longest browsers keep one.
const tokenCookieMaxAge = 400 * 24 * 3600

// setTokenCookie sets the tether_token cookie to tok: HttpOnly (no script
// reads it), SameSite=Strict (no other site's page sends it), Path=/ (the
// page and /api/...), Secure under TLS. It lasts tokenCookieMaxAge, like
// the token file it mirrors, so a bookmark of the bare URL still works in a
// later browser session.
func (s *Server) setTokenCookie(w http.ResponseWriter, r *http.Request, tok string) {
	c := &http.Cookie{
		Name:     TokenCookie,
		Value:    tok,
		Path:     "/",
		MaxAge:   tokenCookieMaxAge,
		HttpOnly: true,
		SameSite: http.SameSiteStrictMode,
		Secure:   r.TLS != nil,
	}
	if err := c.Valid(); err != nil {
		// Never log the token itself.
		s.log.Warn().Msg("the access token has characters a cookie cannot carry (use letters, digits and -._~): the page cannot stay signed in")
		return
	}
	http.SetCookie(w, c)
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
(by default <code>~/.local/state/tether/token</code>), and <code>tether serve</code>
prints the URL again when it starts.</p>
</body>
</html>
`

var (
	// unauthorizedMissing is the 401 page for a request with no token.
	unauthorizedMissing = []byte(strings.Replace(unauthorizedPage, "%s",
		"This tether server asks for its access token, and this request had none.", 1))
	// unauthorizedWrong is the 401 page for a request with a wrong token.
	unauthorizedWrong = []byte(strings.Replace(unauthorizedPage, "%s",
		"The access token this request carried is not this server's token: it is mistyped, "+
			"or the server now uses another one (<code>--token</code>, <code>TETHER_TOKEN</code> or a new token file).", 1))
)

// unauthorized answers the 401 page. It sets no cookie.
func unauthorized(w http.ResponseWriter, r *http.Request, cred credential) {
	body := unauthorizedMissing
	if cred == credWrong {
		body = unauthorizedWrong
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", unauthorizedCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("WWW-Authenticate", `Bearer realm="tether"`)
	w.WriteHeader(http.StatusUnauthorized)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}
