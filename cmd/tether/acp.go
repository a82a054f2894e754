package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// acpBridge is `tether acp`: the host's /acp endpoint on stdin and stdout,
// for editors that start their ACP agent as a command. Each line of stdin
// goes to the host as one text message, each message from the host comes
// out as one line; it exits when either side ends. It speaks no ACP
// itself.
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
"ACP"). It exits when either side ends; 1 with the reason when the host
refuses or cannot be reached.

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
	base, from := tf.base()
	_, urlToken, err := client.Endpoint(base, wire.PathACP)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether acp:", err)
		return 2
	}
	token, file, err := tf.resolve(urlToken)
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
// of out until either ends (or ctx): 0 when in ended or the host closed
// normally, 1 otherwise (fail says why).
func bridge(ctx context.Context, mc *client.MessageConn, in io.Reader, out io.Writer, fail func(error)) int {
	fromHost := make(chan error, 1)
	go func() {
		w := bufio.NewWriter(out)
		for {
			msg, err := mc.ReadMessage()
			if err != nil {
				fromHost <- err
				return
			}
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
			if err := mc.WriteMessage(ctx, line); err != nil {
				fromIn <- err
				return
			}
		}
		fromIn <- sc.Err()
	}()
	select {
	case err := <-fromHost:
		var ce *client.CloseError
		if err == nil || errors.As(err, &ce) && (ce.Code == wire.CloseNormal || ce.Code == wire.CloseGoingAway) {
			return 0
		}
		fail(err)
		return 1
	case err := <-fromIn:
		// stdin ended: close the socket; the host still handles what was
		// sent before the close.
		_ = mc.Close()
		if err != nil {
			fail(err)
			return 1
		}
		return 0
	case <-ctx.Done():
		return 0
	}
}
