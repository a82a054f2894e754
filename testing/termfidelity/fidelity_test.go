package termfidelity

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/pty"
)

const waitTimeout = 30 * time.Second

// op is one step of a render job: bytes to write or a resize.
type op struct {
	Write  []byte `json:"write,omitempty"`
	Resize []int  `json:"resize,omitempty"`
}

type job struct {
	Cols       int  `json:"cols"`
	Rows       int  `json:"rows"`
	Scrollback int  `json:"scrollback"`
	Ops        []op `json:"ops"`
}

// line and dump mirror render.mjs's output.
type line struct {
	Wrapped bool              `json:"wrapped"`
	Cells   []json.RawMessage `json:"cells"`
}

type dump struct {
	Cols, Rows int
	Active     string `json:"active"`
	Cursor     struct {
		X, Y   int
		Hidden bool
	} `json:"cursor"`
	Title         string          `json:"title"`
	Modes         map[string]any  `json:"modes"`
	MouseEncoding string          `json:"mouseEncoding"`
	Answers       string          `json:"answers"`
	Normal        []line          `json:"normal"`
	NormalBaseY   int             `json:"normalBaseY"`
	Alternate     []line          `json:"alternate"`
	Extra         json.RawMessage `json:"-"`
}

// render renders the jobs in @xterm/headless. Node and the packages are
// required: the test fails without them.
func render(t *testing.T, jobs ...job) []dump {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed: the fidelity test needs it (and `npm ci` in testing/termfidelity): %v", err)
	}
	if _, err := os.Stat(filepath.Join("node_modules", "@xterm", "headless", "package.json")); err != nil {
		t.Fatalf("@xterm/headless is not installed: run `npm ci` in testing/termfidelity: %v", err)
	}
	var in bytes.Buffer
	for _, j := range jobs {
		b, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		in.Write(append(b, '\n'))
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "render.mjs")
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node render.mjs: %v\n%s", err, stderr.Bytes())
	}
	var dumps []dump
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<30)
	for sc.Scan() {
		var d dump
		if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
			t.Fatalf("render.mjs output: %v", err)
		}
		dumps = append(dumps, d)
	}
	if len(dumps) != len(jobs) {
		t.Fatalf("render.mjs: got %d dumps for %d jobs", len(dumps), len(jobs))
	}
	return dumps
}

// scenario is output a program writes, in two parts with an optional
// resize between, on a backend with the given ring and scrollback.
type scenario struct {
	name       string
	cols, rows int
	buffer     int64
	scrollback int
	first      []byte
	resize     []int // cols, rows after first
	second     []byte
}

func TestSnapshotFidelity(t *testing.T) {
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) { runScenario(t, sc) })
	}
}

// stream collects the PTYs' output from the Output stream, by token.
type stream struct {
	mu      sync.Mutex
	data    map[string][]byte
	changed chan struct{}
}

func (s *stream) sink(_ context.Context, outs []contract.Output) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range outs {
		if int64(len(s.data[o.Token])) == o.Offset {
			s.data[o.Token] = append(s.data[o.Token], o.Data...)
		}
	}
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

func (s *stream) waitLen(t *testing.T, tok string, n int) {
	t.Helper()
	if !s.waitFor(waitTimeout, tok, n) {
		t.Fatalf("the stream has %d bytes of %s after %v, want %d", len(s.data[tok]), tok, waitTimeout, n)
	}
}

func (s *stream) waitFor(d time.Duration, tok string, n int) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		got, ch := len(s.data[tok]), s.changed
		s.mu.Unlock()
		if got >= n {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return false
		}
	}
}

func runScenario(t *testing.T, sc scenario) {
	dir := t.TempDir()
	f1, f2 := filepath.Join(dir, "first"), filepath.Join(dir, "second")
	if err := os.WriteFile(f1, sc.first, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f2, sc.second, 0o600); err != nil {
		t.Fatal(err)
	}
	b := pty.New(zerolog.Nop())
	t.Cleanup(b.Shutdown)
	ctx := context.Background()
	if _, err := b.Start(ctx, contract.BackendConfig{Buffer: sc.buffer, Scrollback: sc.scrollback}); err != nil {
		t.Fatal(err)
	}
	s := &stream{data: make(map[string][]byte), changed: make(chan struct{})}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Output(sctx, s.sink) }()
	t.Cleanup(func() { cancel(); <-done })
	syncStream(t, b, s)

	tok := "fidelity_" + strings.ReplaceAll(sc.name, " ", "_") + "_0123456789"
	w := contract.TransportID{Instance: "fidelity", Conn: 1}
	// The terminal passes the bytes as they are (no echo, no \n to \r\n).
	script := fmt.Sprintf("stty -echo -opost; cat %s; read x; cat %s; exec sleep 60", f1, f2)
	if _, err := b.Attach(ctx, contract.AttachRequest{Token: tok, Viewer: w, Cols: sc.cols, Rows: sc.rows, Argv: []string{"/bin/sh", "-c", script}}); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	t.Cleanup(func() { _ = b.Close(ctx, tok) })
	s.waitLen(t, tok, len(sc.first))
	if sc.resize != nil {
		if err := b.Resize(ctx, tok, w, sc.resize[0], sc.resize[1]); err != nil {
			t.Fatalf("Resize: %v", err)
		}
	}
	if err := b.Write(ctx, tok, w, []byte("\n")); err != nil {
		t.Fatalf("Write: %v", err)
	}
	s.waitLen(t, tok, len(sc.first)+len(sc.second))

	snap, err := b.Attach(ctx, contract.AttachRequest{Token: tok, Viewer: contract.TransportID{Instance: "fidelity", Conn: 2}, View: true})
	if err != nil {
		t.Fatalf("view Attach: %v", err)
	}
	if !snap.Snapshot || snap.ReplayEnd != int64(len(sc.first)+len(sc.second)) {
		t.Fatalf("snapshot=%v at %d, want a snapshot at the end %d", snap.Snapshot, snap.ReplayEnd, len(sc.first)+len(sc.second))
	}
	s.mu.Lock()
	raw := bytes.Clone(s.data[tok])
	s.mu.Unlock()
	if !bytes.Equal(raw, append(bytes.Clone(sc.first), sc.second...)) {
		t.Fatalf("the stream holds %d bytes that are not the program's %d", len(raw), len(sc.first)+len(sc.second))
	}

	ops := []op{{Write: sc.first}}
	if sc.resize != nil {
		ops = append(ops, op{Resize: sc.resize})
	}
	ops = append(ops, op{Write: sc.second})
	xsb := max(sc.scrollback, pty.DefaultScrollback)
	dumps := render(t,
		job{Cols: sc.cols, Rows: sc.rows, Scrollback: xsb, Ops: ops},
		job{Cols: snap.Cols, Rows: snap.Rows, Scrollback: xsb, Ops: []op{{Write: snap.Replay}}})
	full, got := dumps[0], dumps[1]
	info := listed(t, b, tok)
	compare(t, full, got, info.ScreenRebuilds)
	t.Logf("%d bytes of output, snapshot %d bytes, %d scrollback lines, %d rebuilds", len(raw), len(snap.Replay), len(got.Normal)-got.Rows, info.ScreenRebuilds)
}

// syncStream waits until the Output stream is registered (a stream starts
// at each PTY's end: output before it is not on it): it writes to a PTY
// that echoes until its output shows on the stream.
func syncStream(t *testing.T, b *pty.Backend, s *stream) {
	t.Helper()
	ctx := context.Background()
	tok, w := "fidelity_probe_0123456789", contract.TransportID{Instance: "fidelity", Conn: 99}
	if _, err := b.Attach(ctx, contract.AttachRequest{Token: tok, Viewer: w, Argv: []string{"cat"}}); err != nil {
		t.Fatalf("Attach of the probe: %v", err)
	}
	defer func() { _ = b.Close(ctx, tok) }()
	deadline := time.Now().Add(waitTimeout)
	for !s.waitFor(50*time.Millisecond, tok, 1) {
		if err := b.Write(ctx, tok, w, []byte("p\n")); err != nil {
			t.Fatalf("Write to the probe: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the Output stream shows nothing of a PTY that echoes")
		}
	}
}

func listed(t *testing.T, b *pty.Backend, tok string) contract.PTYInfo {
	infos, err := b.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range infos {
		if i.Token == tok {
			return i
		}
	}
	t.Fatalf("PTY %s not listed", tok)
	return contract.PTYInfo{}
}

// compare fails t where the snapshot's rendering differs from the full
// stream's. A model that was rebuilt from the ring has less scrollback:
// its lines must then be the last ones of the full stream's.
func compare(t *testing.T, full, got dump, rebuilds int64) {
	t.Helper()
	if full.Cols != got.Cols || full.Rows != got.Rows {
		t.Fatalf("size: snapshot %dx%d, full stream %dx%d", got.Cols, got.Rows, full.Cols, full.Rows)
	}
	if full.Active != got.Active {
		t.Errorf("active buffer: snapshot %s, full stream %s", got.Active, full.Active)
	}
	if full.Cursor != got.Cursor {
		t.Errorf("cursor: snapshot %+v, full stream %+v", got.Cursor, full.Cursor)
	}
	if full.Title != got.Title {
		t.Errorf("title: snapshot %q, full stream %q", got.Title, full.Title)
	}
	for k, v := range full.Modes {
		if fmt.Sprint(got.Modes[k]) != fmt.Sprint(v) {
			t.Errorf("mode %s: snapshot %v, full stream %v", k, got.Modes[k], v)
		}
	}
	if full.MouseEncoding != got.MouseEncoding {
		t.Errorf("mouse encoding: snapshot %s, full stream %s", got.MouseEncoding, full.MouseEncoding)
	}
	if got.Answers != "" {
		t.Errorf("the terminal answered %q to the snapshot, want nothing", got.Answers)
	}
	rows := full.Rows
	if full.Active == "alternate" {
		compareLines(t, "alternate screen", full.Alternate, got.Alternate)
	}
	fs, gs := full.Normal[len(full.Normal)-rows:], got.Normal[len(got.Normal)-rows:]
	compareLines(t, "screen", fs, gs)
	fsb, gsb := full.Normal[:len(full.Normal)-rows], got.Normal[:len(got.Normal)-rows]
	if len(gsb) != len(fsb) && (rebuilds == 0 || len(gsb) > len(fsb)) {
		t.Errorf("scrollback: snapshot %d lines, full stream %d (%d rebuilds)", len(gsb), len(fsb), rebuilds)
	}
	if n := min(len(fsb), len(gsb)); n > 0 {
		compareLines(t, "scrollback", fsb[len(fsb)-n:], gsb[len(gsb)-n:])
	}
}

func compareLines(t *testing.T, what string, want, got []line) {
	t.Helper()
	if len(want) != len(got) {
		t.Errorf("%s: snapshot %d lines, full stream %d", what, len(got), len(want))
		return
	}
	bad := 0
	for y := range want {
		a, b := cells(want[y]), cells(got[y])
		if a != b {
			if bad++; bad <= 5 {
				t.Errorf("%s line %d:\n full stream %s\n snapshot    %s", what, y, a, b)
			}
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d lines differ in all", what, bad)
	}
}

func cells(l line) string {
	var b strings.Builder
	for _, c := range l.Cells {
		b.Write(c)
	}
	return b.String()
}

func scenarios() []scenario {
	r := rand.New(rand.NewPCG(1, 2))
	colour := func(n int, width int) []byte {
		var b bytes.Buffer
		for i := range n {
			switch r.IntN(5) {
			case 0:
				fmt.Fprintf(&b, "\x1b[01;34mdir%d\x1b[0m  \x1b[01;32mexec%d\x1b[0m  file%d.go\r\n", i, i, i)
			case 1:
				fmt.Fprintf(&b, "main.go:%d: \x1b[1;31merror:\x1b[0m \x1b[3mx%d\x1b[23m \x1b[4mundefined\x1b[24m\r\n", i, i)
			case 2:
				fmt.Fprintf(&b, "\x1b[38;5;%dm%s\x1b[m\x1b[48;2;%d;%d;%dm \x1b[m\r\n", r.IntN(256), strings.Repeat("lorem ", 1+r.IntN(width/8)), r.IntN(256), r.IntN(256), r.IntN(256))
			case 3:
				fmt.Fprintf(&b, "\x1b[7mrev\x1b[27m \x1b[2mdim\x1b[22m \x1b[9mstrike\x1b[29m 日本語 wide\r\n")
			default:
				fmt.Fprintf(&b, "\x1b[32muser@host\x1b[0m:\x1b[34m~/src\x1b[0m$ make %d\r\n", i)
			}
		}
		return b.Bytes()
	}
	prompt := []byte("\x1b]0;user@host: ~/src\x07\x1b[32muser@host\x1b[0m:\x1b[34m~/src\x1b[0m$ ")
	queries := []byte("\x1b[c\x1b[>c\x1b[6n\x1b]10;?\x07\x1b]11;?\x1b\\\x1b[?2004$p")

	vim := []byte("\x1b[?1049h\x1b[22;0;0t\x1b[?1h\x1b=\x1b[?2004h\x1b[?1000h\x1b[?1006h\x1b[H\x1b[2J\x1b[?25l")
	vim = append(vim, queries...)
	vim = append(vim, "\x1b]2;vim main.go\x07"...)
	for y := 1; y <= 23; y++ {
		vim = fmt.Appendf(vim, "\x1b[%d;1H\x1b[33m%3d \x1b[m\x1b[1;34mfunc\x1b[m main%d() {\x1b[K", y, y, y)
	}
	vim = append(vim, "\x1b[24;1H\x1b[7m main.go [+]   23L \x1b[m\x1b[K\x1b[3;8H\x1b[?25h"...)
	vimDone := append(bytes.Clone(vim), "\x1b[?25l\x1b[24;1H\x1b[K\x1b[?2004l\x1b[?1l\x1b>\x1b[?1000l\x1b[?1006l\x1b[?1049l\x1b[23;0;0t\x1b[?25h"...)

	short := func(n int) []byte { // lines that fit a 60-column terminal
		var b bytes.Buffer
		for i := range n {
			fmt.Fprintf(&b, "\x1b[3%dmline %d\x1b[m of short output\r\n", i%8, i)
		}
		return b.Bytes()
	}
	join := func(ps ...[]byte) []byte { return bytes.Join(ps, nil) }

	return []scenario{
		{name: "colourful screen", cols: 80, rows: 24, first: join(colour(3000, 80), queries, prompt)},
		{name: "alternate screen app", cols: 80, rows: 24, first: join(colour(200, 80), prompt, []byte("vim main.go\r\n")), second: vim},
		{name: "after an alternate screen app", cols: 80, rows: 24, first: join(colour(200, 80), prompt, []byte("vim main.go\r\n")), second: join(vimDone, prompt)},
		{name: "past a 64 KiB ring", cols: 80, rows: 24, buffer: 64 << 10, first: join(colour(60000, 80), queries, prompt)},
		{name: "resize between output and attach", cols: 80, rows: 24, first: join(short(500), prompt), resize: []int{60, 20}, second: join([]byte("\r\n"), short(5), prompt)},
		{name: "200x60", cols: 200, rows: 60, first: join(colour(2000, 200), prompt)},
	}
}
