// Package web is the browser page that the ws transport serves at "/": a
// terminal and a chat view, as an embedded static site (index.html, app.js
// for the terminal, chat.js for the chat, app.css) plus xterm.js
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
// Handler checks no credential: the host does, for every page request
// the ws transport reports (see plugins/ws, "The page"), and signs a
// browser that came with ?token= in with the HttpOnly page cookie
// tether_PORT; the page's scripts, style sheets and licences are public.
//
// # The page
//
// The page opens one WebSocket to /api/pty (see docs/PROTOCOL.md) and
// shows it in a full-window xterm.js terminal with a status bar; the
// status bar's Terminal and Chat tabs switch to the chat view (see "The
// chat view"), which opens a WebSocket of its own to /api/ws. It never
// reads the access token: the browser sends the page cookie with
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
//	              retried forever, with a countdown to the next try, a
//	              "Reconnect now" button, and at once when the tab becomes
//	              visible or the browser goes online. After k failed
//	              tries the next waits a delay drawn uniformly from
//	              [0, min(10 s, 0.25 s·2^k)) ("full jitter"): the many
//	              tabs a host restart drops at once come back spread over
//	              that window, not within milliseconds of each other. The
//	              status names the close that started the outage (e.g.
//	              1001), not the last failed try.
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
// The terminal is drawn by xterm.js's DOM renderer, which clips each row
// to its cells; a cell is as tall as the font's ascent plus descent, each
// rounded to whole pixels by the browser. DejaVu Sans Mono, the usual
// Linux monospace font, draws "_" at the very bottom of its descent, so
// where the descent rounds down (14 px: 3.3 px to 3) the underscore fell
// one pixel row below its cell and vanished (at 10, 14, 19 and 23 px on a
// display of device pixel ratio 1). The page gives xterm.js a lineHeight
// of 1.1, so the cell has room below the descent (17 pixels at 14 px
// instead of 16) and an underscore is drawn at every size.
//
// # The chat view
//
// The chat view drives agent sessions through the JSON-RPC gateway on
// /api/ws (docs/PROTOCOL.md), on a WebSocket it opens the first time the
// view is shown and keeps from then on. The terminal keeps its PTY, its
// socket and its screen meanwhile: it stays laid out under the chat,
// invisible and out of the focus order, so nothing is refitted on the way
// back. The terminal's keyboard shortcuts are off in the chat view (Ctrl+=
// is the browser's zoom there). sessionStorage "tether.tab.view" keeps
// the tab's view across a reload, localStorage "tether.view" is the one a
// new tab shows.
//
// The side bar lists the stored sessions (session.list, its 100 newest,
// and session.active_list for the live ones): title, when it was last
// active, message count, and "working…" for one with a run in flight.
// Most recently active first: last activity is session.list's
// last_active (the latest start or end of the session or of one of its
// runs), or the live session's last_active when that is later; ties keep
// session.list's order. A stored session is listed when it has a message
// of its own, a run in flight, or is the chat this tab has open: one made
// and never prompted (a New chat on another client, a bare ACP
// session/new) has nothing to show and is left out until its first
// prompt. A session made with no title is named by the host after its
// first prompt, and the list (and the open chat's header) shows that
// title once it has it. While the chat view is seen (the view shown and
// the tab visible) the list is kept current: asked for when the view is
// shown, the tab becomes visible or the socket is back, 0.3 s after a run
// of a chat this socket views starts or ends, and 5 s after each answer,
// so chats made or prompted by other clients appear by themselves; one
// request at a time, asks made meanwhile become one more after it, and
// none while the view is not seen. "New chat" opens an empty chat that is
// created (session.create, titled with the first line of its first
// prompt) only when that prompt is sent. Choosing a chat resumes it by
// its stored key (session.resume) and draws it from the snapshot: its
// messages, the answer in flight so far and the open permission
// requests; then from the session's journal (session.events.since from
// 0) and session.runs what the text leaves out, as it was shown live: each
// run's tool calls in its answer's row, each failed run's reason under
// its answer, and in the header how the last run ended (the runs are the
// last rows of the snapshot, a prompt and an answer each, matched by
// run_id to the journal's message.start; live events wait meanwhile, then
// apply). A journal pruned of its first events shows what it still has;
// permission requests of past runs are not drawn again (their tool call
// line is). A chat with more than 512 KiB of text, or one whose journal
// answer was too large for the socket (closed with 1013; not asked again
// in that tab), is drawn from its snapshot alone. sessionStorage
// "tether.tab.chat" keeps the stored key of the tab's chat across a
// reload, localStorage "tether.chat" is the one a new tab opens.
//
// A share link of a chat (tether share session KEY) carries ?session=KEY:
// the page opens that chat in the chat view and takes the key (and
// view=1) off the address, as it does the token. What the credential may
// do comes from gateway.ready's identity: one that reaches the chat only
// as session:KEY:view makes it read-only — no prompt box (its placeholder
// and the status line say read-only), no Stop, no permission buttons (a
// pending request says it waits for an answer) — and one with neither
// admin nor new has no New chat. A 4030 is shown as "this link does not
// allow that"; a revoked or expired link's close says so and is not
// retried.
//
// Each answer streams into its row as message.delta events arrive, one
// text node per delta, and message.complete settles it (its text wins
// should it differ from the deltas). The header says idle, working…,
// stopped, or failed with the run's reason. The prompt box takes Enter to
// send and Shift+Enter for a new line, and is disabled, with Send, while a
// run is in flight or the socket is away; Stop sends session.interrupt.
// Tool calls of an ACP agent (acp.update tool_call and tool_call_update)
// are one line each in the answer's row: title and status. A run that
// fails says why in a line under its answer ("Failed: " and
// message.complete's reason); one that ended with a stop reason other
// than end_turn or cancelled names it ("Ended: stop reason …"). A
// permission.request is a card with one button per option and Cancel;
// a button sends permission.respond (Cancel with option_id null). When
// permission.resolved arrives the card keeps the option chosen and says
// who answered: "answered here" when this tab's permission.respond
// succeeded, else "answered by another client" with who answered (the
// credential's name) and through which transport, or that the run ended
// before an answer. All text is
// inserted as text, never as HTML.
//
// The chat's socket reconnects like the terminal's (the same fully
// jittered backoff and countdown; a close from 4000 up is a refusal, not
// retried). The page keeps, for the open chat, its epoch and the highest
// seq it has applied. Back on a new socket it resumes the chat by its
// stored key; when the snapshot has the same epoch it asks
// session.events.since for the events after that seq and applies them to
// what it shows, holding back the live events that come meanwhile, then
// applies those; each seq is applied once and in order. A changed epoch, a
// truncated answer or a gap in the seqs redraws from a snapshot instead.
// A reload has nothing drawn, so it draws from the snapshot.
//
// The page exposes window.tether = {term, state(), offset(), epoch(),
// attach(), terminals(), replay(), retry(), retries(), backoffDelay(),
// chat} for tests: replay() is the last pty.replay header; retry() is
// the retry scheduled now ({attempt, delay, bound, at}, at in ms since
// the epoch) or null, retries() the last 64 scheduled, and
// backoffDelay(k, r) the delay after k failed tries for r in [0, 1);
// chat is {state(), view(), session(), catchUp(), retry(), retries(),
// backoffDelay(), listRefreshes()}: the chat socket's state (also
// document.body.dataset.chat), the view, the open chat's key, runtime
// id, epoch, seq and run state, the last session.events.since catch-up
// (last_seen, the number of events, latest_seq), its socket's retries as
// the terminal's, and how many list answers it has drawn. Each list entry
// has data-key (the stored key) and data-last-active (Unix seconds).
package web
