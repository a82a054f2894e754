package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tether-agent/tether/host"
	"github.com/tether-agent/tether/testing/wsclient"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// count is what the test asks the agent to count to: long enough, at the
// pace given, for the answer to be streaming still when the swap is done.
const count = 1500

// TestEmbed runs the example end to end: the built binary in a fresh
// state dir, its WebSocket transport (itself) and examples/unixsock's
// plugin as real go-plugin subprocesses. A WebSocket client prompts the
// agent; while the answer streams, SIGUSR1 swaps the WebSocket transport
// for a fresh process: the client is closed with 1012, resumes on the new
// process and gets the rest — the whole answer, each word once. A client
// on the Unix transport loaded at runtime sees the same session. SIGTERM
// stops the host cleanly.
func TestEmbed(t *testing.T) {
	bins := buildBinaries(t)
	e := startEmbed(t, bins, "-pace", "5ms")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The second transport was loaded at runtime through host.Control.
	line := e.waitLine(t, "embed: load unix: transport unix pid ")
	sock := line[strings.LastIndex(line, " unix:")+len(" unix:"):]
	wsBefore, unixBefore := e.pids(ctx, t)

	c1 := e.dial(ctx, t)
	var snap snapshot
	if err := c1.Call(ctx, "session.create", map[string]any{"title": "embedded"}, &snap); err != nil {
		t.Fatal(err)
	}
	if err := c1.Call(ctx, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": fmt.Sprintf("count to %d", count)}, nil); err != nil {
		t.Fatal(err)
	}
	got := stream{last: snap.LatestSeq}
	for len(got.deltas) < 5 { // the answer is streaming
		ev, err := c1.NextEvent(ctx)
		if err != nil {
			t.Fatalf("before the swap: %v", err)
		}
		got.apply(t, ev)
	}

	// Swap the WebSocket transport while the answer streams.
	if err := e.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := c1.NextEvent(ctx)
		if err != nil {
			break
		}
		got.apply(t, ev)
		if got.complete != nil {
			t.Fatal("the answer completed on the first socket: it was not closed by a swap")
		}
	}
	if code, _ := c1.CloseCode(); code != 1012 {
		t.Fatalf("the client's close at the swap: %d, want 1012", code)
	}
	before := len(got.deltas)
	e.waitLine(t, "embed: reload ws: transport ws pid ")
	if wsAfter, unixAfter := e.pids(ctx, t); wsAfter == wsBefore || unixAfter != unixBefore {
		t.Errorf("pids after the swap: ws %d (was %d), unix %d (was %d); want a new ws, the same unix", wsAfter, wsBefore, unixAfter, unixBefore)
	}

	// Resume on the new process (docs/PROTOCOL.md section 9): the same
	// live session, still answering; the events missed, then live ones.
	c2 := e.dial(ctx, t)
	var again snapshot
	if err := c2.Call(ctx, "session.resume", map[string]any{"session_id": snap.SessionKey}, &again); err != nil {
		t.Fatal(err)
	}
	if again.SessionID != snap.SessionID || again.Epoch != snap.Epoch {
		t.Fatalf("resumed %s epoch %s, want the live %s epoch %s", again.SessionID, again.Epoch, snap.SessionID, snap.Epoch)
	}
	if !again.Running {
		t.Fatalf("the answer was complete before the swap was (%d deltas seen): raise count", len(got.deltas))
	}
	var since struct {
		Epoch     string           `json:"epoch"`
		Events    []wsclient.Event `json:"events"`
		Truncated bool             `json:"truncated"`
	}
	if err := c2.Call(ctx, "session.events.since", map[string]any{"session_id": snap.SessionID, "last_seen": got.last}, &since); err != nil {
		t.Fatal(err)
	}
	if since.Truncated || since.Epoch != snap.Epoch {
		t.Fatalf("events.since: truncated %v, epoch %s; want the missed events of epoch %s", since.Truncated, since.Epoch, snap.Epoch)
	}
	for _, ev := range since.Events {
		got.apply(t, ev)
	}
	for got.complete == nil {
		ev, err := c2.NextEvent(ctx)
		if err != nil {
			t.Fatalf("after the resume: %v", err)
		}
		got.apply(t, ev)
	}
	t.Logf("%d of %d words before the swap, %d after", before, count, len(got.deltas)-before)
	want := answer(count)
	if text := strings.Join(got.deltas, ""); text != want {
		t.Errorf("the deltas across the swap make %d bytes, want the %d of the answer\ngot:  %.200s…", len(text), len(want), text)
	}
	if got.complete.Status != "complete" || got.complete.Text != want {
		t.Errorf("message.complete: %s with %d bytes, want complete with the whole answer", got.complete.Status, len(got.complete.Text))
	}

	// The Unix transport, loaded at runtime, serves the same session.
	u := dialLines(t, sock, e.token)
	res := u.call(t, "session.resume", map[string]any{"session_id": snap.SessionKey})
	var onUnix snapshot
	if err := json.Unmarshal(res, &onUnix); err != nil {
		t.Fatal(err)
	}
	if n := len(onUnix.Messages); onUnix.SessionID != snap.SessionID || n != 2 || onUnix.Messages[1].Text != want {
		t.Errorf("resume on unix: session %s with %d messages, want %s with the prompt and the whole answer", onUnix.SessionID, n, snap.SessionID)
	}
	u.nc.Close()
	c2.Close()

	// SIGTERM: the host stops, and with it every plugin.
	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("no exit 10 s after SIGTERM")
	}
	if code := e.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0\n%s", code, e.stderr.String())
	}
	e.waitLine(t, "embed: stopped")
	if _, err := host.Control(ctx, e.stateDir, host.ControlRequest{Op: host.OpList}); !errors.Is(err, host.ErrNoHost) {
		t.Errorf("control socket after the stop: %v, want ErrNoHost", err)
	}
	if nc, err := net.Dial("tcp", e.addr); err == nil { // a plugin left running would hold the port
		nc.Close()
		t.Errorf("%s still accepts connections after the stop", e.addr)
	}
}

// answer is the Counter's answer to counting to n.
func answer(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString(word(i, n))
	}
	return b.String()
}

func TestCounter(t *testing.T) {
	tests := []struct {
		prompt string
		want   string
	}{
		{"count to 3", "1 2 3."},
		{"no number here", answer(10)},
		{"count to 0", answer(10)},
		{"1", "1."},
	}
	for _, tt := range tests {
		t.Run(tt.prompt, func(t *testing.T) {
			var deltas []string
			err := (&Counter{}).Run(context.Background(), nil, tt.prompt, func(d string) { deltas = append(deltas, d) })
			if got := strings.Join(deltas, ""); err != nil || got != tt.want {
				t.Errorf("Run(%q): %q, %v; want %q", tt.prompt, got, err, tt.want)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := (&Counter{}).Run(ctx, nil, "5", func(string) {}); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a cancelled ctx: %v, want context.Canceled", err)
	}
}

// snapshot is the part of a session snapshot the test reads.
type snapshot struct {
	SessionID  string `json:"session_id"`
	SessionKey string `json:"session_key"`
	LatestSeq  uint64 `json:"latest_seq"`
	Epoch      string `json:"epoch"`
	Running    bool   `json:"running"`
	Messages   []struct {
		Role string `json:"role"`
		Text string `json:"text"`
	} `json:"messages"`
}

// stream is the answer as a client applies its events: each seq once,
// in order, from the snapshot's latest_seq on (docs/PROTOCOL.md section
// 9, step 5); a seq skipped fails the test.
type stream struct {
	last     uint64 // the highest seq applied
	deltas   []string
	complete *struct{ Status, Text string }
}

func (s *stream) apply(t *testing.T, ev wsclient.Event) {
	t.Helper()
	if ev.Seq == 0 || ev.Seq <= s.last { // gateway.ready, or seen already
		return
	}
	if ev.Seq != s.last+1 {
		t.Fatalf("event seq %d after %d: one was lost", ev.Seq, s.last)
	}
	s.last = ev.Seq
	switch ev.Type {
	case "message.delta":
		var d struct{ Text string }
		if err := ev.Decode(&d); err != nil {
			t.Fatal(err)
		}
		s.deltas = append(s.deltas, d.Text)
	case "message.complete":
		s.complete = new(struct{ Status, Text string })
		if err := ev.Decode(s.complete); err != nil {
			t.Fatal(err)
		}
	}
}

// binaries are the example and the unixsock plugin, built for the test.
type binaries struct{ embed, unixsock string }

func buildBinaries(t *testing.T) binaries {
	t.Helper()
	dir := t.TempDir()
	b := binaries{embed: filepath.Join(dir, "embed"), unixsock: filepath.Join(dir, "unixsock")}
	for _, pkg := range []struct{ out, dir string }{{b.embed, "."}, {b.unixsock, "../unixsock"}} {
		args := []string{"build", "-o", pkg.out}
		if raceEnabled {
			args = append(args, "-race")
		}
		if out, err := exec.Command("go", append(args, pkg.dir)...).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg.dir, err, out)
		}
	}
	return b
}

// embedProc is a running example.
type embedProc struct {
	cmd      *exec.Cmd
	exited   chan struct{} // closed once cmd.Wait returned
	stdout   *lines
	stderr   *bytes.Buffer
	stateDir string
	addr     string // the WebSocket transport's host:port
	token    string
}

// startEmbed starts the example on a fresh state dir and a free port and
// waits for its listening line. The process and its plugins (its process
// group) are killed at the end of the test if still running.
func startEmbed(t *testing.T, b binaries, args ...string) *embedProc {
	t.Helper()
	// Short: a Unix socket path (the state dir's unix.sock) has a limit.
	stateDir, err := os.MkdirTemp("", "embed")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stateDir) })
	args = append([]string{"-state-dir", stateDir, "-listen", "127.0.0.1:0", "-unix-plugin", b.unixsock}, args...)
	e := &embedProc{
		cmd:      exec.Command(b.embed, args...),
		exited:   make(chan struct{}),
		stdout:   newLines(),
		stderr:   new(bytes.Buffer),
		stateDir: stateDir,
	}
	e.cmd.Stdout, e.cmd.Stderr = e.stdout, &lockedWriter{w: e.stderr}
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(e.exited)
		_ = e.cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case <-e.exited:
		default:
			_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL)
			<-e.exited
		}
		if t.Failed() {
			t.Logf("embed's stdout:\n%s\nstderr:\n%s", strings.Join(e.stdout.all(), "\n"), e.stderr.String())
		}
	})
	line := e.waitLine(t, "tether listening on ")
	u, err := url.Parse(strings.TrimPrefix(line, "tether listening on "))
	if err != nil {
		t.Fatal(err)
	}
	e.addr, e.token = u.Host, u.Query().Get("token")
	return e
}

// waitLine waits for the example to print a line starting with prefix
// and returns it.
func (e *embedProc) waitLine(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.After(time.Minute)
	for i := 0; ; i++ {
		l, changed := e.stdout.line(i)
		for l == nil {
			select {
			case <-changed:
			case <-e.exited:
				if l, _ = e.stdout.line(i); l == nil {
					t.Fatalf("embed exited before printing %q", prefix)
				}
			case <-deadline:
				t.Fatalf("embed did not print %q within a minute", prefix)
			}
			l, changed = e.stdout.line(i)
		}
		if strings.HasPrefix(*l, prefix) {
			return *l
		}
	}
}

// pids are the running transports' processes, as host.Control lists them.
func (e *embedProc) pids(ctx context.Context, t *testing.T) (ws, unix int) {
	t.Helper()
	resp, err := host.Control(ctx, e.stateDir, host.ControlRequest{Op: host.OpList})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range resp.Plugins {
		switch p.Name {
		case "ws":
			ws = p.Pid
		case "unix":
			unix = p.Pid
		}
	}
	return ws, unix
}

func (e *embedProc) dial(ctx context.Context, t *testing.T) *wsclient.Client {
	t.Helper()
	c, err := wsclient.Dial(ctx, "ws://"+e.addr+"/api/ws", wsclient.Options{Token: e.token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if ev, err := c.NextEvent(ctx); err != nil || ev.Type != "gateway.ready" {
		t.Fatalf("first event: %v %s, want gateway.ready", err, ev.Raw)
	}
	return c
}

// lines collects what a process writes, line by line; a reader waits on
// the channel line returns for more.
type lines struct {
	mu      sync.Mutex // guards the fields below
	done    []string
	partial []byte
	changed chan struct{} // closed (and replaced) when a line is added
}

func newLines() *lines { return &lines{changed: make(chan struct{})} }

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.done = append(l.done, string(l.partial[:i]))
		l.partial = l.partial[i+1:]
		close(l.changed)
		l.changed = make(chan struct{})
	}
	return len(p), nil
}

// line returns line i, or nil and a channel closed when there are more.
func (l *lines) line(i int) (*string, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i < len(l.done) {
		return &l.done[i], nil
	}
	return nil, l.changed
}

func (l *lines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.done...)
}

// lockedWriter makes a writer safe to read from the test while the
// process writes.
type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// lineClient speaks examples/unixsock's wire: a handshake line, then one
// JSON-RPC message per line.
type lineClient struct {
	nc net.Conn
	r  *bufio.Reader
	id int
}

func dialLines(t *testing.T, sock, token string) *lineClient {
	t.Helper()
	nc, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(time.Minute))
	if _, err := fmt.Fprintf(nc, "TETHER token=%s\n", token); err != nil {
		t.Fatal(err)
	}
	return &lineClient{nc: nc, r: bufio.NewReader(nc)}
}

// call sends a request and returns its result, skipping the other lines.
func (c *lineClient) call(t *testing.T, method string, params any) json.RawMessage {
	t.Helper()
	c.id++
	req, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.id, "method": method, "params": params})
	if _, err := c.nc.Write(append(req, '\n')); err != nil {
		t.Fatal(err)
	}
	for {
		line, err := c.r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("%s on unix: %v", method, err)
		}
		var m struct {
			ID     json.RawMessage `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if json.Unmarshal(line, &m) != nil || string(m.ID) != strconv.Itoa(c.id) {
			continue
		}
		if m.Error != nil {
			t.Fatalf("%s on unix: %s", method, m.Error)
		}
		return m.Result
	}
}
