// Package web is the browser terminal page that the ws transport serves at
// "/": an embedded static site (index.html, app.js, app.css) plus xterm.js
// and its fit addon, vendored as built files under static/vendor (see
// static/vendor/README.md for the versions and how to update them). Nothing
// is fetched from a CDN and nothing is built at run time.
//
// Handler serves exactly the embedded files, GET and HEAD only; every other
// path is 404 and there are no directory listings. Every response carries
// an ETag and "Cache-Control: no-cache" (the file names are not
// fingerprinted, so a browser revalidates and gets a 304 while the binary is
// unchanged), "X-Content-Type-Options: nosniff" and "Referrer-Policy:
// no-referrer" (the page's first URL carries the access token). The page
// itself also gets a Content-Security-Policy that allows only its own
// scripts and same-origin connections, and refuses framing.
//
// Handler checks no access token: the ws transport that serves it does
// (see plugins/ws, "The page"). It answers the page only to a request
// that carries the token and keeps a ?token= in the HttpOnly cookie
// tether_token; the page's scripts, style sheets and licences are public.
//
// # The page
//
// The page opens one WebSocket to /api/pty (see docs/PROTOCOL.md) and
// shows it in a full-window xterm.js terminal with a status bar. It never
// reads the access token: the browser sends the tether_token cookie with
// the page's WebSocket upgrades (same origin), so the WebSocket URLs carry
// none, and a reload, a second tab or a bookmark of the bare URL stays
// signed in. The page removes ?token= (and ?attach=) from the visible URL
// and from the history, and drops the token older pages kept in
// sessionStorage. The attach token is a random 128-bit
// base64url string kept in localStorage under "tether.attach" (so every tab
// of the browser shares one terminal; ?attach= in the page URL adopts a
// given token); "New terminal" replaces it. The page counts the bytes it
// has received and reattaches with offset and epoch after a drop, so it sees
// every byte once. A freshly loaded page has an empty screen, so it asks
// for the whole replay window (offset 0 with the epoch it saved in
// sessionStorage, which the server answers with the full window).
//
// document.body.dataset.state is one of
//
//	connecting    the first connect, or one the user asked for
//	connected     pty.replay received; output flows
//	reconnecting  lost (1001, 1006, 1012, 1013 or any unclean close);
//	              retrying after 250, 500, 1000, 2000, 3000 ms
//	superseded    4409: another tab took the terminal; Reconnect takes it back
//	ended         4410: the process exited; Restart starts a new terminal
//	error         any other close (4400, 4401, 4403, 4404, 4408, 1011, ...)
//	              or the retries ran out; no automatic retry
//
// and document.body.dataset.closeCode is the code of the last close. The
// page exposes window.tether = {term, state(), offset(), epoch(), attach()}
// for tests.
package web
