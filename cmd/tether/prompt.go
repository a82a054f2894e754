package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

const promptUsage = `usage: tether prompt [--new | --session KEY] [--title T] [--url U] TEXT...
       echo TEXT | tether prompt [--new | --session KEY]

Submits TEXT as a prompt and streams the answer to stdout. --new (the
default) makes a new session; --session resumes the stored session KEY
(or the one with that exact title). The session's key is printed on
stderr first ("tether: session KEY"), so that "tether prompt --session
KEY" continues it and "tether sessions tail KEY" follows it. With no
TEXT, the prompt is read from stdin.

Exit status: 0 when the answer is complete; 1 when the run failed or was
interrupted, the session is busy with another run, or the host refused
(the reason on stderr); 130 after Ctrl-C, which interrupts the run. The
host and access token are found as for tether sessions.

flags:
`

// prompt is `tether prompt`.
func prompt(args []string) int {
	fs := flag.NewFlagSet("tether prompt", flag.ContinueOnError)
	tf := addTokenFlags(fs)
	fresh := fs.Bool("new", false, "make a new session (the default)")
	key := fs.String("session", "", "resume this stored session (its key, or its exact title) instead of making one")
	title := fs.String("title", "", "the new session's title (with --new)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), promptUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "tether prompt:", err)
		return 2
	}
	switch {
	case *fresh && *key != "":
		fmt.Fprintln(os.Stderr, "tether prompt: --new and --session go alone")
		return 2
	case *title != "" && *key != "":
		fmt.Fprintln(os.Stderr, "tether prompt: --title names a new session; it goes with --new")
		return 2
	}
	text := strings.Join(fs.Args(), " ")
	if text == "" {
		if term.IsTerminal(int(os.Stdin.Fd())) {
			fmt.Fprintln(os.Stderr, "tether prompt: no prompt: give TEXT, or pipe it on stdin")
			return 2
		}
		b, err := io.ReadAll(io.LimitReader(os.Stdin, maxPromptBytes+1))
		if err != nil {
			fmt.Fprintln(os.Stderr, "tether prompt: reading stdin:", err)
			return 1
		}
		if len(b) > maxPromptBytes {
			fmt.Fprintf(os.Stderr, "tether prompt: the prompt on stdin is over %d bytes\n", maxPromptBytes)
			return 2
		}
		text = strings.TrimRight(string(b), "\n")
	}
	if strings.TrimSpace(text) == "" {
		fmt.Fprintln(os.Stderr, "tether prompt: the prompt is empty")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c := tf.dial(dctx, "tether prompt")
	cancel()
	if c == nil {
		return 1
	}
	defer c.Close()
	return runPrompt(ctx, c, *key, *title, text, os.Stdout, os.Stderr)
}

// maxPromptBytes bounds a prompt read from stdin: under the gateway's
// 1 MiB frame with room for the request around it.
const maxPromptBytes = 1<<20 - 4096

// callTimeout bounds each call of the client commands.
const callTimeout = 30 * time.Second

// runPrompt makes (or resumes) the session, submits text and copies the
// answer to out until its run ends; the exit status as prompt's.
func runPrompt(ctx context.Context, c *client.Conn, key, title, text string, out, errOut io.Writer) int {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var snap wire.Snapshot
	err := retryOwner(cctx, errOut, "tether prompt", func() (err error) {
		if key != "" {
			snap, err = c.Resume(cctx, wire.ResumeParams{SessionID: key})
		} else {
			snap, err = c.Create(cctx, wire.CreateParams{Title: title})
		}
		return err
	})
	if err != nil {
		fmt.Fprintln(errOut, "tether prompt:", err)
		return 1
	}
	fmt.Fprintf(errOut, "tether: session %s\n", snap.SessionKey)
	res, err := c.Submit(cctx, snap.SessionID, text)
	if err != nil {
		fmt.Fprintln(errOut, "tether prompt:", err)
		return 1
	}
	interrupted := false
	var giveUp <-chan time.Time
	var wrote string // the tail of what was written, for the last newline
	for {
		select {
		case <-ctx.Done():
			// Ctrl-C: interrupt the run, and wait (bounded) for its end.
			interrupted = true
			ictx, icancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, _ = c.Interrupt(ictx, snap.SessionID)
			icancel()
			giveUp = time.After(5 * time.Second)
			ctx = context.Background() // Done is nil: asked once
		case <-giveUp:
			fmt.Fprintf(errOut, "tether prompt: run %s did not end after its interrupt\n", res.RunID)
			return 130
		case ev, ok := <-c.Events():
			if !ok {
				fmt.Fprintf(errOut, "tether prompt: the connection ended: %v (the run goes on: tether sessions tail %s)\n", c.Err(), snap.SessionKey)
				return exitAfter(interrupted, 1)
			}
			if ev.SessionID != snap.SessionID || ev.Seq <= snap.LatestSeq {
				continue
			}
			switch ev.Type {
			case wire.EventMessageDelta:
				var d wire.MessageDelta
				if ev.Decode(&d) == nil {
					_, _ = io.WriteString(out, d.Text)
					wrote = d.Text
				}
			case wire.EventMessageComplete:
				var m wire.MessageComplete
				if err := ev.Decode(&m); err != nil {
					fmt.Fprintln(errOut, "tether prompt:", err)
					return 1
				}
				if wrote != "" && !strings.HasSuffix(wrote, "\n") {
					_, _ = io.WriteString(out, "\n")
				}
				switch m.Status {
				case wire.RunComplete:
					return exitAfter(interrupted, 0)
				case wire.RunInterrupted:
					fmt.Fprintf(errOut, "tether prompt: run %s was interrupted\n", res.RunID)
				default:
					fmt.Fprintf(errOut, "tether prompt: run %s failed\n", res.RunID)
				}
				return exitAfter(interrupted, 1)
			}
		}
	}
}

// retryOwner calls f until it does not answer 5002 (the session's owner
// host is unreachable: in a cluster, until its heartbeat is older than
// the TTL), waiting 250 ms doubling to 2 s between tries, until ctx ends;
// it says once on errOut that it waits.
func retryOwner(ctx context.Context, errOut io.Writer, cmd string, f func() error) error {
	said := false
	for wait := 250 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		err := f()
		if !client.IsCode(err, wire.CodeOwnerUnreachable) {
			return err
		}
		if !said {
			fmt.Fprintf(errOut, "%s: the session's host is unreachable (5002); retrying…\n", cmd)
			said = true
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// exitAfter is status, or 130 after Ctrl-C.
func exitAfter(interrupted bool, status int) int {
	if interrupted {
		return 130
	}
	return status
}

const tailUsage = `usage: tether sessions tail [--json] [--url U] KEY

Follows a session: resumes the stored session KEY (or the one with that
exact title) as a viewer, prints its last messages, then every event as
it comes — answers as they stream, other events as "[type] payload" —
until Ctrl-C. With --json, each event is one line of JSON (the event's
params, as docs/PROTOCOL.md describes them), from the session's first
event still kept on. The host and access token are found as for tether
sessions.

flags:
`

// sessionsTail is `tether sessions tail`.
func sessionsTail(args []string) int {
	fs := flag.NewFlagSet("tether sessions tail", flag.ContinueOnError)
	tf := addTokenFlags(fs)
	asJSON := fs.Bool("json", false, "print each event as a line of JSON")
	lines := fs.Int("messages", 10, "the last messages to print first (0: none)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), tailUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "tether sessions tail:", err)
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "tether sessions tail: want one session KEY")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t := &tailer{key: fs.Arg(0), asJSON: *asJSON, lines: *lines, out: os.Stdout, errOut: os.Stderr,
		dial: func(ctx context.Context) *client.Conn {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return tf.dial(dctx, "tether sessions tail")
		}}
	return t.run(ctx)
}

// tailRetryFor is how long tail tries to get back to its session after
// its connection ended (a host restarting, or killed in a cluster).
const tailRetryFor = 2 * time.Minute

// tailer follows one session across dropped connections: after a drop
// it dials again, resumes the session and prints the events it missed
// (or says that some were lost), then goes on.
type tailer struct {
	key    string
	asJSON bool
	lines  int
	out    io.Writer
	errOut io.Writer
	dial   func(context.Context) *client.Conn

	last      uint64 // the seq of the last event printed
	epoch     string
	started   bool // the first attachment was made
	streaming bool // a run's answer is being printed
}

// run follows the session until ctx ends (0), or it cannot be reached
// again within tailRetryFor (1).
func (t *tailer) run(ctx context.Context) int {
	var lostAt time.Time
	for wait := 250 * time.Millisecond; ; {
		c := t.dial(ctx)
		if c == nil {
			if !t.started {
				return 1
			}
		} else {
			err, fatal := t.follow(ctx, c)
			c.Close()
			// A credential revoked or expired is not a lost connection:
			// dialling again would be refused the same way.
			var ce *client.CloseError
			if errors.As(err, &ce) && ce.Code == wire.CloseUnauthorized {
				fatal = true
			}
			switch {
			case ctx.Err() != nil:
				return 0
			case fatal:
				fmt.Fprintln(t.errOut, "tether sessions tail:", err)
				return 1
			}
			wait, lostAt = 250*time.Millisecond, time.Now()
			fmt.Fprintf(t.errOut, "tether: connection lost (%v); following again…\n", err)
		}
		if !lostAt.IsZero() && time.Since(lostAt) > tailRetryFor {
			fmt.Fprintf(t.errOut, "tether sessions tail: gave up after %v\n", tailRetryFor)
			return 1
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return 0
		case <-timer.C:
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// follow resumes the session on c and prints its events until c ends
// (fatal: a refusal that a retry does not mend) or ctx does.
func (t *tailer) follow(ctx context.Context, c *client.Conn) (err error, fatal bool) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var snap wire.Snapshot
	err = retryOwner(cctx, t.errOut, "tether sessions tail", func() (err error) {
		snap, err = c.Resume(cctx, wire.ResumeParams{SessionID: t.key})
		return err
	})
	if err != nil {
		// A refusal (4007, …) is final; a dropped connection, or an owner
		// still unreachable, is not.
		var re *client.Error
		return err, errors.As(err, &re) && re.Code != wire.CodeOwnerUnreachable
	}
	enc := json.NewEncoder(t.out)
	switch {
	case !t.started:
		t.started = true
		fmt.Fprintf(t.errOut, "tether: following session %s (%s); Ctrl-C ends\n", snap.SessionKey, snap.Title)
		if t.asJSON {
			since, err := c.EventsSince(cctx, snap.SessionID, 0)
			if err != nil {
				return err, false
			}
			for _, e := range since.Events {
				_ = enc.Encode(e)
			}
		} else if t.lines > 0 {
			msgs := snap.Messages
			if len(msgs) > t.lines {
				msgs = msgs[len(msgs)-t.lines:]
			}
			for _, m := range msgs {
				fmt.Fprintf(t.out, "%s: %s\n", m.Role, strings.TrimRight(m.Text, "\n"))
			}
		}
		t.last, t.epoch = snap.LatestSeq, snap.Epoch
		t.streaming = snap.Status == wire.StatusWorking
	default:
		// Back after a drop: what was missed, from the journal.
		since, err := c.EventsSince(cctx, snap.SessionID, t.last)
		if err != nil {
			return err, false
		}
		if since.Truncated || since.Epoch != t.epoch {
			fmt.Fprintln(t.errOut, "tether: some events of the session were lost while away; going on from now")
			t.last, t.epoch = snap.LatestSeq, snap.Epoch
		} else {
			for _, e := range since.Events {
				t.print(enc, client.Event{Event: e})
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil, false
		case ev, ok := <-c.Events():
			if !ok {
				return c.Err(), false
			}
			if ev.SessionID == snap.SessionID {
				t.print(enc, ev)
			}
		}
	}
}

// print prints one event of the session, once: by seq.
func (t *tailer) print(enc *json.Encoder, ev client.Event) {
	if ev.Seq <= t.last {
		return
	}
	t.last = ev.Seq
	if t.asJSON {
		_ = enc.Encode(ev.Event)
		return
	}
	switch ev.Type {
	case wire.EventMessageStart:
		var st struct {
			Prompt string `json:"prompt"`
		}
		if ev.Decode(&st) == nil && st.Prompt != "" {
			fmt.Fprintf(t.out, "user: %s\n", strings.TrimRight(st.Prompt, "\n"))
		}
		fmt.Fprint(t.out, "assistant: ")
		t.streaming = true
	case wire.EventMessageDelta:
		var d wire.MessageDelta
		if ev.Decode(&d) == nil {
			fmt.Fprint(t.out, d.Text)
		}
	case wire.EventMessageComplete:
		var m wire.MessageComplete
		_ = ev.Decode(&m)
		if t.streaming {
			fmt.Fprintln(t.out)
		}
		t.streaming = false
		if m.Status != wire.RunComplete {
			fmt.Fprintf(t.out, "[run %s]\n", m.Status)
		}
	default:
		fmt.Fprintf(t.out, "[%s] %s\n", ev.Type, ev.Payload)
	}
}
