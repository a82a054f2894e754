// Package ws is tether's WebSocket transport plugin, built on
// github.com/gobwas/ws. It owns the public HTTP listener, the WebSocket
// upgrade, framing, ping/pong and the per-connection send queues; the host
// decides everything else (access checks, routing) through the
// contract.Transport interface. A plugin binary's main is
//
//	contract.ServeTransport(ws.New(logger))
//
// # Endpoints
//
// GET /healthz answers 200 "ok". /api/ws, /api/pty and /acp are upgraded to
// WebSocket (the 101 of /acp carries an Acp-Connection-Id). Every other
// path goes to Server.Static when it is set, and is a plain 404 otherwise.
//
// A plain-TCP connection whose first request is an HTTP/1.1 GET upgrade
// of one of those three paths is upgraded on the raw connection by
// gobwas/ws's own parser, with no net/http request, response writer or
// hijack (what a reconnect storm is made of); its EventOpened is the same
// (path and query as sent, every header, the host, the peer). Every other
// connection — TLS, the page, /healthz, a head over 8 KiB, an upgrade after
// another request on a kept-alive connection — is served by net/http, with
// the bytes read to tell.
//
// # ACP over Streamable HTTP
//
// /acp without an upgrade is the ACP transports RFD's Streamable HTTP
// (docs/PROTOCOL.md, "ACP over Streamable HTTP"): an initialize POST opens
// one contract connection, reported with an EventOpened exactly as an
// upgrade of /acp (its headers, query, peer), so the host's access check
// applies unchanged; every later POST of that Acp-Connection-Id is an
// EventFrame, answered 202; what the host sends is routed to the
// connection's SSE streams (GET), per session; DELETE, or the host's
// Close, ends it with one EventClosed. Every request after the initialize
// must carry the same credential (Authorization, tether_* cookies,
// ?token=, and the reverse proxy's user header when the host's Admit
// names it: see contract.Command.Header) or it is refused with 401
// (none) or 403 (another): the connection id alone is no credential. Messages wait for their stream's
// GET up to SendQueue bytes per connection; past that the connection is
// closed with 1013. A connection with no stream open and no request for
// PeerTimeout is closed with 1006 "peer timeout"; at most
// MaxConnections of them are open (then an initialize is 503). Streams get a comment
// every Server.SSEKeepAlive (15 s). A session stream opened with
// Last-Event-ID: N sends the host a session/resume with
// _meta["tether/after"] = N (its answer swallowed) and sends every update
// after N once, in seq order, the SSE id of each being its tether seq.
//
// # The page
//
// tether's own ws plugin sets Static to package web's site: the browser
// page, with a terminal (xterm.js on /api/pty) and a chat view (sessions,
// streamed answers and permission requests on the JSON-RPC gateway,
// /api/ws), whose WebSockets both carry the browser's credential in the
// page cookie.
//
// With StartRequest.PageAuth (tether's host always sets it), the host
// decides every request for a page of Static — the path "/", or one
// ending in "/" or ".html": the transport reports it as an Opened event
// with Page set (path, query, headers, peer and Host, as for an
// upgrade), holds it until the host's one command for it (at most
// Server.PageAnswerTimeout, default 10 s, else HTTP 503), and then serves
// the page with the Admit's Header set on the response (the host's page
// cookie, tether_PORT: see docs/PROTOCOL.md, "The page and its cookie"),
// or answers the host's Close: 4401 with the 401 page that says what to
// do (open the URL `tether serve` printed; the token is in
// <state-dir>/token), 4403 and 4408 with 403, anything else with 503,
// setting nothing. The transport never sees a token it could check. The
// page's scripts, style sheets and licences stay public: they hold no
// secret, and a page that loaded can tell its user why its WebSocket was
// refused. Without PageAuth every path is public.
//
// # Connections and limits
//
// Every TCP connection the listener accepts counts until it is closed,
// upgraded or not, idle HTTP keep-alive connections included. At most
// StartRequest.MaxConnections (default 20000) are open; the next one is
// answered at once with HTTP 503 ("Connection: close", a one-line body
// that says why), after a TLS handshake under TLS, and closed once the
// client has read it (the transport waits up to a second, or the header
// timeout if shorter, for the client's close, for a quarter of the
// reserve below at a time, 16 to 256; past that a refused connection is
// closed at once, and its client may see a reset). Stats reports
// the open connections and the refusals since Start. The bound is lowered
// (with a warning at Start, and reported in StartResponse.MaxConnections)
// to stay below the process's file descriptor limit by a reserve of 1/32
// of it, at least 64: past the bound there are still descriptors to
// answer 503 with. Should accept still run out of descriptors (other
// files of the process), the listener gives up a spare descriptor it
// keeps to accept the waiting client and refuse it the same way, one at
// a time, instead of leaving clients in the kernel's backlog; without a
// spare, accept is retried after a pause that doubles up to a second, so
// it never spins.
//
// A connection whose request headers have not all arrived within
// StartRequest.HeaderTimeout (default 10 s) — for TLS, whose handshake
// and then headers — is closed without a response. An idle keep-alive
// connection is closed after PeerTimeout.
//
// # TLS
//
// With StartRequest.TLSCertFile and TLSKeyFile (PEM, both or neither) the
// listener serves HTTPS and WSS through crypto/tls: TLS 1.2 or later,
// HTTP/1.1 only (what a WebSocket upgrade needs); a plain HTTP request
// gets 400. The pair is read at Start (a pair that does not load fails
// Start with ErrInvalidArgument), so a fresh process — `tether plugins
// reload ws`, SIGHUP — serves a renewed certificate. A running one does
// too: a handshake looks at the files' modification times and sizes, at
// most once a second, and reads the pair again when they changed; a pair
// that does not load (one file renewed, not yet the other) is logged and
// the previous certificate kept.
//
// # Connections
//
// An upgraded connection gets the next connection id (1, 2, ...; never
// reused by a Server) and is reported with an EventOpened. Nothing is read
// from it until the host sends CommandAdmit; a CommandClose before that
// refuses it with the host's close code. A connection that is neither
// admitted nor closed within PeerTimeout is closed with 1013 ("admit
// timeout"), checked on the ping tick, so within PeerTimeout+PingInterval.
//
// After admission every complete data message is an EventFrame. The plugin
// closes a connection on its own only for protocol limits: a message larger
// than MaxMessage (1009; on /acp, ACPMaxMessage), invalid UTF-8 in a text
// message or close reason (1007), any other framing error (1002), a send
// queue over SendQueue bytes (1013; on /acp, SendQueue plus ACPMaxMessage). Exactly one EventClosed ends every connection, admitted or not;
// its code is the first close code of the connection: the one the server
// sent (host command, limit, Stop), else the one the peer sent (1005 for an
// empty close frame), else 1006 when the TCP connection ended without a
// close handshake.
//
// # Closing
//
// A close frame is written after the messages queued before it (except for
// limit violations and the echo of a peer's close, which drop the queue).
// A host close code that may not appear in a close frame (0 means 1000;
// 1005, 1006, 1015 and unassigned codes) is sent and reported as 1011. The
// server then half-closes TCP and waits up to the close grace — one second,
// or PeerTimeout if that is shorter — for the peer's close frame before it
// closes the socket. After a framing error the stream cannot be parsed any
// more, so the server discards input until the peer closes TCP or the
// grace ends. Stop gives plain HTTP requests the grace to finish, then
// bounds every connection's close handshake, queued messages included, by
// the grace (or its ctx, if that ends sooner); a peer still not done is cut.
//
// # Liveness
//
// One ticker goroutine pings every admitted connection every PingInterval.
// Every read from a socket is given a deadline of PeerTimeout, so any frame
// from the peer (pongs included) keeps the connection alive. A peer silent
// for PeerTimeout is presumed dead: the server writes nothing more to it
// (a close frame could only sit behind a full send buffer), closes the
// socket, and reports EventClosed with 1006 and reason "peer timeout".
//
// # Sending
//
// CommandSend copies the payload into the connection's queue; Exec never
// blocks on a peer. SendQueue bounds the payload bytes not yet handed to
// the kernel, so a peer that stops reading trips it once the socket buffers
// are full, and so does a single burst larger than SendQueue. A writer
// goroutine is started when the queue becomes non-empty and exits when it
// is drained, writing up to 32 queued messages per writev. Pings and pongs
// go out before queued data; data messages are never fragmented.
//
// # Events
//
// Events go through a transportkit.Queue (the transport kit of package
// contract, which examples/unixsock uses too). They are queued in order
// and delivered by Link, which calls the sink
// with everything pending at once, so events batch while the sink is busy.
// Events that arrive with no link running stay queued and are delivered
// when a link starts; a batch the sink rejects is kept and delivered first
// to the next link (so a sink that failed half-way sees some events twice).
// The queue is bounded by Server.EventBuffer bytes — payload plus about
// 200 bytes per event; default 16 MiB, always room for one message: a
// reader that would exceed it waits, which stops reading that socket and
// lets TCP push back on the peer. Opened and Closed events are never held
// back (their number is bounded by the open connections).
//
// # Cost of an idle socket
//
// An admitted idle connection holds about 1 KiB of heap (its net.Conn in
// the 24-byte wrapper that counts it under MaxConnections, the conn
// struct of 240 bytes and its wsutil.Reader-based frame reader of 330
// bytes) and one reader goroutine blocked in Read, whose stack is about
// 4 KiB once it has read frames: about 5 KiB in all (BenchmarkIdleConn
// measures it). It holds no read or write buffer: the handshake's bufio
// buffers are released after the upgrade, a message buffer exists only
// while a message is read, and no writer goroutine runs while the queue is
// empty. A pending (not yet admitted) connection has no goroutine at all.
// Going much lower would take readiness notification (netpoll) instead of a
// blocked reader goroutine.
//
// # Locking
//
// Lock order: Server.mu before the event queue's lock
// (transportkit.Queue's, always taken last); conn.mu before the queue's.
// Server.mu and a conn.mu are never held together; an hconn.mu (an /acp
// connection over HTTP) is a leaf, never held with Server.mu or the
// queue's. No lock is held across
// socket I/O, a channel send that can block, or a call to the sink.
package ws
