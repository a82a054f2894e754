// Command embed is a small agent host built on tether: a program of its
// own, with an agent of its own, that hands sessions, journals, resume
// and transports to tether's host package (see docs/EMBEDDING.md).
//
//	go build -o /tmp/embed ./examples/embed
//	go build -o /tmp/unixsock ./examples/unixsock
//	/tmp/embed -state-dir /tmp/embed-state -unix-plugin /tmp/unixsock &
//	kill -USR1 $!   # swap the WebSocket transport for a fresh process
//	kill -TERM $!   # stop
//
// What it shows, in order:
//   - the agent: Counter implements agent.Agent and streams its answer
//     one word at a time;
//   - the WebSocket transport is this same binary, run by the host as a
//     go-plugin subprocess (`embed plugin ws`);
//   - host.Run with a minimal host.Config;
//   - once the host serves, a second transport (examples/unixsock's
//     plugin) is loaded at runtime through the host's control API;
//   - SIGUSR1 swaps the WebSocket transport for a fresh process through
//     the same API; sessions streaming on it carry on, and their clients
//     resume on the new process;
//   - SIGINT or SIGTERM stops the host: runs are interrupted, sessions
//     stored, plugins stopped.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/plugins/ws"
)

func main() {
	// The host starts its transports as subprocesses; this binary is also
	// the WebSocket one. Plugins log to stderr: stdout carries go-plugin's
	// handshake.
	if len(os.Args) == 3 && os.Args[1] == "plugin" && os.Args[2] == "ws" {
		contract.ServeTransport(ws.New(zerolog.New(os.Stderr).With().Timestamp().Logger()))
		return
	}
	os.Exit(run())
}

func run() int {
	stateDir := flag.String("state-dir", "", "the host's state dir (required; created mode 0700)")
	listen := flag.String("listen", "127.0.0.1:7717", "the WebSocket transport's address")
	unixPlugin := flag.String("unix-plugin", "", "examples/unixsock's plugin binary, loaded at runtime as transport unix")
	pace := flag.Duration("pace", 50*time.Millisecond, "the agent's pause before each word")
	flag.Parse()
	if *stateDir == "" {
		fmt.Fprintln(os.Stderr, "embed: -state-dir is required")
		return 2
	}
	log := zerolog.New(os.Stderr).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		return 1
	}

	// host.Run serves until ctx is done, then shuts down in reverse start
	// order. Run prints "tether listening on URL/?token=T" once every
	// transport serves: that line is the only sign that it is ready.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	usr1 := make(chan os.Signal, 1) // caught from the start: its default is to exit
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	out := &readyWriter{w: os.Stdout, ready: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		done <- host.Run(ctx, host.Config{
			Listen:   *listen,
			Token:    rand.Text(), // a real host keeps one (tether serve: <state-dir>/token)
			StateDir: *stateDir,
			// Every live session gets its own agent from this factory.
			Agents: agent.FactoryFunc(func(ctx context.Context, sessionKey string, state json.RawMessage) (agent.Agent, error) {
				return &Counter{Pace: *pace}, nil
			}),
			// The primary transport, serving Listen. PTY is left zero:
			// no PTY backend, /api/pty answers 4404.
			Transport: host.PluginSpec{Name: "ws", Path: self, Args: []string{"plugin", "ws"}},
			Version:   "embed-example",
			Stdout:    out,
			Log:       log,
		})
	}()
	select {
	case <-out.ready:
	case err := <-done:
		fmt.Fprintln(os.Stderr, "embed:", err)
		return 1
	}

	// Runtime changes go through the control socket in the state dir,
	// the one `tether plugins` talks to; host.Control is its client.
	if *unixPlugin != "" {
		path, err := filepath.Abs(*unixPlugin)
		if err == nil {
			err = control(ctx, *stateDir, host.ControlRequest{Op: host.OpLoad, Kind: contract.KindTransport, Name: "unix", Path: path})
		}
		if err != nil {
			log.Error().Err(err).Msg("loading transport unix")
		}
	}
	for {
		select {
		case <-usr1:
			// A fresh process of the same spec; its predecessor's
			// sockets are closed with 1012 and their sessions parked.
			if err := control(ctx, *stateDir, host.ControlRequest{Op: host.OpReload, Name: host.PrimaryTransport}); err != nil {
				log.Error().Err(err).Msg("swapping transport ws")
			}
		case err := <-done:
			if err != nil {
				fmt.Fprintln(os.Stderr, "embed:", err)
				return 1
			}
			fmt.Println("embed: stopped")
			return 0
		}
	}
}

// control sends req to the host on stateDir and prints its transports.
func control(ctx context.Context, stateDir string, req host.ControlRequest) error {
	resp, err := host.Control(ctx, stateDir, req)
	if err != nil {
		return err
	}
	for _, p := range resp.Plugins {
		fmt.Printf("embed: %s %s: transport %s pid %d on %s\n", req.Op, req.Name, p.Name, p.Pid, p.Addr)
	}
	return nil
}

// Counter is the agent: it answers "count to N" (the first number in the
// prompt, from 1 to 100000; else 10) with "1 2 … N." streamed one word
// per delta.
type Counter struct {
	Pace time.Duration // waited before each word
}

var _ agent.Agent = (*Counter)(nil)

var number = regexp.MustCompile(`[0-9]+`)

// Run streams the answer. The host passes the session's history (unused
// here) and interrupts the run by cancelling ctx.
func (c *Counter) Run(ctx context.Context, history []agent.Message, prompt string, emit func(delta string)) error {
	n, err := strconv.Atoi(number.FindString(prompt))
	if err != nil || n < 1 || n > 100000 {
		n = 10
	}
	t := time.NewTicker(max(c.Pace, time.Microsecond))
	defer t.Stop()
	for i := 1; i <= n; i++ {
		select {
		case <-ctx.Done():
			return fmt.Errorf("counter interrupted: %w", ctx.Err())
		case <-t.C:
		}
		emit(word(i, n))
	}
	return nil
}

// word is the i-th delta of counting to n: "1 ", "2 ", …, "n.".
func word(i, n int) string {
	if i == n {
		return strconv.Itoa(i) + "."
	}
	return strconv.Itoa(i) + " "
}

// Close releases nothing: a Counter holds no resources.
func (c *Counter) Close() error { return nil }

// readyWriter passes the host's output on to w and closes ready when the
// host prints its listening line.
type readyWriter struct {
	w     io.Writer
	ready chan struct{}
	once  sync.Once
}

func (r *readyWriter) Write(p []byte) (int, error) {
	if strings.Contains(string(p), "tether listening on ") {
		r.once.Do(func() { close(r.ready) })
	}
	return r.w.Write(p)
}
