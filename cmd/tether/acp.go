package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// acpBridge is `tether acp`: the host's /acp endpoint on stdin and stdout,
// for editors that start their ACP agent as a command. Each line of stdin
// goes to the host as one text message, each message from the host comes
// out as one line; it exits when the host ends, or when stdin has ended
// and every request sent has been answered. It speaks no ACP itself.
func acpBridge(args []string) int {
	fs := flag.NewFlagSet("tether acp", flag.ContinueOnError)
	tf := addTokenFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: tether acp [--url U | --state-dir DIR]

Connects stdin and stdout to a running host's /acp endpoint, for an
editor that starts its ACP agent as a command (Zed's agent_servers,
JetBrains, Neovim): each line of stdin goes to the host as one message,
each message from the host comes out as one line. The host is found and
the access token read as for tether sessions (TETHER_TOKEN, or the host's
token file on this machine), so no credential appears in the editor's
settings. It speaks no ACP itself: tether is the agent (see docs/PROTOCOL.md,
"ACP"). It exits when the host ends the connection, or once stdin has
ended and every request it forwarded has been answered; 1 with the
reason when the host refuses the credential or cannot be reached. It
takes no credential from --token or from a ?token= in --url.

flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "tether acp:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// An editor's settings, and ps, show the command line: the
	// credential comes from TETHER_TOKEN or the token file only.
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "token" })
	if given {
		fmt.Fprintln(os.Stderr, "tether acp: --token is not taken here (an editor's settings and ps show it): set TETHER_TOKEN, or run as the host's user so that its token file is read")
		return 2
	}
	base, from := tf.base()
	_, urlToken, err := client.Endpoint(base, wire.PathACP)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether acp:", err)
		return 2
	}
	if urlToken != "" {
		fmt.Fprintf(os.Stderr, "tether acp: the URL %s carries a credential (?token=), which is not taken here: give the URL without it and set TETHER_TOKEN\n", redactToken(base))
		return 2
	}
	token, file, err := tf.resolve("")
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether acp:", err)
		return 1
	}
	mc, err := client.DialMessages(ctx, base, wire.PathACP, client.Options{Token: token})
	if err != nil {
		fmt.Fprintf(os.Stderr, "tether acp: connecting to %s: %v%s\n", redactToken(base), err, tf.connectHelp(from))
		return 1
	}
	defer mc.Close()
	return bridge(ctx, mc, os.Stdin, os.Stdout, func(err error) {
		var ce *client.CloseError
		if errors.As(err, &ce) && ce.Code == wire.CloseUnauthorized {
			fmt.Fprintln(os.Stderr, "tether acp:", tokenHelp(token, file))
			return
		}
		fmt.Fprintln(os.Stderr, "tether acp:", err)
	})
}

// bridge copies lines of in to messages of mc and messages of mc to lines
// of out. When in ends it keeps the connection until every request it
// forwarded has been answered (an editor may write its last request and
// close its end of the pipe at once), then closes it. It returns 0 when
// in ended and the host closed normally or went away, 1 otherwise (fail
// says why): a refused credential is 1 whenever it shows, also when in
// ended first.
func bridge(ctx context.Context, mc *client.MessageConn, in io.Reader, out io.Writer, fail func(error)) int {
	var pend pending
	fromHost := make(chan error, 1)
	go func() {
		w := bufio.NewWriter(out)
		for {
			msg, err := mc.ReadMessage()
			if err != nil {
				fromHost <- err
				return
			}
			pend.answered(msg)
			// A JSON message holds newlines only as white space: one line.
			_, _ = w.Write(bytes.ReplaceAll(bytes.ReplaceAll(msg, []byte("\r"), []byte(" ")), []byte("\n"), []byte(" ")))
			_ = w.WriteByte('\n')
			if err := w.Flush(); err != nil {
				fromHost <- nil // nobody reads our stdout any more
				return
			}
		}
	}()
	fromIn := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(in)
		// The host takes messages of at most 1 MiB: a longer line still
		// goes, and the host closes with 1009.
		sc.Buffer(make([]byte, 64<<10), 2<<20)
		for sc.Scan() {
			line := bytes.TrimSpace(sc.Bytes())
			if len(line) == 0 {
				continue
			}
			pend.sent(line)
			if err := mc.WriteMessage(ctx, line); err != nil {
				fromIn <- err
				return
			}
		}
		fromIn <- sc.Err()
	}()
	hostEnded := func(err error) int {
		var ce *client.CloseError
		if err == nil || errors.As(err, &ce) && (ce.Code == wire.CloseNormal || ce.Code == wire.CloseGoingAway) {
			return 0
		}
		fail(err)
		return 1
	}
	select {
	case err := <-fromHost:
		return hostEnded(err)
	case <-ctx.Done():
		return 0
	case err := <-fromIn:
		if err != nil {
			_ = mc.Close()
			fail(err)
			return 1
		}
	}
	// stdin ended: wait for the answers still due, then close; what the
	// host sends meanwhile still goes out.
	select {
	case err := <-fromHost:
		return hostEnded(err)
	case <-ctx.Done():
		return 0
	case <-pend.drained():
	}
	_ = mc.Close()
	// The host's answer to the close (or a refusal it sent before it).
	var err error
	select {
	case err = <-fromHost:
	case <-ctx.Done():
		return 0
	}
	var ce *client.CloseError
	if errors.As(err, &ce) && ce.Code >= 4000 {
		fail(err)
		return 1
	}
	return 0
}

// pending is the set of request ids the bridge forwarded to the host and
// has not yet seen answered.
type pending struct {
	mu   sync.Mutex
	ids  map[string]bool
	zero chan struct{} // closed when ids empties; nil while it is empty
}

// rpcMessage is what the bridge reads of a JSON-RPC message: whether it
// is a request (a method and an id) or an answer (an id, no method).
type rpcMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
}

// idOf returns msg's id in a canonical form, and whether msg is a
// request (else an answer, or a notification when id is "").
func idOf(msg []byte) (id string, request bool) {
	var m rpcMessage
	if json.Unmarshal(msg, &m) != nil || len(m.ID) == 0 || string(m.ID) == "null" {
		return "", false
	}
	var v any
	if json.Unmarshal(m.ID, &v) != nil {
		return "", false
	}
	canon, _ := json.Marshal(v) // 1 and 1.0 are one id, as for the host
	return string(canon), m.Method != ""
}

// sent records a message the bridge forwards to the host.
func (p *pending) sent(msg []byte) {
	id, request := idOf(msg)
	if id == "" || !request {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ids == nil {
		p.ids = make(map[string]bool)
	}
	if len(p.ids) == 0 {
		p.zero = make(chan struct{})
	}
	p.ids[id] = true
}

// answered records a message from the host: an answer settles its id.
func (p *pending) answered(msg []byte) {
	id, request := idOf(msg)
	if id == "" || request {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.ids[id] {
		return
	}
	delete(p.ids, id)
	if len(p.ids) == 0 {
		close(p.zero)
		p.zero = nil
	}
}

// drained returns a channel closed once no forwarded request is left
// unanswered.
func (p *pending) drained() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.zero != nil {
		return p.zero
	}
	done := make(chan struct{})
	close(done)
	return done
}
