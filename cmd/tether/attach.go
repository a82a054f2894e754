package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
	"github.com/tether-agent/tether/wire/vtquery"
)

// tether attach joins a keep-alive PTY of a running host from the local
// terminal, through package client:
//
//	tether attach [--view] [--url U] [--token T] ATTACH_TOKEN
//	tether attach [--view] [--url U] [--token T] --new
//
// Output is written to stdout; stdin, in raw mode when it is a terminal,
// is sent as input. The client counts the bytes it has written and, when
// the connection drops (1001, 1006, 1012, 1013, a network error or a
// silent peer), reattaches with that offset and the PTY's epoch, so every
// byte still in the host's ring is shown exactly once. It gives up after
// a minute without a connection. Once attached it says so on stderr, with
// the way out (and, with --new, the fresh token); after a drop it says
// "reconnected".
//
// The local terminal never answers a query a program asked before this
// attachment: a reset attachment (the first one, or one the host could
// not resume) brings a screen snapshot, which holds no query; it is
// written to a terminal reset first (RIS), since the snapshot redraws a
// fresh one. A resumed one brings the raw bytes the client missed: the
// queries in them (device attributes, cursor position, colours, modes …)
// are taken out before they reach the terminal (package vtquery); so are
// any in a snapshot. Live output, after the replay, goes through as it
// is: its queries are the running program's, asked of this terminal.
//
// When stdin is not a terminal and ends (echo 'ls' | tether attach
// --new), what it held is sent and the client detaches once the PTY has
// printed nothing for --settle (300 ms), or 10 s after that at the
// latest when it keeps printing.
//
// Ways out: the PTY's process exits (4410, status 0); another writer
// takes the PTY (4409, status 1); the host refuses the socket (4400,
// 4401, 4403, 4404, 4408, 4411, 1011: status 1); the escape sequence Enter ~ .
// typed at the start of a line (status 0; "~~" sends one "~"), like ssh;
// or the process ending (SIGINT, SIGTERM, SIGHUP: closing the terminal or
// kill). Ctrl-C, Ctrl-\ and Ctrl-Z are sent to the PTY like any other
// byte. Input that arrives while (re)connecting is held (up to
// attachMaxPending bytes, the rest dropped) and sent once attached.

// Timings of tether attach.
const (
	attachDialTimeout  = 10 * time.Second       // one dial, handshake and pty.replay
	attachRetryFor     = time.Minute            // reconnect this long, then give up
	attachPingEvery    = 15 * time.Second       // client pings; a read times out after 3×
	attachWriteTimeout = 10 * time.Second       // one frame write
	attachCloseWait    = time.Second            // wait for the host's close reply
	attachMaxPending   = 64 << 10               // input held while not attached
	attachSettle       = 300 * time.Millisecond // after the end of stdin: detach once quiet this long
	attachSettleMax    = 10 * time.Second       // … or this long after the settle time at the latest
)

// attachBackoff is the wait before each reconnect attempt; the last step
// repeats until attachRetryFor has passed.
var attachBackoff = []time.Duration{
	250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second,
}

var (
	// errDetached means the user typed the escape sequence ~. to detach.
	errDetached = errors.New("detached")
	// errStdout means writing the terminal stream to stdout failed.
	errStdout = errors.New("writing to stdout")
	// errSettled means stdin ended and the PTY's output then settled.
	errSettled = errors.New("end of input")
	// errStillPrinting means stdin ended and the PTY's output did not
	// settle in time.
	errStillPrinting = errors.New("end of input, output still coming")
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
// the exit status after saying why on stderr. With --new the client
// prints the fresh token as "tether: attach token T" once attached.
func parseAttach(args []string, stderr io.Writer) (*attachClient, int) {
	fs := flag.NewFlagSet("tether attach", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tf := addTokenFlags(fs)
	view := fs.Bool("view", false, "watch only: send no input and no resizes")
	fresh := fs.Bool("new", false, "generate a fresh attach token, use it and print it on stderr once attached")
	settle := fs.Duration("settle", attachSettle, "when stdin is not a terminal: after it ends, detach once the PTY has printed nothing for this long (at the latest 10s later)")
	// Help asked for goes to stdout (parseFlags sets the output), the
	// usage after a mistake to stderr.
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: tether attach [--view] [--url U] ATTACH_TOKEN
       tether attach [--view] [--url U] --new

The access token comes from TETHER_TOKEN, or from the host's token file
(<state-dir>/token) when the host runs on this machine as this user.

Joins the PTY of ATTACH_TOKEN (16-128 characters of A-Z a-z 0-9 _ -),
starting it if it does not exist ("tether ptys" lists the live ones, the
browser's terminals too). Type Enter ~ . to detach; Enter ~ ~ sends one ~.
With --view, nothing typed is sent (watch only) and a token with no live
PTY is refused. With stdin not a terminal, what it holds is typed in and
the command detaches once the output has settled after its end; with
--new, the end of stdin is also the end of input for the PTY's shell
(^D), so it ends with its script (exit 0, "session ended"). With stdout
not a terminal, nothing but the PTY's output is written to it.

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
	base, _ := tf.base()
	endpoint, urlToken, err := ptyEndpoint(base)
	if err != nil {
		fmt.Fprintln(stderr, "tether attach:", err)
		return nil, 2
	}
	token, tokenFile, err := tf.resolve(urlToken)
	if err != nil {
		fmt.Fprintln(stderr, "tether attach:", err)
		return nil, 1
	}
	rest := fs.Args()
	var tok string
	switch {
	case *fresh && len(rest) > 0:
		fmt.Fprintln(stderr, "tether attach: --new takes no attach token")
		return nil, 2
	case *fresh:
		tok = wire.NewAttachToken()
	case len(rest) == 0:
		fs.Usage()
		return nil, 2
	case len(rest) > 1:
		fmt.Fprintln(stderr, "tether attach: want one attach token, after the flags")
		return nil, 2
	default:
		tok = rest[0]
		if !wire.ValidAttachToken(tok) {
			fmt.Fprintln(stderr, "tether attach: invalid attach token: want 16-128 characters of A-Z a-z 0-9 _ -")
			return nil, 2
		}
	}
	if *settle <= 0 {
		fmt.Fprintln(stderr, "tether attach: --settle must be positive")
		return nil, 2
	}
	a := newAttachClient(endpoint, token, tok, *view)
	a.tokenFile = tokenFile
	a.fresh = *fresh
	a.settle = *settle
	return a, 0
}

// ptyEndpoint turns --url into the ws(s):// URL of /api/pty (any path
// of base kept as a prefix), and returns a ?token= it carried: the URL
// tether serve prints works as --url.
func ptyEndpoint(base string) (*url.URL, string, error) {
	u, token, err := client.Endpoint(base, wire.PathPTY)
	if err != nil {
		return nil, "", fmt.Errorf("--url: %w", err)
	}
	return u, token, nil
}

// attachClient is one PTY attachment that outlives dropped connections.
// It knows nothing of terminals: runTerminal sets raw mode and feeds it
// sizes and SIGWINCH. Its fields are set before run, which is called
// once.
type attachClient struct {
	endpoint  *url.URL // ws(s)://host:port/api/pty
	token     string   // access token; "" sends none
	tokenFile string   // where the token was looked for, for messages
	attach    string   // attach token
	view      bool     // view=1: never send input or resizes
	fresh     bool     // the attach token was made here (--new): print it once attached
	// endOfInput: stdin is no terminal, so its end is the end of input
	// for the PTY's program too (with fresh; see endInput).
	endOfInput bool

	stdin  io.Reader // nil: no input
	stdout io.Writer // the terminal stream, nothing else
	stderr io.Writer // status lines
	raw    bool      // the terminal is in raw mode: status lines need \r\n
	// term: stdout is a terminal; its modes are put back on the way out.
	term bool

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
	settle       time.Duration // see attachSettle
	settleMax    time.Duration // see attachSettleMax

	// The fields below are owned by run (and, while a connection is
	// served, the ones marked reader by its readLoop alone).
	in         <-chan []byte // stdin chunks; nil once stdin has ended
	inputEnded time.Time     // when stdin ended; zero before
	esc        escaper
	pending    []byte      // input to send once attached
	last       *client.PTY // the last attachment: its cursor is the next one's
	// reader: the first attachment has been announced.
	announced bool
	// reader: a snapshot was cut short: the screen is half drawn, so the
	// next attachment asks for a fresh one (no cursor) instead of
	// resuming.
	snapshotCut bool
	// reader: takes the queries out of replayed bytes. It is kept across
	// a resume (a query split by a drop is still found) and replaced on
	// a reset.
	filter *vtquery.Filter
	// reader: the alternate screen of the local terminal. run reads it
	// once no reader is left.
	alt altScreen
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
		settle:       attachSettle,
		settleMax:    attachSettleMax,
	}
}

// say writes one status line to stderr, on a line of its own.
func (a *attachClient) say(format string, args ...any) {
	a.sayLines(false, fmt.Sprintf(format, args...))
}

// sayLines writes status lines to stderr, on lines of their own; in raw
// mode the first starts a new line unless lineStart says the cursor is
// at the start of one.
func (a *attachClient) sayLines(lineStart bool, lines ...string) {
	if a.raw {
		msg := strings.Join(lines, "\r\n") + "\r\n"
		if !lineStart {
			msg = "\r\n" + msg
		}
		fmt.Fprint(a.stderr, msg)
		return
	}
	fmt.Fprint(a.stderr, strings.Join(lines, "\n")+"\n")
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
	// end puts the terminal back and says why the attachment is over,
	// on a line of its own.
	end := func(code int, msg string) int {
		fresh := a.leaveTerminal()
		if msg != "" {
			a.sayLines(fresh, msg)
		}
		return code
	}
	for attempt := 0; ; attempt++ {
		res := a.connect(ctx, attempt > 0)
		if code, msg, final := a.verdict(ctx, res.err); final {
			return end(code, msg)
		}
		if !res.dialed && !connected {
			return end(1, fmt.Sprintf("tether: cannot attach at %s: %v", a.endpoint.Host, res.err))
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
			return end(1, fmt.Sprintf("tether: gave up reconnecting after %v: %v", a.retryFor, res.err))
		}
		wait := a.backoff[min(step, len(a.backoff)-1)]
		step++
		if err := a.pause(ctx, wait); err != nil {
			code, msg, _ := a.verdict(ctx, err)
			return end(code, msg)
		}
	}
}

// leaveTerminal puts the local terminal back as a shell expects it, when
// stdout is one: off the alternate screen and with the modes a program
// in the PTY may have set reset (see altScreen.leave), the cursor at the
// start of a fresh line (freshLine). It reports whether it wrote that.
func (a *attachClient) leaveTerminal() (lineStart bool) {
	if !a.term {
		return false
	}
	_, err := io.WriteString(a.stdout, a.alt.leave()+freshLine)
	return err == nil
}

// verdict decides what an attachment's end means: final with an exit
// status and a message, or not final (reconnect).
func (a *attachClient) verdict(ctx context.Context, err error) (code int, msg string, final bool) {
	switch {
	case errors.Is(err, errDetached):
		return 0, "tether: detached", true
	case errors.Is(err, errSettled):
		return 0, "tether: end of input: detached", true
	case errors.Is(err, errStillPrinting):
		return 0, fmt.Sprintf("tether: end of input: detached; the output had not settled %v after it", (a.settle + a.settleMax).Round(time.Millisecond)), true
	case ctx.Err() != nil:
		return 1, "", true
	case errors.Is(err, errStdout), errors.Is(err, client.ErrProtocol):
		return 1, "tether: " + err.Error(), true
	}
	var ce *client.CloseError
	if errors.As(err, &ce) {
		if ce.Code == wire.CloseUnauthorized {
			return 1, "tether: " + tokenHelp(a.token, a.tokenFile), true
		}
		return closeVerdict(ce.Code, ce.Reason)
	}
	return 0, "", false
}

// closeVerdict maps a close code from the host to an exit status and a
// message, or to a reconnect (final false).
func closeVerdict(code int, reason string) (int, string, bool) {
	var why string
	switch {
	case wire.Reconnectable(code):
		return 0, "", false // host restarting, connection lost, too slow: reattach
	case code == wire.CloseSuperseded:
		return 1, "tether: detached: the terminal was opened elsewhere (4409)", true
	case code == wire.CloseProcessExited:
		return 0, "tether: session ended (4410)", true
	case code == wire.CloseNormal:
		return 0, "tether: the host closed the connection (1000)", true
	case code == wire.CloseBadRequest:
		why = "refused: malformed attach token or offset"
	case code == wire.CloseUnauthorized:
		why = "refused: missing or wrong access token"
	case code == wire.CloseForbidden:
		why = "refused: Host or Origin not allowed"
	case code == wire.CloseNotFound:
		why = "refused: the PTY endpoint is switched off"
	case code == wire.CloseNotLoopback:
		why = "refused: the host accepts loopback clients only"
	case code == wire.CloseNoSuchTerminal:
		why = "no such terminal"
	case code == wire.CloseInternalError:
		why = "host error"
	default:
		why = "connection closed by the host"
	}
	if reason != "" && !strings.Contains(why, reason) {
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

// endInput notes that stdin has ended and returns what is left to send:
// a "~" held back at the start of a line; and, when this command made
// the PTY (--new) and stdin is not a terminal, the end of input for its
// program (^D at the start of a line, one more after a partial line), so
// that a shell fed a script ends with it instead of living on for
// --pty-ttl.
func (a *attachClient) endInput() []byte {
	a.in = nil
	a.inputEnded = time.Now()
	var out []byte
	if a.esc.tilde {
		a.esc.tilde = false
		out = append(out, '~')
	}
	if a.fresh && a.endOfInput && !a.view {
		if !a.esc.lineStart || len(out) > 0 {
			out = append(out, eot)
		}
		out = append(out, eot)
	}
	return out
}

// eot is ^D: at the start of a line, the end of input for the program
// reading the PTY.
const eot = 0x04

// idleInput takes a chunk of input that arrives while not attached: it
// is held for the next attachment.
func (a *attachClient) idleInput(b []byte, ok bool) error {
	if !ok {
		b = a.endInput()
		if !a.view {
			a.pending = append(a.pending, b[:min(len(b), attachMaxPending-len(a.pending))]...)
		}
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

// attachOnce makes one attachment: the first with no cursor, every later
// one with the last one's (its epoch and the offset after the last byte
// shown), unless that one's snapshot was cut short. A writer sends the
// terminal's size as it is now, so that the PTY takes it before a
// snapshot is drawn (the resize sent once attached does the same on a
// host that ignores it).
func (a *attachClient) attachOnce(ctx context.Context) (*client.PTY, error) {
	q := wire.PTYQuery{Attach: a.attach, View: a.view}
	if a.last != nil && !a.snapshotCut {
		q.HasCursor, q.Offset, q.Epoch = true, a.last.Offset(), a.last.Epoch()
	}
	if !a.view && a.size != nil {
		if cols, rows, ok := a.size(); ok && cols <= wire.MaxSize && rows <= wire.MaxSize {
			q.Cols, q.Rows = cols, rows
		}
	}
	o := client.PTYOptions{
		Options: client.Options{
			Token:        a.token,
			DialTimeout:  a.dialTimeout,
			WriteTimeout: a.writeTimeout,
			CloseWait:    a.closeWait,
		},
		ReadTimeout: 3 * a.pingEvery,
	}
	u := *a.endpoint
	u.RawQuery = q.Encode()
	return client.AttachURL(ctx, u.String(), o)
}

// dial attaches, watching for the escape sequence meanwhile.
func (a *attachClient) dial(ctx context.Context) (*client.PTY, error) {
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type dialed struct {
		p   *client.PTY
		err error
	}
	ch := make(chan dialed, 1)
	go func() {
		p, err := a.attachOnce(dctx)
		ch <- dialed{p, err}
	}()
	for {
		select {
		case d := <-ch:
			return d.p, d.err
		case b, ok := <-a.in:
			if err := a.idleInput(b, ok); err != nil {
				cancel()
				if d := <-ch; d.p != nil {
					_ = d.p.CloseWith(wire.CloseNormal, "detached")
				}
				return nil, err
			}
		}
	}
}

// connect makes one attachment and serves it until it ends.
func (a *attachClient) connect(ctx context.Context, reattach bool) connResult {
	p, err := a.dial(ctx)
	if err != nil {
		var de *client.DialError
		return connResult{dialed: !errors.As(err, &de), err: err}
	}
	a.last = p
	res := connResult{dialed: true, replayed: true}
	readErr := make(chan error, 1)
	activity := make(chan struct{}, 1)
	go func() { readErr <- a.readLoop(p, reattach, activity) }()

	// finish ends the connection, after a close handshake if polite, and
	// waits for the reader.
	finish := func(err error, polite bool) connResult {
		if polite {
			_ = p.CloseWith(wire.CloseNormal, "detached")
		} else {
			p.Abort()
		}
		if readErr != nil {
			<-readErr
		}
		res.err = err
		return res
	}

	if err := a.resize(p); err != nil {
		return finish(err, false)
	}
	if len(a.pending) > 0 && !a.view {
		if _, err := p.Write(a.pending); err != nil {
			return finish(err, false)
		}
	}
	a.pending = nil

	var ping <-chan time.Time
	if a.pingEvery > 0 {
		t := time.NewTicker(a.pingEvery)
		defer t.Stop()
		ping = t.C
	}
	// Once stdin has ended and all it held is sent: detach when the
	// output has settled (quiet), or at the latest at the bound.
	var quiet, bound <-chan time.Time
	var quietT, boundT *time.Timer
	settle := func() {
		if a.inputEnded.IsZero() || quietT != nil {
			return
		}
		quietT = time.NewTimer(a.settle)
		boundT = time.NewTimer(time.Until(a.inputEnded.Add(a.settle + a.settleMax)))
		quiet, bound = quietT.C, boundT.C
	}
	defer func() {
		if quietT != nil {
			quietT.Stop()
			boundT.Stop()
		}
	}()
	settle()
	for {
		select {
		case err := <-readErr:
			readErr = nil
			return finish(err, false)
		case <-a.winch:
			if err := a.resize(p); err != nil {
				return finish(err, false)
			}
		case b, ok := <-a.in:
			var out []byte
			detach := false
			if ok {
				out, detach = a.esc.feed(b)
			} else {
				out = a.endInput()
			}
			if len(out) > 0 && !a.view {
				if _, err := p.Write(out); err != nil {
					return finish(err, false)
				}
			}
			if detach {
				return finish(errDetached, true)
			}
			settle()
		case <-activity:
			if quietT != nil {
				quietT.Reset(a.settle)
			}
		case <-quiet:
			return finish(errSettled, true)
		case <-bound:
			return finish(errStillPrinting, true)
		case <-ping:
			if err := p.Ping(); err != nil {
				return finish(err, false)
			}
		case <-ctx.Done():
			return finish(ctx.Err(), true)
		}
	}
}

// resize sends the terminal size, unless viewing or there is no terminal
// (or a size the host would drop).
func (a *attachClient) resize(p *client.PTY) error {
	if a.view || a.size == nil {
		return nil
	}
	cols, rows, ok := a.size()
	if !ok {
		return nil
	}
	if err := p.Resize(cols, rows); err != nil && !errors.Is(err, client.ErrInvalidSize) {
		return err
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
		a.term = true
	case term.IsTerminal(inFd):
		a.size = termSize(inFd)
	}
	if a.size != nil {
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		a.winch = winch
	}
	a.endOfInput = !term.IsTerminal(inFd)
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
