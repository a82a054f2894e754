package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	"golang.org/x/term"
)

// tether attach joins a keep-alive PTY of a running host (SPEC §2, §6.1)
// from the local terminal:
//
//	tether attach [--view] [--url U] [--token T] ATTACH_TOKEN
//	tether attach [--view] [--url U] [--token T] --new
//
// Output is written to stdout byte for byte; stdin, in raw mode when it is
// a terminal, is sent as input. The client counts the bytes it has
// written and, when the connection drops (1001, 1006, 1012, 1013, a
// network error or a silent peer), reattaches with that offset and the
// PTY's epoch, so every byte still in the host's ring is shown exactly
// once. It gives up after a minute without a connection.
//
// Ways out: the PTY's process exits (4410, status 0); another writer
// takes the PTY (4409, status 1); the host refuses the socket (4400,
// 4401, 4403, 4404, 4408, 1011: status 1); the escape sequence Enter ~ .
// typed at the start of a line (status 0; "~~" sends one "~"), like ssh;
// or the process ending (SIGINT, SIGTERM, SIGHUP: closing the terminal or
// kill). Ctrl-C, Ctrl-\ and Ctrl-Z are sent to the PTY like any other
// byte. Input that arrives while (re)connecting is held (up to
// attachMaxPending bytes, the rest dropped) and sent once attached.

// Timings of tether attach.
const (
	attachDialTimeout  = 10 * time.Second // one dial and handshake
	attachRetryFor     = time.Minute      // reconnect this long, then give up
	attachPingEvery    = 15 * time.Second // client pings; a read times out after 3×
	attachWriteTimeout = 10 * time.Second // one frame write
	attachCloseWait    = time.Second      // wait for the host's close reply
	attachMaxText      = 64 << 10         // longest text message accepted
	attachMaxPending   = 64 << 10         // input held while not attached
)

// attachBackoff is the wait before each reconnect attempt; the last step
// repeats until attachRetryFor has passed.
var attachBackoff = []time.Duration{
	250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second,
}

// attachTokenRE is the form of an attach token (SPEC §6).
var attachTokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)

var (
	// errDetached means the user typed the escape sequence ~. to detach.
	errDetached = errors.New("detached")
	// errStdout means writing the terminal stream to stdout failed.
	errStdout = errors.New("writing to stdout")
	// errProtocol means the host did not speak the /api/pty protocol.
	errProtocol = errors.New("protocol error")
)

// attach is "tether attach".
func attach(args []string) int {
	a, code := parseAttach(args, os.Stderr)
	if a == nil {
		return code
	}
	a.stderr = os.Stderr
	return runTerminal(context.Background(), a, os.Stdin, os.Stdout)
}

// parseAttach turns the command line into a client, or returns nil and
// the exit status after saying why on stderr. With --new it prints the
// fresh token as "tether: attach token T".
func parseAttach(args []string, stderr io.Writer) (*attachClient, int) {
	fs := flag.NewFlagSet("tether attach", flag.ContinueOnError)
	fs.SetOutput(stderr)
	base := fs.String("url", "http://127.0.0.1:7717", "URL of the running host")
	token := fs.String("token", "", "access token of the running host (also taken from a ?token= in --url)")
	view := fs.Bool("view", false, "watch only: send no input and no resizes")
	fresh := fs.Bool("new", false, "generate a fresh attach token, print it on stderr and use it")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: tether attach [--view] [--url U] [--token T] ATTACH_TOKEN
       tether attach [--view] [--url U] [--token T] --new

Joins the PTY of ATTACH_TOKEN (16-128 characters of A-Z a-z 0-9 _ -),
starting it if it does not exist. Type Enter ~ . to detach.

flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0
		}
		fmt.Fprintln(stderr, "tether attach:", err)
		return nil, 2
	}
	endpoint, urlToken, err := ptyEndpoint(*base)
	if err != nil {
		fmt.Fprintln(stderr, "tether attach:", err)
		return nil, 2
	}
	if *token == "" {
		*token = urlToken
	}
	rest := fs.Args()
	var tok string
	switch {
	case *fresh && len(rest) > 0:
		fmt.Fprintln(stderr, "tether attach: --new takes no attach token")
		return nil, 2
	case *fresh:
		tok = newAttachToken()
		fmt.Fprintf(stderr, "tether: attach token %s\n", tok)
	case len(rest) == 0:
		fs.Usage()
		return nil, 2
	case len(rest) > 1:
		fmt.Fprintln(stderr, "tether attach: want one attach token, after the flags")
		return nil, 2
	default:
		tok = rest[0]
		if !attachTokenRE.MatchString(tok) {
			fmt.Fprintln(stderr, "tether attach: invalid attach token: want 16-128 characters of A-Z a-z 0-9 _ -")
			return nil, 2
		}
	}
	return newAttachClient(endpoint, *token, tok, *view), 0
}

// newAttachToken returns 128 random bits in hex. Hex, not base64url, so a
// token never starts with "-" and reads as a flag.
func newAttachToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// ptyEndpoint turns --url into the ws(s):// URL of /api/pty (any path
// of base kept as a prefix), and returns a ?token= it carried: the URL
// tether serve prints works as --url.
func ptyEndpoint(base string) (*url.URL, string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, "", fmt.Errorf("--url %q: %w", base, err)
	}
	switch u.Scheme {
	case "http", "ws":
		u.Scheme = "ws"
	case "https", "wss":
		u.Scheme = "wss"
	default:
		return nil, "", fmt.Errorf("--url %q: want http(s)://host:port", base)
	}
	if u.Host == "" {
		return nil, "", fmt.Errorf("--url %q: no host", base)
	}
	token := u.Query().Get("token")
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/pty"
	u.RawPath, u.RawQuery, u.Fragment, u.User = "", "", "", nil
	return u, token, nil
}

// attachClient is one PTY attachment that outlives dropped connections.
// It knows nothing of terminals: runTerminal sets raw mode and feeds it
// sizes and SIGWINCH. Its fields are set before run, which is called
// once.
type attachClient struct {
	endpoint *url.URL // ws(s)://host:port/api/pty
	token    string   // access token; "" sends none
	attach   string   // attach token
	view     bool     // view=1: never send input or resizes

	stdin  io.Reader // nil: no input
	stdout io.Writer // the terminal stream, nothing else
	stderr io.Writer // status lines
	raw    bool      // the terminal is in raw mode: status lines need \r\n

	// size reports the terminal size; nil, or ok false, sends no resize.
	size func() (cols, rows int, ok bool)
	// winch delivers a value whenever the size may have changed.
	winch <-chan os.Signal

	backoff      []time.Duration // see attachBackoff
	retryFor     time.Duration
	dialTimeout  time.Duration
	pingEvery    time.Duration // 0: no client pings and no read timeout
	writeTimeout time.Duration
	closeWait    time.Duration

	// The fields below are owned by run (the cursor is written by a
	// connection's reader, and read only after that reader has ended).
	in      <-chan []byte // stdin chunks; nil once stdin has ended
	esc     escaper
	pending []byte // input to send once attached
	epoch   string
	offset  int64 // bytes of output received, counted from the PTY's start
	cursor  bool  // epoch and offset are known: reattach with them
}

func newAttachClient(endpoint *url.URL, token, attach string, view bool) *attachClient {
	return &attachClient{
		endpoint:     endpoint,
		token:        token,
		attach:       attach,
		view:         view,
		stdout:       io.Discard,
		stderr:       io.Discard,
		backoff:      attachBackoff,
		retryFor:     attachRetryFor,
		dialTimeout:  attachDialTimeout,
		pingEvery:    attachPingEvery,
		writeTimeout: attachWriteTimeout,
		closeWait:    attachCloseWait,
	}
}

// wsURL is the URL of the next attempt, with the cursor once known.
func (a *attachClient) wsURL() string {
	q := url.Values{}
	q.Set("attach", a.attach)
	if a.token != "" {
		q.Set("token", a.token)
	}
	if a.view {
		q.Set("view", "1")
	}
	if a.cursor {
		q.Set("offset", strconv.FormatInt(a.offset, 10))
		q.Set("epoch", a.epoch)
	}
	u := *a.endpoint
	u.RawQuery = q.Encode()
	return u.String()
}

// say writes one status line to stderr, on a line of its own.
func (a *attachClient) say(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if a.raw {
		fmt.Fprint(a.stderr, "\r\n"+msg+"\r\n")
		return
	}
	fmt.Fprintln(a.stderr, msg)
}

// run attaches, reattaches after drops, and returns the exit status once
// the attachment is over. When ctx is cancelled it detaches politely and
// returns 1 without a message.
//
// The goroutine reading stdin is the one run does not wait for: a
// blocked Read cannot be interrupted portably. It ends when stdin fails
// or, blocked, with the process; tests close their pipe.
func (a *attachClient) run(ctx context.Context) int {
	done := make(chan struct{})
	defer close(done)
	if a.stdin != nil {
		in := make(chan []byte)
		a.in = in
		go readInput(a.stdin, in, done)
	}
	a.esc = escaper{lineStart: true}

	var (
		lostAt    time.Time // start of the current outage; zero while connected
		step      int       // next backoff step
		connected bool      // a dial has succeeded once
	)
	for attempt := 0; ; attempt++ {
		res := a.connect(ctx, attempt > 0)
		if code, msg, final := a.verdict(ctx, res.err); final {
			if msg != "" {
				a.say("%s", msg)
			}
			return code
		}
		if !res.dialed && !connected {
			a.say("tether: cannot attach at %s: %v", a.endpoint.Host, res.err)
			return 1
		}
		connected = connected || res.dialed
		if res.replayed {
			lostAt, step = time.Time{}, 0
		}
		if lostAt.IsZero() {
			lostAt = time.Now()
			a.say("tether: connection lost, reconnecting…")
		}
		if time.Since(lostAt) >= a.retryFor {
			a.say("tether: gave up reconnecting after %v: %v", a.retryFor, res.err)
			return 1
		}
		wait := a.backoff[min(step, len(a.backoff)-1)]
		step++
		if err := a.pause(ctx, wait); err != nil {
			code, msg, _ := a.verdict(ctx, err)
			if msg != "" {
				a.say("%s", msg)
			}
			return code
		}
	}
}

// verdict decides what an attachment's end means: final with an exit
// status and a message, or not final (reconnect).
func (a *attachClient) verdict(ctx context.Context, err error) (code int, msg string, final bool) {
	switch {
	case errors.Is(err, errDetached):
		return 0, "tether: detached", true
	case ctx.Err() != nil:
		return 1, "", true
	case errors.Is(err, errStdout), errors.Is(err, errProtocol):
		return 1, "tether: " + err.Error(), true
	}
	var ce wsutil.ClosedError
	if errors.As(err, &ce) {
		return closeVerdict(ce.Code, ce.Reason)
	}
	return 0, "", false
}

// closeVerdict maps a close code from the host to an exit status and a
// message, or to a reconnect (final false).
func closeVerdict(code ws.StatusCode, reason string) (int, string, bool) {
	var why string
	switch code {
	case ws.StatusGoingAway, ws.StatusAbnormalClosure, 1012, 1013:
		return 0, "", false // host restarting, connection lost, too slow: reattach
	case 4409:
		return 1, "tether: detached: the terminal was opened elsewhere (4409)", true
	case 4410:
		return 0, "tether: session ended (4410)", true
	case ws.StatusNormalClosure:
		return 0, "tether: the host closed the connection (1000)", true
	case 4400:
		why = "refused: malformed attach token or offset"
	case 4401:
		why = "refused: missing or wrong access token (--token, TETHER_TOKEN)"
	case 4403:
		why = "refused: Host or Origin not allowed"
	case 4404:
		why = "refused: the PTY endpoint is switched off"
	case 4408:
		why = "refused: the host accepts loopback clients only"
	case ws.StatusInternalServerError:
		why = "host error"
	default:
		why = "connection closed by the host"
	}
	if reason != "" {
		why += ": " + reason
	}
	return 1, fmt.Sprintf("tether: %s (%d)", why, code), true
}

// readInput sends r's bytes to in, chunk by chunk, until r fails (then
// it closes in) or done is closed.
func readInput(r io.Reader, in chan<- []byte, done <-chan struct{}) {
	defer close(in)
	for {
		buf := make([]byte, 4096)
		n, err := r.Read(buf)
		if n > 0 {
			select {
			case in <- buf[:n]:
			case <-done:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// idleInput takes a chunk of input that arrives while not attached: it
// is held for the next attachment.
func (a *attachClient) idleInput(b []byte, ok bool) error {
	if !ok {
		a.in = nil
		return nil
	}
	out, detach := a.esc.feed(b)
	if !a.view {
		a.pending = append(a.pending, out[:min(len(out), attachMaxPending-len(a.pending))]...)
	}
	if detach {
		return errDetached
	}
	return nil
}

// pause waits d, watching for the escape sequence and ctx.
func (a *attachClient) pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case b, ok := <-a.in:
			if err := a.idleInput(b, ok); err != nil {
				return err
			}
		}
	}
}

// connResult is how one connection went.
type connResult struct {
	dialed   bool  // the WebSocket handshake succeeded
	replayed bool  // the host sent pty.replay: the attachment was made
	err      error // why it ended; never nil
}

// dial connects and upgrades, watching for the escape sequence meanwhile.
func (a *attachClient) dial(ctx context.Context) (net.Conn, *bufio.Reader, error) {
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type dialed struct {
		conn net.Conn
		br   *bufio.Reader
		err  error
	}
	ch := make(chan dialed, 1)
	target := a.wsURL()
	go func() {
		conn, br, _, err := ws.Dialer{Timeout: a.dialTimeout}.Dial(dctx, target)
		ch <- dialed{conn, br, err}
	}()
	for {
		select {
		case d := <-ch:
			if d.err != nil {
				return nil, nil, d.err
			}
			if d.br == nil {
				d.br = bufio.NewReaderSize(d.conn, 32<<10)
			}
			return d.conn, d.br, nil
		case b, ok := <-a.in:
			if err := a.idleInput(b, ok); err != nil {
				cancel()
				if d := <-ch; d.conn != nil {
					_ = d.conn.Close()
				}
				return nil, nil, err
			}
		}
	}
}

// connect makes one attachment and serves it until it ends.
func (a *attachClient) connect(ctx context.Context, reattach bool) connResult {
	conn, src, err := a.dial(ctx)
	if err != nil {
		return connResult{err: err}
	}
	c := &wsConn{conn: conn, writeTimeout: a.writeTimeout}
	replayed := make(chan struct{}, 1)
	readErr := make(chan error, 1)
	go func() { readErr <- a.readLoop(c, src, reattach, replayed) }()

	res := connResult{dialed: true}
	// finish ends the connection, after a close handshake if polite, and
	// waits for the reader.
	finish := func(err error, polite bool) connResult {
		if polite {
			_ = c.write(ws.OpClose, ws.NewCloseFrameBody(ws.StatusNormalClosure, "detached"))
			t := time.NewTimer(a.closeWait)
			select {
			case <-readErr:
				readErr = nil
			case <-t.C:
			}
			t.Stop()
		}
		_ = conn.Close()
		if readErr != nil {
			<-readErr
		}
		select {
		case <-replayed:
			res.replayed = true
		default:
		}
		res.err = err
		return res
	}

	var ping <-chan time.Time
	if a.pingEvery > 0 {
		t := time.NewTicker(a.pingEvery)
		defer t.Stop()
		ping = t.C
	}
	for {
		select {
		case err := <-readErr:
			readErr = nil
			return finish(err, false)
		case <-replayed:
			res.replayed = true
			if err := a.resize(c); err != nil {
				return finish(err, false)
			}
			if len(a.pending) > 0 {
				if err := c.write(ws.OpBinary, a.pending); err != nil {
					return finish(err, false)
				}
				a.pending = nil
			}
		case <-a.winch:
			if res.replayed {
				if err := a.resize(c); err != nil {
					return finish(err, false)
				}
			}
		case b, ok := <-a.in:
			if !res.replayed {
				if err := a.idleInput(b, ok); err != nil {
					return finish(err, true)
				}
				continue
			}
			if !ok {
				a.in = nil // stdin ended: keep showing output
				continue
			}
			out, detach := a.esc.feed(b)
			if len(out) > 0 && !a.view {
				if err := c.write(ws.OpBinary, out); err != nil {
					return finish(err, false)
				}
			}
			if detach {
				return finish(errDetached, true)
			}
		case <-ping:
			if err := c.write(ws.OpPing, nil); err != nil {
				return finish(err, false)
			}
		case <-ctx.Done():
			return finish(ctx.Err(), true)
		}
	}
}

// resize sends the terminal size, unless viewing or there is no terminal.
func (a *attachClient) resize(c *wsConn) error {
	if a.view || a.size == nil {
		return nil
	}
	cols, rows, ok := a.size()
	if !ok {
		return nil
	}
	return c.write(ws.OpText, []byte(fmt.Sprintf("\x1b[RESIZE:%d;%d]", cols, rows)))
}

// readLoop reads the host's frames: pty.replay first, then output, which
// goes to stdout and moves the cursor. It returns why the connection
// ended (a wsutil.ClosedError for a close frame).
func (a *attachClient) readLoop(c *wsConn, src io.Reader, reattach bool, replayed chan<- struct{}) error {
	rd := &wsutil.Reader{
		Source:         src,
		State:          ws.StateClientSide,
		OnIntermediate: c.control,
	}
	out := countingWriter{w: a.stdout, n: &a.offset}
	buf := make([]byte, 32<<10)
	gotReplay := false
	for {
		if a.pingEvery > 0 {
			_ = c.conn.SetReadDeadline(time.Now().Add(3 * a.pingEvery))
		}
		h, err := rd.NextFrame()
		if err != nil {
			return err
		}
		switch {
		case h.OpCode.IsControl():
			if err := c.control(h, rd); err != nil {
				return err
			}
		case h.OpCode == ws.OpText:
			msg, err := io.ReadAll(io.LimitReader(rd, attachMaxText+1))
			if err != nil {
				return err
			}
			if len(msg) > attachMaxText {
				return fmt.Errorf("%w: text message over %d bytes", errProtocol, attachMaxText)
			}
			if gotReplay {
				continue // nothing else is defined; ignore
			}
			if err := a.replay(msg, reattach); err != nil {
				return err
			}
			gotReplay = true
			replayed <- struct{}{}
		case h.OpCode == ws.OpBinary:
			if !gotReplay {
				return fmt.Errorf("%w: output before pty.replay", errProtocol)
			}
			if _, err := io.CopyBuffer(out, rd, buf); err != nil {
				return err
			}
		default:
			if err := rd.Discard(); err != nil {
				return err
			}
		}
	}
}

// replay takes the pty.replay header: a reset moves the cursor to the
// start of the replayed window (and, on a reattach, clears the screen
// first, since what is shown no longer continues); a resume keeps it.
func (a *attachClient) replay(msg []byte, reattach bool) error {
	var r struct {
		Type        string          `json:"type"`
		Epoch       json.RawMessage `json:"epoch"`
		StartOffset int64           `json:"start_offset"`
		Reset       bool            `json:"reset"`
	}
	if err := json.Unmarshal(msg, &r); err != nil || r.Type != "pty.replay" {
		return fmt.Errorf("%w: want pty.replay first, got %.200q", errProtocol, msg)
	}
	var epoch string
	if json.Unmarshal(r.Epoch, &epoch) != nil {
		epoch = string(r.Epoch) // lenient: a number
	}
	if r.Reset {
		if reattach {
			if _, err := io.WriteString(a.stdout, "\x1bc"); err != nil {
				return fmt.Errorf("%w: %v", errStdout, err)
			}
		}
		a.offset = r.StartOffset
	}
	a.epoch, a.cursor = epoch, true
	return nil
}

// countingWriter adds what it writes to *n.
type countingWriter struct {
	w io.Writer
	n *int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	*c.n += int64(n)
	if err != nil {
		return n, fmt.Errorf("%w: %v", errStdout, err)
	}
	return n, nil
}

// wsConn writes whole client frames (masked), one at a time.
type wsConn struct {
	conn         net.Conn
	writeTimeout time.Duration

	mu        sync.Mutex // serialises frames; guards the field below
	closeSent bool       // a close frame went out: send no other
}

func (c *wsConn) write(op ws.OpCode, p []byte) error {
	b, err := ws.CompileFrame(ws.MaskFrame(ws.NewFrame(op, true, p)))
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closeSent {
		return net.ErrClosed
	}
	c.closeSent = op == ws.OpClose
	if c.writeTimeout > 0 {
		_ = c.conn.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	_, err = c.conn.Write(b)
	return err
}

// control answers a control frame: a pong for a ping; for a close, a
// close reply (best effort: the host may be gone already) and a
// wsutil.ClosedError.
func (c *wsConn) control(h ws.Header, body io.Reader) error {
	p, err := io.ReadAll(io.LimitReader(body, ws.MaxControlFramePayloadSize))
	if err != nil {
		return err
	}
	switch h.OpCode {
	case ws.OpPing:
		return c.write(ws.OpPong, p)
	case ws.OpClose:
		code, reason := ws.ParseCloseFrameData(p)
		if code.Empty() {
			_ = c.write(ws.OpClose, nil)
			return wsutil.ClosedError{Code: ws.StatusNoStatusRcvd}
		}
		_ = c.write(ws.OpClose, ws.NewCloseFrameBody(code, ""))
		return wsutil.ClosedError{Code: code, Reason: reason}
	}
	return nil
}

// escaper finds the escape sequence ~. at the start of a line, like ssh:
// "~." detaches, "~~" sends one "~", "~" before anything else is sent
// with it.
type escaper struct {
	lineStart bool // the last byte ended a line (or nothing was typed yet)
	tilde     bool // a "~" at the start of a line is held back
}

// feed returns the bytes of p to send and whether ~. was typed (bytes
// after it are dropped).
func (e *escaper) feed(p []byte) (out []byte, detach bool) {
	out = make([]byte, 0, len(p)+1)
	for _, c := range p {
		if e.tilde {
			e.tilde = false
			switch c {
			case '.':
				return out, true
			case '~':
				out = append(out, '~')
				e.lineStart = false
				continue
			}
			out = append(out, '~')
		} else if e.lineStart && c == '~' {
			e.tilde = true
			continue
		}
		out = append(out, c)
		e.lineStart = c == '\r' || c == '\n'
	}
	return out, false
}

// runTerminal runs a on the terminal in/out: in raw mode while it runs
// when in is a terminal (restored on every way out, signals included),
// the size of out (else in) sent on connect and on SIGWINCH, and
// SIGINT, SIGTERM and SIGHUP ending it with a close handshake.
func runTerminal(ctx context.Context, a *attachClient, in, out *os.File) int {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	a.stdin, a.stdout = in, out
	inFd, outFd := int(in.Fd()), int(out.Fd())
	switch {
	case term.IsTerminal(outFd):
		a.size = termSize(outFd)
	case term.IsTerminal(inFd):
		a.size = termSize(inFd)
	}
	if a.size != nil {
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		a.winch = winch
	}
	restore := func() {}
	if term.IsTerminal(inFd) {
		old, err := term.MakeRaw(inFd)
		if err != nil {
			fmt.Fprintln(a.stderr, "tether attach: raw mode:", err)
			return 1
		}
		var once sync.Once
		restore = func() {
			once.Do(func() {
				_ = term.Restore(inFd, old)
				a.raw = false
			})
		}
		defer restore()
		a.raw = true
	}
	code := a.run(ctx)
	restore()
	if ctx.Err() != nil {
		fmt.Fprintln(a.stderr, "tether: stopped by a signal")
	}
	return code
}

// termSize reports the size of the terminal fd.
func termSize(fd int) func() (int, int, bool) {
	return func() (int, int, bool) {
		cols, rows, err := term.GetSize(fd)
		return cols, rows, err == nil && cols > 0 && rows > 0
	}
}
