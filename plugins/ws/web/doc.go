// Package web is the browser terminal page that the ws transport serves at
// "/": an embedded static site (index.html, app.js, app.css) plus xterm.js
// and its fit, web-links and search addons, vendored as built files with
// their licences under static/vendor (see
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
// and from the history, and drops what older pages kept in
// sessionStorage (the access token, cursors).
//
// # Attaching and restoring the screen
//
// A page load or reload has an empty screen, so it attaches without a
// cursor and gets a screen snapshot: the page resets xterm.js, resizes it
// to the snapshot's cols×rows (the PTY's size, for which the snapshot was
// drawn, so every line wraps and every cursor move lands as on the
// terminal it was taken from), writes the snapshot's bytes, and only then
// fits the terminal to the window and sends its size; a program that
// cares redraws on the SIGWINCH, and xterm.js reflows the normal screen.
// Fitting first would draw the snapshot on a grid of another size and
// garble it. Snapshot bytes do not count towards the offset; every byte
// after them does. An open page that lost its socket keeps its screen and
// reattaches with its offset and epoch, and gets the raw bytes it missed.
// A backend that sends a reset without a snapshot gets its raw replay
// written after a reset.
//
// Replayed bytes (a snapshot or a raw replay) can hold terminal queries
// (device attributes, cursor position, colours, modes) that xterm.js
// answers. Those answers never reach the PTY: the page takes input
// (xterm.js disableStdin off, onData forwarded) only in the state
// connected, and turns connected in the write callback of the last
// replayed byte, which xterm.js calls after parsing that chunk and before
// parsing the next. Live output's queries are answered: the program is
// asking the live terminal. Keys typed while the screen is restored are
// not sent (the restore takes milliseconds; the status bar says so).
//
// # States
//
// document.body.dataset.state is one of
//
//	connecting    the first connect, or one the user asked for, until the
//	              screen is restored
//	connected     the screen is restored; output flows, input is sent
//	reconnecting  lost (1001 host restarting, 1006 connection lost, 1012
//	              terminal service restarting, 1013 too slow, 1011 other
//	              than "registry full", or any close not listed below);
//	              retried forever after 0.25 s, doubling to at most 10 s
//	              (plus up to 20% jitter), with a countdown, a "Reconnect
//	              now" button, and at once when the tab becomes visible or
//	              the browser goes online. The status names the close that
//	              started the outage (e.g. 1001), not the last failed try.
//	superseded    4409: another tab took the terminal; Take it back
//	              reattaches with the cursor
//	ended         4410: the shell exited; Start a new shell attaches the
//	              same token again (the host starts a new shell)
//	error         4400, 4401, 4403, 4404, 4408, 4411, or 1011 "registry
//	              full": no automatic retry
//
// and document.body.dataset.closeCode is the code of the last close. In
// every state but connected the terminal is dimmed, an overlay says why
// (its text stays selectable), xterm.js takes no input, and a key pressed
// says "not sent" instead of vanishing.
//
// # Terminals
//
// Each terminal is an attach token, a random 128-bit base64url string.
// localStorage "tether.attach" is the current terminal's token (the one a
// new tab opens); sessionStorage keeps each tab's own, so a reload stays
// on the tab's terminal. ?attach= in the page URL adopts a given token.
// localStorage "tether.terminals" lists this browser's terminals (token,
// title, start, last use, epoch); New terminal adds one and keeps the
// others, the Terminals menu switches to any of them or closes one. No
// token is dropped without the user asking. Closing a terminal asks
// first: the page has no way to end a shell by itself (the protocol ends
// a PTY only when its program exits or its TTL runs out), so the dialog
// says the shell keeps running until it has been detached for --pty-ttl
// and shows the token for tether attach; "Forget" drops it from the list,
// and for the terminal the tab shows, "Type exit and close" types Ctrl-E,
// Ctrl-U, "exit" and Enter into it and forgets it once the shell has
// ended (4410), or says it did not end within 5 s. A terminal whose shell
// ended is closed without the question.
//
// # Tools
//
// Links (http and https) are underlined on hover and open on click in a
// new tab without an opener (addon web-links). Ctrl+Shift+C copies the
// selection, Ctrl+Shift+V pastes (the browser's paste), and "copy on
// select" copies each selection when the mouse button goes up. Ctrl+Shift+F
// opens the search (addon search: Enter and Shift+Enter step through the
// matches, all highlighted, Esc closes). Ctrl+= and Ctrl+- change the font
// size, Ctrl+0 restores 14 px; the status bar has buttons for each, and
// the size and the copy-on-select choice are kept in localStorage.
//
// The page exposes window.tether = {term, state(), offset(), epoch(),
// attach(), terminals(), replay()} for tests: replay() is the last
// pty.replay header.
package web
