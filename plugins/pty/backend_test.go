package pty

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

func TestReplayReason(t *testing.T) {
	const epoch = "e1"
	tests := []struct {
		name      string
		hasCursor bool
		offset    int64
		epoch     string
		want      string
	}{
		{"no cursor", false, 0, "", wire.ReasonInitial},
		{"no cursor ignores offset", false, -5, "x", wire.ReasonInitial},
		{"resume at start", true, 10, epoch, wire.ReasonResume},
		{"resume inside", true, 15, epoch, wire.ReasonResume},
		{"resume at end", true, 20, epoch, wire.ReasonResume},
		{"negative offset", true, -1, epoch, wire.ReasonInvalidCursor},
		{"no epoch", true, 15, "", wire.ReasonInvalidCursor},
		{"other epoch", true, 15, "e2", wire.ReasonEpochMismatch},
		{"before window", true, 9, epoch, wire.ReasonOffsetRolledOut},
		{"past end", true, 21, epoch, wire.ReasonOffsetAhead},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := replayReason(tt.hasCursor, tt.offset, tt.epoch, epoch, 10, 20); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestAttachReplay(t *testing.T) {
	b, out := newBackend(t, contract.BackendConfig{Buffer: 64})

	spawned := attach(t, b, contract.AttachRequest{Token: token("hello"), Viewer: viewer(1),
		Argv: sh("printf hello; exec sleep 30")})
	if !spawned.Spawned || spawned.Reason != wire.ReasonInitial || !spawned.Reset {
		t.Errorf("first attach: got spawned=%v reason=%q reset=%v, want true %q true",
			spawned.Spawned, spawned.Reason, spawned.Reset, wire.ReasonInitial)
	}
	hello := spawned.Epoch
	out.waitOutput(t, hello, "hello")

	long := attach(t, b, contract.AttachRequest{Token: token("long"), Viewer: viewer(2),
		Argv: sh("printf '%0100d' 0; exec sleep 30")})
	// The ring may wrap before the stream sees the first bytes.
	out.wait(t, long.Epoch, "100 bytes", func(s *streamLog) bool { return s.start+int64(len(s.data)) == 100 })
	zeros := strings.Repeat("0", 100)

	// A new token attached with a cursor (say, from a PTY that exited)
	// spawns a PTY of another epoch.
	again := attach(t, b, contract.AttachRequest{Token: token("cursor"), Viewer: viewer(3),
		HasCursor: true, Epoch: hello, Offset: 3, Argv: sh("exec sleep 30")})
	if !again.Spawned || again.Reason != wire.ReasonEpochMismatch {
		t.Errorf("spawning attach with a cursor: got spawned=%v reason=%q, want true %q",
			again.Spawned, again.Reason, wire.ReasonEpochMismatch)
	}

	tests := []struct {
		name       string
		token      string
		hasCursor  bool
		epoch      string
		offset     int64
		wantReason string
		wantReplay string // the raw replay of a resume, or text the snapshot shows
		wantStart  int64
		wantEnd    int64
	}{
		{"initial", "hello", false, "", 0, wire.ReasonInitial, "hello", 5, 5},
		{"resume from start", "hello", true, hello, 0, wire.ReasonResume, "hello", 0, 5},
		{"resume inside", "hello", true, hello, 2, wire.ReasonResume, "llo", 0, 5},
		{"resume at end", "hello", true, hello, 5, wire.ReasonResume, "", 0, 5},
		{"epoch mismatch", "hello", true, "0123456789abcdef", 2, wire.ReasonEpochMismatch, "hello", 5, 5},
		{"offset ahead", "hello", true, hello, 6, wire.ReasonOffsetAhead, "hello", 5, 5},
		{"negative offset", "hello", true, hello, -1, wire.ReasonInvalidCursor, "hello", 5, 5},
		{"empty epoch", "hello", true, "", 2, wire.ReasonInvalidCursor, "hello", 5, 5},
		{"offset rolled out", "long", true, long.Epoch, 10, wire.ReasonOffsetRolledOut, zeros[36:], 100, 100},
		{"resume in a wrapped ring", "long", true, long.Epoch, 90, wire.ReasonResume, zeros[90:], 36, 100},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := attach(t, b, contract.AttachRequest{Token: token(tt.token), Viewer: viewer(100 + uint64(i)),
				View: true, HasCursor: tt.hasCursor, Epoch: tt.epoch, Offset: tt.offset})
			if resp.Spawned {
				t.Error("got Spawned, want an existing PTY")
			}
			if resp.Reason != tt.wantReason {
				t.Errorf("reason: got %q, want %q", resp.Reason, tt.wantReason)
			}
			reset := tt.wantReason != wire.ReasonResume
			if resp.Reset != reset || resp.Snapshot != reset {
				t.Errorf("reset, snapshot: got %v %v, want %v %v", resp.Reset, resp.Snapshot, reset, reset)
			}
			if resp.StartOffset != tt.wantStart || resp.ReplayEnd != tt.wantEnd {
				t.Errorf("window: got [%d, %d), want [%d, %d)", resp.StartOffset, resp.ReplayEnd, tt.wantStart, tt.wantEnd)
			}
			if !reset {
				if string(resp.Replay) != tt.wantReplay {
					t.Errorf("replay: got %q, want %q", resp.Replay, tt.wantReplay)
				}
				return
			}
			if !bytes.Contains(resp.Replay, []byte(tt.wantReplay)) || resp.SnapshotBytes != int64(len(resp.Replay)) ||
				resp.Cols != DefaultCols || resp.Rows != DefaultRows {
				t.Errorf("snapshot: got %q (%d bytes said, %dx%d), want it to show %q, %dx%d",
					resp.Replay, resp.SnapshotBytes, resp.Cols, resp.Rows, tt.wantReplay, DefaultCols, DefaultRows)
			}
		})
	}
}

func TestAttachSameNewTokenConcurrently(t *testing.T) {
	b, _ := newBackend(t, contract.BackendConfig{Argv: sh("exec sleep 30")})
	const n = 8
	resps := make([]contract.AttachResponse, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resps[i], errs[i] = b.Attach(context.Background(), contract.AttachRequest{Token: token("race"), Viewer: viewer(uint64(i + 1))})
		})
	}
	wg.Wait()
	spawns := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("attach %d: got error %v, want nil", i, errs[i])
		}
		if resps[i].Spawned {
			spawns++
		}
		if resps[i].Epoch != resps[0].Epoch {
			t.Errorf("attach %d: got epoch %q, want %q (one PTY)", i, resps[i].Epoch, resps[0].Epoch)
		}
	}
	if spawns != 1 {
		t.Errorf("got %d spawning attaches, want 1", spawns)
	}
	if infos, _ := b.List(context.Background()); len(infos) != 1 {
		t.Errorf("List: got %d PTYs, want 1", len(infos))
	}
}

func TestSupersede(t *testing.T) {
	ctx := context.Background()
	b, out := newBackend(t, contract.BackendConfig{Argv: []string{"cat"}})
	tok, first, second := token("cat"), viewer(1), viewer(2)

	r1 := attach(t, b, contract.AttachRequest{Token: tok, Viewer: first})
	if !r1.Superseded.IsZero() {
		t.Errorf("first attach: got Superseded %v, want none", r1.Superseded)
	}
	r2 := attach(t, b, contract.AttachRequest{Token: tok, Viewer: second})
	if r2.Superseded != first {
		t.Errorf("second attach: got Superseded %v, want %v", r2.Superseded, first)
	}

	wantErr(t, "Write from the superseded writer", b.Write(ctx, tok, first, []byte("first\n")), contract.ErrStaleTransport)
	wantErr(t, "Resize from the superseded writer", b.Resize(ctx, tok, first, 100, 30), contract.ErrStaleTransport)
	if err := b.Write(ctx, tok, second, []byte("second\n")); err != nil {
		t.Fatalf("Write from the writer: got error %v, want nil", err)
	}
	// The terminal echoes the line and cat prints it again.
	got := out.waitOutput(t, r2.Epoch, "second\r\nsecond\r\n")
	if bytes.Contains(got, []byte("first")) {
		t.Errorf("output %q holds the superseded writer's input", got)
	}

	wantErr(t, "late Detach of the superseded writer", b.Detach(ctx, tok, first), contract.ErrStaleTransport)
	if info, _ := listed(t, b, tok); info.Writer != second || !info.Detached.IsZero() {
		t.Errorf("after the stale detach: got writer %v detached %v, want %v and zero", info.Writer, info.Detached, second)
	}
	if r := attach(t, b, contract.AttachRequest{Token: tok, Viewer: second}); !r.Superseded.IsZero() {
		t.Errorf("writer attaching again: got Superseded %v, want none", r.Superseded)
	}
	if err := b.Detach(ctx, tok, second); err != nil {
		t.Errorf("Detach of the writer: got error %v, want nil", err)
	}
	if info, _ := listed(t, b, tok); !info.Writer.IsZero() || info.Detached.IsZero() {
		t.Errorf("after detach: got writer %v detached %v, want none and set", info.Writer, info.Detached)
	}
	wantErr(t, "second Detach", b.Detach(ctx, tok, second), contract.ErrStaleTransport)
	wantErr(t, "Write after detach", b.Write(ctx, tok, second, []byte("x")), contract.ErrStaleTransport)
}

func TestViewAttach(t *testing.T) {
	ctx := context.Background()
	b, _ := newBackend(t, contract.BackendConfig{Argv: []string{"cat"}})
	tok, writer, watcher := token("view"), viewer(1), viewer(2)

	attach(t, b, contract.AttachRequest{Token: tok, Viewer: writer})
	if r := attach(t, b, contract.AttachRequest{Token: tok, Viewer: watcher, View: true}); !r.Superseded.IsZero() {
		t.Errorf("view attach: got Superseded %v, want none", r.Superseded)
	}
	if info, _ := listed(t, b, tok); info.Writer != writer || info.Viewers != 1 {
		t.Errorf("after view attach: got writer %v viewers %d, want %v 1", info.Writer, info.Viewers, writer)
	}
	wantErr(t, "Write from a viewer", b.Write(ctx, tok, watcher, []byte("x")), contract.ErrStaleTransport)
	wantErr(t, "Resize from a viewer", b.Resize(ctx, tok, watcher, 100, 30), contract.ErrStaleTransport)
	if err := b.Write(ctx, tok, writer, []byte("x")); err != nil {
		t.Errorf("Write from the writer: got error %v, want nil", err)
	}
	if err := b.Detach(ctx, tok, watcher); err != nil {
		t.Errorf("Detach of a viewer: got error %v, want nil", err)
	}
	if info, _ := listed(t, b, tok); info.Writer != writer || info.Viewers != 0 {
		t.Errorf("after viewer detach: got writer %v viewers %d, want %v 0", info.Writer, info.Viewers, writer)
	}
	wantErr(t, "second viewer Detach", b.Detach(ctx, tok, watcher), contract.ErrStaleTransport)

}

// TestViewNeverSpawnsOrEvicts: a view attach of a token with no live PTY
// fails with ErrNoSuchTerminal, spawns nothing and evicts nothing, even at
// the session cap with a PTY to evict; a token whose PTY exited is no
// live PTY either.
func TestViewNeverSpawnsOrEvicts(t *testing.T) {
	ctx := context.Background()
	b, out := newBackend(t, contract.BackendConfig{Argv: sh("exec sleep 30"), MaxSessions: 1})
	old := attach(t, b, contract.AttachRequest{Token: token("old"), Viewer: viewer(1)})
	if err := b.Detach(ctx, token("old"), viewer(1)); err != nil {
		t.Fatalf("Detach: got error %v, want nil", err)
	}
	_, err := b.Attach(ctx, contract.AttachRequest{Token: token("unknown"), Viewer: viewer(2), View: true})
	wantErr(t, "view attach of an unknown token", err, contract.ErrNoSuchTerminal)
	if _, ok := listed(t, b, token("unknown")); ok {
		t.Error("a view attach spawned a PTY")
	}
	if info, ok := listed(t, b, token("old")); !ok || info.Pid != old.Pid || processGone(old.Pid) {
		t.Errorf("the detached PTY: got listed=%v, want it alive: a view evicts nothing", ok)
	}

	exited := attach(t, b, contract.AttachRequest{Token: token("old"), Viewer: viewer(3)})
	if err := b.Close(ctx, token("old")); err != nil {
		t.Fatalf("Close: got error %v, want nil", err)
	}
	out.waitExit(t, exited.Epoch)
	_, err = b.Attach(ctx, contract.AttachRequest{Token: token("old"), Viewer: viewer(4), View: true,
		HasCursor: true, Epoch: exited.Epoch, Offset: 0})
	wantErr(t, "view attach of a closed PTY's token", err, contract.ErrNoSuchTerminal)
	if infos, _ := b.List(ctx); len(infos) != 0 {
		t.Errorf("List: got %d PTYs, want none", len(infos))
	}
}

func TestExit(t *testing.T) {
	ctx := context.Background()
	b, out := newBackend(t, contract.BackendConfig{})
	tok := token("exit")
	r := attach(t, b, contract.AttachRequest{Token: tok, Viewer: viewer(1), Argv: sh("seq 1 20000; exit 3")})

	s := out.waitExit(t, r.Epoch)
	var want strings.Builder
	for i := 1; i <= 20000; i++ {
		fmt.Fprintf(&want, "%d\r\n", i)
	}
	if s.start != 0 || string(s.data) != want.String() {
		t.Errorf("output: got %d bytes from %d, want the %d bytes of seq from 0", len(s.data), s.start, want.Len())
	}
	if s.exit.ExitCode != 3 || s.exit.Offset != int64(want.Len()) || s.exit.Token != tok {
		t.Errorf("exit marker: got code %d offset %d token %q, want 3 %d %q", s.exit.ExitCode, s.exit.Offset, s.exit.Token, want.Len(), tok)
	}
	if _, ok := listed(t, b, tok); ok {
		t.Error("exited PTY still listed")
	}
	if !processGone(r.Pid) {
		t.Errorf("child %d not reaped", r.Pid)
	}
	wantErr(t, "Write after exit", b.Write(ctx, tok, viewer(1), []byte("x")), contract.ErrNotFound)
	wantErr(t, "Detach after exit", b.Detach(ctx, tok, viewer(1)), contract.ErrNotFound)

	r2 := attach(t, b, contract.AttachRequest{Token: tok, Viewer: viewer(1), HasCursor: true, Epoch: r.Epoch,
		Offset: s.exit.Offset, Argv: sh("exec sleep 30")})
	if !r2.Spawned || r2.Epoch == r.Epoch || r2.Reason != wire.ReasonEpochMismatch {
		t.Errorf("attach after exit: got spawned=%v epoch %q (old %q) reason %q, want a new PTY and %q",
			r2.Spawned, r2.Epoch, r.Epoch, r2.Reason, wire.ReasonEpochMismatch)
	}
}

// TestExitComplete streams a large output of a child that exits at once:
// every byte must arrive before the exit marker.
func TestExitComplete(t *testing.T) {
	const size = 8 << 20
	data := make([]byte, size)
	rand.Read(data)
	for i, c := range data {
		if c == '\n' { // the terminal would turn it into \r\n
			data[i] = 'n'
		}
	}
	file := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	// A ring larger than the output: this test is about the exit, not
	// about a slow stream.
	b, out := newBackend(t, contract.BackendConfig{Buffer: 2 * size})
	r := attach(t, b, contract.AttachRequest{Token: token("big"), Viewer: viewer(1), Argv: []string{"cat", file}})
	s := out.waitExit(t, r.Epoch)
	if len(s.data) != size || sha256.Sum256(s.data) != sha256.Sum256(data) {
		t.Errorf("got %d bytes, want the %d bytes of the file", len(s.data), size)
	}
	if s.exit.ExitCode != 0 {
		t.Errorf("exit code: got %d, want 0", s.exit.ExitCode)
	}
}

func TestTTLReap(t *testing.T) {
	ctx := context.Background()
	b, out := newBackend(t, contract.BackendConfig{Argv: sh("exec sleep 30"), TTL: 200 * time.Millisecond})
	detached := attach(t, b, contract.AttachRequest{Token: token("detached"), Viewer: viewer(1)})
	attached := attach(t, b, contract.AttachRequest{Token: token("attached"), Viewer: viewer(2)})
	watched := attach(t, b, contract.AttachRequest{Token: token("watched"), Viewer: viewer(3)})
	attach(t, b, contract.AttachRequest{Token: token("watched"), Viewer: viewer(3), View: true}) // the writer turns viewer
	if err := b.Detach(ctx, token("detached"), viewer(1)); err != nil {
		t.Fatalf("Detach: got error %v, want nil", err)
	}

	for _, r := range []contract.AttachResponse{detached, watched} {
		s := out.waitExit(t, r.Epoch)
		if s.exit.ExitCode != 128+int(syscall.SIGKILL) {
			t.Errorf("reaped PTY: got exit code %d, want %d", s.exit.ExitCode, 128+int(syscall.SIGKILL))
		}
		if !processGone(r.Pid) {
			t.Errorf("reaped PTY: process %d still there", r.Pid)
		}
	}
	infos, _ := b.List(ctx)
	if len(infos) != 1 || infos[0].Token != token("attached") {
		t.Errorf("List: got %+v, want only the attached PTY", infos)
	}
	if err := syscall.Kill(attached.Pid, 0); err != nil {
		t.Errorf("attached PTY's process: got %v, want alive", err)
	}
}

func TestSessionCap(t *testing.T) {
	ctx := context.Background()
	b, out := newBackend(t, contract.BackendConfig{Argv: sh("exec sleep 30"), MaxSessions: 2})
	a := attach(t, b, contract.AttachRequest{Token: token("a"), Viewer: viewer(1)})
	attach(t, b, contract.AttachRequest{Token: token("b"), Viewer: viewer(2)})

	_, err := b.Attach(ctx, contract.AttachRequest{Token: token("c"), Viewer: viewer(3)})
	wantErr(t, "Attach over the cap with every PTY attached", err, contract.ErrRegistryFull)
	// An attach to an existing PTY needs no room.
	attach(t, b, contract.AttachRequest{Token: token("b"), Viewer: viewer(4), View: true})

	if err := b.Detach(ctx, token("a"), viewer(1)); err != nil {
		t.Fatalf("Detach: got error %v, want nil", err)
	}
	if r := attach(t, b, contract.AttachRequest{Token: token("c"), Viewer: viewer(3)}); !r.Spawned {
		t.Error("attach after a detach: got an existing PTY, want a spawn")
	}
	s := out.waitExit(t, a.Epoch)
	if s.exit.ExitCode != 128+int(syscall.SIGKILL) {
		t.Errorf("evicted PTY: got exit code %d, want %d", s.exit.ExitCode, 128+int(syscall.SIGKILL))
	}
	if _, ok := listed(t, b, token("a")); ok {
		t.Error("evicted PTY still listed")
	}
	_, err = b.Attach(ctx, contract.AttachRequest{Token: token("d"), Viewer: viewer(5)})
	wantErr(t, "Attach over the cap again", err, contract.ErrRegistryFull)
}

func TestResize(t *testing.T) {
	ctx := context.Background()
	b, out := newBackend(t, contract.BackendConfig{})
	tok, w := token("resize"), viewer(1)
	r := attach(t, b, contract.AttachRequest{Token: tok, Viewer: w, Cols: 100, Rows: 30,
		Argv: sh("stty size; read x; stty size")})
	out.waitOutput(t, r.Epoch, "30 100\r\n")

	wantErr(t, "Resize to zero columns", b.Resize(ctx, tok, w, 0, 40), contract.ErrInvalidArgument)
	wantErr(t, "Resize of an unknown token", b.Resize(ctx, token("nothing"), w, 120, 40), contract.ErrNotFound)
	if err := b.Resize(ctx, tok, w, 120, 40); err != nil {
		t.Fatalf("Resize: got error %v, want nil", err)
	}
	if err := b.Write(ctx, tok, w, []byte("\n")); err != nil {
		t.Fatalf("Write: got error %v, want nil", err)
	}
	out.waitOutput(t, r.Epoch, "40 120\r\n")
	if s := out.waitExit(t, r.Epoch); s.exit.ExitCode != 0 {
		t.Errorf("exit code: got %d, want 0", s.exit.ExitCode)
	}
}

func TestCloseKillsGroup(t *testing.T) {
	ctx := context.Background()
	b, out := newBackend(t, contract.BackendConfig{})
	tok := token("close")
	r := attach(t, b, contract.AttachRequest{Token: tok, Viewer: viewer(1), Argv: sh(`sleep 30 & echo "bg=$!"; wait`)})
	m := regexp.MustCompile(`bg=(\d+)\r\n`).FindSubmatch(out.waitOutput(t, r.Epoch, "\r\n"))
	if m == nil {
		t.Fatal("no background pid in the output")
	}
	grandchild, _ := strconv.Atoi(string(m[1]))
	if err := syscall.Kill(grandchild, 0); err != nil {
		t.Fatalf("grandchild %d: got %v, want alive before Close", grandchild, err)
	}

	if err := b.Close(ctx, tok); err != nil {
		t.Fatalf("Close: got error %v, want nil", err)
	}
	if _, ok := listed(t, b, tok); ok {
		t.Error("closed PTY still listed")
	}
	wantErr(t, "second Close", b.Close(ctx, tok), contract.ErrNotFound)
	out.waitExit(t, r.Epoch)
	if !processGone(r.Pid) {
		t.Errorf("child %d still there after its exit marker", r.Pid)
	}
	waitGone(t, grandchild)
}

func TestLegacyToken(t *testing.T) {
	ctx := context.Background()
	b, out := newBackend(t, contract.BackendConfig{Argv: sh("exec sleep 30")})
	tok := "legacy-0123abcd"
	r := attach(t, b, contract.AttachRequest{Token: tok, Viewer: viewer(1)})
	if err := b.Close(ctx, tok); err != nil {
		t.Fatalf("Close: got error %v, want nil", err)
	}
	out.waitExit(t, r.Epoch)
}

func TestInvalidRequests(t *testing.T) {
	ctx := context.Background()
	b, _ := newBackend(t, contract.BackendConfig{Argv: sh("exec sleep 30")})
	for _, req := range []contract.AttachRequest{
		{Token: "short", Viewer: viewer(1)},
		{Token: "legacy-0123", Viewer: viewer(1)},
		{Token: token("bad") + "!", Viewer: viewer(1)},
		{Token: token("noviewer")},
		{Token: token("size"), Viewer: viewer(1), Cols: -1},
		{Token: token("size"), Viewer: viewer(1), Rows: 1 << 16},
	} {
		_, err := b.Attach(ctx, req)
		wantErr(t, fmt.Sprintf("Attach(%+v)", req), err, contract.ErrInvalidArgument)
	}
	unknown := token("unknown")
	wantErr(t, "Detach", b.Detach(ctx, unknown, viewer(1)), contract.ErrNotFound)
	wantErr(t, "Write", b.Write(ctx, unknown, viewer(1), []byte("x")), contract.ErrNotFound)
	wantErr(t, "Resize", b.Resize(ctx, unknown, viewer(1), 80, 24), contract.ErrNotFound)
	wantErr(t, "Close", b.Close(ctx, unknown), contract.ErrNotFound)
	_, err := b.Start(ctx, contract.BackendConfig{Buffer: -1})
	wantErr(t, "Start with a negative buffer", err, contract.ErrInvalidArgument)
	_, err = b.Attach(ctx, contract.AttachRequest{Token: token("nocmd"), Viewer: viewer(1), Argv: []string{"/nonexistent/cmd"}})
	if err == nil {
		t.Error("Attach with a missing command: got nil error")
	}
	if _, ok := listed(t, b, token("nocmd")); ok {
		t.Error("failed spawn listed")
	}
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	b := New(testLogger(t))
	t.Cleanup(b.Shutdown)
	_, err := b.Attach(ctx, contract.AttachRequest{Token: token("early"), Viewer: viewer(1)})
	wantErr(t, "Attach before Start", err, contract.ErrNotStarted)

	info, err := b.Start(ctx, contract.BackendConfig{Argv: sh("exec sleep 30")})
	if err != nil || info.Version != Version || info.Pid != os.Getpid() {
		t.Fatalf("Start: got %+v, %v, want version %q and our pid", info, err, Version)
	}
	// Start again (a new host) keeps the PTYs.
	r := attach(t, b, contract.AttachRequest{Token: token("kept"), Viewer: viewer(1)})
	if _, err := b.Start(ctx, contract.BackendConfig{Argv: sh("exec sleep 30"), MaxSessions: 4}); err != nil {
		t.Fatalf("second Start: got error %v, want nil", err)
	}
	if info, ok := listed(t, b, token("kept")); !ok || info.Epoch != r.Epoch {
		t.Errorf("after the second Start: got %+v listed=%v, want the same PTY", info, ok)
	}

	// A stream started late begins at the end and still sees the exit.
	var (
		mu   sync.Mutex
		outs []contract.Output
	)
	up := make(chan struct{})
	exited := make(chan struct{})
	b.testHookStream = func() { close(up) }
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- b.Output(sctx, func(_ context.Context, batch []contract.Output) error {
			mu.Lock()
			defer mu.Unlock()
			outs = append(outs, batch...)
			for _, o := range batch {
				if o.Exited {
					close(exited)
				}
			}
			return nil
		})
	}()
	<-up
	wantErr(t, "second Output", b.Output(ctx, nil), contract.ErrAlreadyLinked)

	b.Shutdown()
	b.Shutdown() // idempotent
	<-exited
	if err := <-errc; err != nil {
		t.Errorf("Output after Shutdown: got error %v, want nil", err)
	}
	mu.Lock()
	if len(outs) != 1 || !outs[0].Exited || outs[0].Epoch != r.Epoch {
		t.Errorf("stream: got %+v, want only the exit marker of %s", outs, r.Epoch)
	}
	mu.Unlock()
	if !processGone(r.Pid) {
		t.Errorf("process %d survived Shutdown", r.Pid)
	}
	_, err = b.Attach(ctx, contract.AttachRequest{Token: token("late"), Viewer: viewer(1)})
	wantErr(t, "Attach after Shutdown", err, contract.ErrStopped)
	_, err = b.Start(ctx, contract.BackendConfig{})
	wantErr(t, "Start after Shutdown", err, contract.ErrStopped)
	wantErr(t, "Output after Shutdown", b.Output(ctx, nil), contract.ErrStopped)
}

func TestOutputConcurrentPTYs(t *testing.T) {
	b, out := newBackend(t, contract.BackendConfig{Buffer: 4 << 20})
	const n, lines = 4, 5000
	epochs := make([]string, n)
	want := make([]string, n)
	for i := range n {
		first := (i + 1) * 100000
		r := attach(t, b, contract.AttachRequest{Token: token(fmt.Sprint("p", i)), Viewer: viewer(uint64(i + 1)),
			Argv: sh(fmt.Sprintf("seq %d %d", first, first+lines-1))})
		epochs[i] = r.Epoch
		var sb strings.Builder
		for k := range lines {
			fmt.Fprintf(&sb, "%d\r\n", first+k)
		}
		want[i] = sb.String()
	}
	for i, epoch := range epochs {
		s := out.waitExit(t, epoch)
		if s.start != 0 || string(s.data) != want[i] {
			t.Errorf("PTY %d: got %d bytes from %d, want its %d bytes in order", i, len(s.data), s.start, len(want[i]))
		}
	}
}

// TestReplayMatchesStream attaches while a child writes: each resume's
// replay must be exactly the streamed bytes just before its ReplayEnd, so
// a host that sends the replay and then the live output from ReplayEnd on
// sends every byte once; each reset attach gets a snapshot at an offset
// the stream reaches, no earlier than the previous attach's.
func TestReplayMatchesStream(t *testing.T) {
	ctx := context.Background()
	// A short scrollback: a snapshot of a model that fell out of the ring
	// rebuilds it from as many lines, which is slow under the race detector.
	b, out := newBackend(t, contract.BackendConfig{Buffer: 4 << 20, Scrollback: 10})
	tok, w := token("busy"), viewer(1)
	// The child writes without end (the stream paces it); a viewer
	// attaches after every kilobyte or so.
	first := attach(t, b, contract.AttachRequest{Token: tok, Viewer: w, Argv: sh("seq 1 1000000000")})
	var resps []contract.AttachResponse
	for i := range 20 {
		seen := int64(len(out.waitOutput(t, first.Epoch, "")))
		out.wait(t, first.Epoch, "more output", func(s *streamLog) bool { return int64(len(s.data)) > seen+1000 })
		resps = append(resps, attach(t, b, contract.AttachRequest{Token: tok, Viewer: viewer(uint64(i + 2)), View: true,
			HasCursor: i%2 == 1, Epoch: first.Epoch, Offset: first.ReplayEnd}))
	}
	if err := b.Close(ctx, tok); err != nil {
		t.Fatalf("Close: got error %v, want nil", err)
	}
	s := out.waitExit(t, first.Epoch)
	last := int64(0)
	for i, r := range resps {
		if r.Epoch != first.Epoch || r.ReplayEnd > int64(len(s.data)) || r.ReplayEnd < last {
			t.Errorf("attach %d: ReplayEnd %d, want it in the stream's %d bytes and past %d", i, r.ReplayEnd, len(s.data), last)
			continue
		}
		last = r.ReplayEnd
		if r.Snapshot {
			if r.StartOffset != r.ReplayEnd || !r.Reset {
				t.Errorf("attach %d: snapshot from %d to %d, reason %q; want one offset, a reset", i, r.StartOffset, r.ReplayEnd, r.Reason)
			}
			continue
		}
		if from := r.ReplayEnd - int64(len(r.Replay)); !bytes.Equal(s.data[from:r.ReplayEnd], r.Replay) {
			t.Errorf("attach %d: replay of %d bytes ending at %d differs from the stream", i, len(r.Replay), r.ReplayEnd)
		}
	}
}

// sizeScript draws a marker on the first and last rows of the screen at
// the size it starts at, leaving the cursor on the last row; for every
// line it reads (not echoed) it writes the terminal's size on the first
// row and puts the cursor back on the last, without redrawing.
const sizeScript = `stty -echo; printf '\033[H\033[2JFIRST-ROW\033[41;1HLAST-ROW'
while IFS= read -r x; do printf '\033[1;20Hsize %s\033[41;1H' "$(stty size)"; done`

// TestAttachTakesWritersSize: a writer's attach with its size resizes a
// live PTY before the replay is decided: the snapshot is of the screen
// at that size (the last rows, the cursor's, kept), the program sees the
// size, List reports it. A view attach's size changes nothing; a resume
// with a size still replays exactly the raw bytes it missed.
func TestAttachTakesWritersSize(t *testing.T) {
	ctx := context.Background()
	b, out := newBackend(t, contract.BackendConfig{})
	tok, w := token("size"), viewer(1)
	first := attach(t, b, contract.AttachRequest{Token: tok, Viewer: w, Cols: 128, Rows: 41, Argv: sh(sizeScript)})
	out.waitOutput(t, first.Epoch, "LAST-ROW")

	view := attach(t, b, contract.AttachRequest{Token: tok, Viewer: viewer(2), View: true, Cols: 100, Rows: 30})
	if view.Cols != 128 || view.Rows != 41 {
		t.Errorf("a view attach with a size: snapshot of %dx%d, want the PTY's 128x41", view.Cols, view.Rows)
	}
	if info, _ := listed(t, b, tok); info.Cols != 128 || info.Rows != 41 {
		t.Errorf("after a view attach with a size: PTY of %dx%d, want 128x41", info.Cols, info.Rows)
	}

	for _, size := range [][2]int{{100, 30}, {150, 50}} {
		cols, rows := size[0], size[1]
		r := attach(t, b, contract.AttachRequest{Token: tok, Viewer: viewer(uint64(cols)), Cols: cols, Rows: rows})
		if !r.Snapshot || r.Cols != cols || r.Rows != rows {
			t.Fatalf("writer attach at %dx%d: snapshot=%v of %dx%d, want a snapshot of %dx%d", cols, rows, r.Snapshot, r.Cols, r.Rows, cols, rows)
		}
		if info, _ := listed(t, b, tok); info.Cols != cols || info.Rows != rows {
			t.Errorf("after a writer attach at %dx%d: PTY of %dx%d", cols, rows, info.Cols, info.Rows)
		}
		// Drawn on a fresh terminal of that size, the snapshot shows the
		// last row where the cursor is, on the screen.
		tm := newTerm(cols, rows, 1000)
		tm.write(r.Replay)
		cur := tm.active().Cursor()
		if got := screenLine(tm, cur.Y); !strings.HasPrefix(got, "LAST-ROW") {
			t.Errorf("at %dx%d: the cursor's row %d shows %q, want LAST-ROW", cols, rows, cur.Y, got)
		}
		if want := map[int]string{30: "", 50: "                   size 30 100"}[rows]; screenLine(tm, 0) != want {
			t.Errorf("at %dx%d: the first row shows %q, want %q", cols, rows, screenLine(tm, 0), want)
		}
		if err := b.Write(ctx, tok, viewer(uint64(cols)), []byte("\n")); err != nil {
			t.Fatal(err)
		}
		out.waitOutput(t, first.Epoch, fmt.Sprintf("size %d %d", rows, cols))
	}

	// A resume with a size: the raw bytes after the cursor, nothing else.
	has := func(want string) func(*streamLog) bool {
		return func(s *streamLog) bool { return bytes.Contains(s.data, []byte(want)) }
	}
	seen := out.wait(t, first.Epoch, "the last size", has("size 50 150"))
	cursor := seen.start + int64(len(seen.data))
	if err := b.Write(ctx, tok, viewer(150), []byte("\n")); err != nil {
		t.Fatal(err)
	}
	all := out.wait(t, first.Epoch, "the size again", func(s *streamLog) bool { return bytes.Count(s.data, []byte("size 50 150")) == 2 })
	r := attach(t, b, contract.AttachRequest{Token: tok, Viewer: viewer(3), HasCursor: true, Epoch: first.Epoch, Offset: cursor, Cols: 90, Rows: 25})
	if want := all.data[cursor-all.start : min(r.ReplayEnd-all.start, int64(len(all.data)))]; r.Reset || r.Reason != wire.ReasonResume || !bytes.Equal(r.Replay, want) {
		t.Errorf("resume with a size: reset=%v reason %q replay %q, want the raw bytes %q", r.Reset, r.Reason, r.Replay, want)
	}
	if info, _ := listed(t, b, tok); info.Cols != 90 || info.Rows != 25 {
		t.Errorf("after a resume at 90x25: PTY of %dx%d", info.Cols, info.Rows)
	}
}

// screenLine is row y of tm's active screen, trailing blanks trimmed.
func screenLine(tm *term, y int) string {
	s := tm.active()
	var b strings.Builder
	for x := range tm.emu.Width() {
		if c := s.CellAt(x, y); c != nil && c.Content != "" {
			b.WriteString(c.Content)
		} else {
			b.WriteByte(' ')
		}
	}
	return strings.TrimRight(b.String(), " ")
}
