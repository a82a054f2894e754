package backendtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
	"github.com/tether-agent/tether/wire/vtquery"
)

// checks are Run's subtests, in order.
var checks = []check{
	{"Replay", checkReplay},
	{"ExactlyOnce", checkExactlyOnce},
	{"Supersede", checkSupersede},
	{"View", checkView},
	{"Snapshot", checkSnapshot},
	{"Exit", checkExit},
	{"Close", checkClose},
	{"TTL", checkTTL},
	{"Cap", checkCap},
	{"Resize", checkResize},
	{"OneStream", checkOneStream},
	{"ConcurrentAttach", checkConcurrentAttach},
	{"InvalidRequests", checkInvalidRequests},
}

type newBackendFunc = func(t *testing.T) contract.Backend

func checkReplay(t *testing.T, nb newBackendFunc) {
	const buffer = 64
	h := start(t, nb, contract.BackendConfig{Buffer: buffer})

	hello := h.attach(t, contract.AttachRequest{Token: h.token("hello"), Viewer: h.viewer(),
		Argv: sh("printf hello; exec sleep 60")})
	// Its snapshot stands where the screen model is: at 0, or past what
	// the child printed meanwhile.
	if !hello.Spawned || hello.Reason != wire.ReasonInitial || !hello.Reset || !hello.Superseded.IsZero() ||
		hello.StartOffset != hello.ReplayEnd || hello.ReplayEnd < 0 || hello.ReplayEnd > 5 {
		t.Errorf("first attach: got spawned=%v reason=%q reset=%v superseded=%v window [%d, %d), want true %q true none, a snapshot in [0, 5]",
			hello.Spawned, hello.Reason, hello.Reset, hello.Superseded, hello.StartOffset, hello.ReplayEnd, wire.ReasonInitial)
	}
	if hello.Pid <= 0 {
		t.Errorf("first attach: got Pid %d, want the child's", hello.Pid)
	}
	if s := h.out.waitEnd(t, hello.Epoch, 5); string(s.bytes(t, 0, 5)) != "hello" {
		t.Fatalf("stream: got %q, want %q from offset 0", s.bytes(t, 0, 5), "hello")
	}

	long := h.attach(t, contract.AttachRequest{Token: h.token("long"), Viewer: h.viewer(),
		Argv: sh("printf '%0100d' 0; exec sleep 60")})
	h.out.waitEnd(t, long.Epoch, 100) // the ring may wrap before the stream reads it
	zeros := strings.Repeat("0", 100)

	// A new token attached with a cursor (say, of a PTY that exited)
	// spawns a PTY of another epoch.
	again := h.attach(t, contract.AttachRequest{Token: h.token("cursor"), Viewer: h.viewer(),
		HasCursor: true, Epoch: hello.Epoch, Offset: 3, Argv: sh("exec sleep 60")})
	if !again.Spawned || again.Epoch == hello.Epoch || again.Reason != wire.ReasonEpochMismatch || !again.Reset {
		t.Errorf("spawning attach with another PTY's cursor: got spawned=%v epoch %q reason=%q reset=%v, want a new epoch and %q",
			again.Spawned, again.Epoch, again.Reason, again.Reset, wire.ReasonEpochMismatch)
	}

	tests := []struct {
		name       string
		token      string
		epoch      string
		cursor     bool
		offset     int64
		wantReason string
		wantFrom   int64 // a resume's replay is [from, end)
		wantEnd    int64
	}{
		{"initial", "hello", "", false, 0, wire.ReasonInitial, 0, 5},
		{"resume from start", "hello", hello.Epoch, true, 0, wire.ReasonResume, 0, 5},
		{"resume inside", "hello", hello.Epoch, true, 2, wire.ReasonResume, 2, 5},
		{"resume at end", "hello", hello.Epoch, true, 5, wire.ReasonResume, 5, 5},
		{"epoch mismatch", "hello", "0123456789abcdef", true, 2, wire.ReasonEpochMismatch, 0, 5},
		{"offset ahead", "hello", hello.Epoch, true, 6, wire.ReasonOffsetAhead, 0, 5},
		{"negative offset", "hello", hello.Epoch, true, -1, wire.ReasonInvalidCursor, 0, 5},
		{"empty epoch", "hello", "", true, 2, wire.ReasonInvalidCursor, 0, 5},
		{"offset rolled out", "long", long.Epoch, true, 10, wire.ReasonOffsetRolledOut, -1, 100},
		{"resume in a wrapped ring", "long", long.Epoch, true, 90, wire.ReasonResume, 90, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.attach(t, contract.AttachRequest{Token: h.token(tt.token), Viewer: h.viewer(), View: true,
				HasCursor: tt.cursor, Epoch: tt.epoch, Offset: tt.offset})
			if r.Spawned {
				t.Error("got Spawned, want the existing PTY")
			}
			if r.Reason != tt.wantReason {
				t.Errorf("reason: got %q, want %q", r.Reason, tt.wantReason)
			}
			if wantReset := tt.wantReason != wire.ReasonResume; r.Reset != wantReset {
				t.Errorf("reset: got %v, want %v", r.Reset, wantReset)
			}
			if r.ReplayEnd != tt.wantEnd {
				t.Errorf("ReplayEnd: got %d, want %d", r.ReplayEnd, tt.wantEnd)
			}
			content := "hello"
			if tt.token == "long" {
				content = zeros
			}
			if r.Reset {
				// A snapshot of the screen at the end, which shows the
				// content (of the ring at least).
				if !r.Snapshot || r.StartOffset != r.ReplayEnd || r.SnapshotBytes != int64(len(r.Replay)) {
					t.Errorf("reset attach: got snapshot=%v [%d, %d) with %d bytes (%d said), want a snapshot at one offset",
						r.Snapshot, r.StartOffset, r.ReplayEnd, len(r.Replay), r.SnapshotBytes)
				}
				if want := content[len(content)-min(len(content), buffer):]; !bytes.Contains(r.Replay, []byte(want)) {
					t.Errorf("snapshot %q: want it to show %q", r.Replay, want)
				}
				return
			}
			if n := r.ReplayEnd - r.StartOffset; n > buffer || r.StartOffset < 0 {
				t.Errorf("window: got [%d, %d), want at most the %d bytes of the ring", r.StartOffset, r.ReplayEnd, buffer)
			}
			if r.Snapshot {
				t.Error("resume: got a snapshot, want the raw bytes")
			}
			if want := content[tt.wantFrom:tt.wantEnd]; string(r.Replay) != want {
				t.Errorf("replay: got %q, want %q", r.Replay, want)
			}
		})
	}
}

// follower is a client of one PTY as the host serves it: it keeps the
// replay of its attach, then the stream's bytes from ReplayEnd on.
type follower struct {
	got []byte
	at  int64 // offset of the next byte it expects
}

// follow starts a follower at an attach: a snapshot holds no output
// bytes, the follower has the stream's from ReplayEnd on.
func follow(r contract.AttachResponse) *follower {
	if r.Snapshot {
		return &follower{at: r.ReplayEnd}
	}
	return &follower{got: bytes.Clone(r.Replay), at: r.ReplayEnd}
}

// take takes the stream's bytes up to offset to.
func (f *follower) take(t *testing.T, s stream, to int64) {
	t.Helper()
	f.got = append(f.got, s.bytes(t, f.at, to)...)
	f.at = to
}

// resume takes the replay of a reattach with the follower's cursor.
func (f *follower) resume(t *testing.T, who string, r contract.AttachResponse) {
	t.Helper()
	if r.Reason != wire.ReasonResume || r.Reset {
		t.Fatalf("%s: reattach at offset %d: got reason %q reset=%v, want %q", who, f.at, r.Reason, r.Reset, wire.ReasonResume)
	}
	if want := r.ReplayEnd - f.at; int64(len(r.Replay)) != want {
		t.Fatalf("%s: reattach at offset %d: got %d replay bytes, want [%d, %d)", who, f.at, len(r.Replay), f.at, r.ReplayEnd)
	}
	f.got = append(f.got, r.Replay...)
	f.at = r.ReplayEnd
}

func checkExactlyOnce(t *testing.T, nb newBackendFunc) {
	ctx := context.Background()
	h := start(t, nb, contract.BackendConfig{Buffer: 1 << 20})
	tok, w1, w2, v := h.token("once"), h.viewer(), h.viewer(), h.viewer()

	r1 := h.attach(t, contract.AttachRequest{Token: tok, Viewer: w1})
	epoch := r1.Epoch
	first := follow(r1)
	h.write(t, tok, w1, "alpha\n")
	s := h.out.waitOutput(t, epoch, "alpha\r\nalpha\r\n")
	first.take(t, s, s.end())
	if err := h.b.Detach(ctx, tok, w1); err != nil {
		t.Fatalf("Detach of the writer: got error %v, want nil", err)
	}

	// Another writer comes and goes while the first is away.
	r2 := h.attach(t, contract.AttachRequest{Token: tok, Viewer: w2})
	if r2.Spawned || r2.Epoch != epoch || !r2.Superseded.IsZero() {
		t.Errorf("second writer: got spawned=%v epoch %q superseded %v, want the same PTY and nobody superseded", r2.Spawned, r2.Epoch, r2.Superseded)
	}
	h.write(t, tok, w2, "beta\n")
	h.out.waitOutput(t, epoch, "beta\r\nbeta\r\n")
	if err := h.b.Detach(ctx, tok, w2); err != nil {
		t.Fatalf("Detach of the second writer: got error %v, want nil", err)
	}

	// A read-only viewer joins with the first writer's cursor.
	viewFrom := first.at
	view := &follower{at: viewFrom}
	view.resume(t, "viewer", h.attach(t, contract.AttachRequest{Token: tok, Viewer: v, View: true,
		HasCursor: true, Epoch: epoch, Offset: first.at}))

	// The first writer comes back with its cursor.
	r3 := h.attach(t, contract.AttachRequest{Token: tok, Viewer: w1, HasCursor: true, Epoch: epoch, Offset: first.at})
	first.resume(t, "first writer", r3)
	h.write(t, tok, w1, "gamma\n")
	h.out.waitOutput(t, epoch, "gamma\r\ngamma\r\n")

	if err := h.b.Close(ctx, tok); err != nil {
		t.Fatalf("Close: got error %v, want nil", err)
	}
	s = h.out.waitExit(t, epoch)
	end := s.exit.Offset
	first.take(t, s, end)
	view.take(t, s, end)
	all := s.bytes(t, 0, end)
	if !bytes.Equal(first.got, all[r1.ReplayEnd:]) {
		t.Errorf("writer that detached and reattached: got %q, want every byte from %d once: %q", first.got, r1.ReplayEnd, all[r1.ReplayEnd:])
	}
	if !bytes.Equal(view.got, all[viewFrom:]) {
		t.Errorf("viewer: got %q, want every byte from %d once: %q", view.got, viewFrom, all[viewFrom:])
	}
	if got := noCR(all); !strings.Contains(got, "alpha\nalpha\n") || !strings.Contains(got, "beta\nbeta\n") || !strings.Contains(got, "gamma\ngamma\n") {
		t.Errorf("output %q: want alpha, beta and gamma, each echoed and printed", got)
	}
}

func checkSupersede(t *testing.T, nb newBackendFunc) {
	ctx := context.Background()
	h := start(t, nb, contract.BackendConfig{})
	tok, first, second := h.token("cat"), h.viewer(), h.viewer()

	r1 := h.attach(t, contract.AttachRequest{Token: tok, Viewer: first})
	if !r1.Superseded.IsZero() {
		t.Errorf("first attach: got Superseded %v, want none", r1.Superseded)
	}
	r2 := h.attach(t, contract.AttachRequest{Token: tok, Viewer: second})
	if r2.Superseded != first || r2.Spawned || r2.Epoch != r1.Epoch {
		t.Errorf("second attach: got Superseded %v spawned=%v, want %v and the same PTY", r2.Superseded, r2.Spawned, first)
	}

	wantErr(t, "Write from the superseded writer", h.b.Write(ctx, tok, first, []byte("stale\n")), contract.ErrStaleTransport)
	wantErr(t, "Resize from the superseded writer", h.b.Resize(ctx, tok, first, 100, 30), contract.ErrStaleTransport)
	wantErr(t, "late Detach of the superseded writer", h.b.Detach(ctx, tok, first), contract.ErrStaleTransport)
	if info, _ := h.listed(t, tok); info.Writer != second || !info.Detached.IsZero() {
		t.Errorf("after the stale calls: got writer %v detached %v, want %v and zero", info.Writer, info.Detached, second)
	}
	h.write(t, tok, second, "fresh\n")
	// Writes are ordered: had "stale" reached the terminal, it would be
	// there before "fresh".
	if s := h.out.waitOutput(t, r1.Epoch, "fresh\r\nfresh\r\n"); bytes.Contains(s.data, []byte("stale")) {
		t.Errorf("output %q holds the superseded writer's input", s.data)
	}

	if r := h.attach(t, contract.AttachRequest{Token: tok, Viewer: second}); !r.Superseded.IsZero() {
		t.Errorf("the writer attaching again: got Superseded %v, want none", r.Superseded)
	}
	if err := h.b.Detach(ctx, tok, second); err != nil {
		t.Errorf("Detach of the writer: got error %v, want nil", err)
	}
	if info, _ := h.listed(t, tok); !info.Writer.IsZero() || info.Detached.IsZero() {
		t.Errorf("after its writer detached: got writer %v detached %v, want none and set", info.Writer, info.Detached)
	}
	wantErr(t, "second Detach", h.b.Detach(ctx, tok, second), contract.ErrStaleTransport)
	wantErr(t, "Write after Detach", h.b.Write(ctx, tok, second, []byte("x")), contract.ErrStaleTransport)
}

func checkView(t *testing.T, nb newBackendFunc) {
	ctx := context.Background()
	h := start(t, nb, contract.BackendConfig{})
	tok, writer, watcher := h.token("view"), h.viewer(), h.viewer()

	h.attach(t, contract.AttachRequest{Token: tok, Viewer: writer})
	if r := h.attach(t, contract.AttachRequest{Token: tok, Viewer: watcher, View: true}); !r.Superseded.IsZero() || r.Spawned {
		t.Errorf("view attach: got Superseded %v spawned=%v, want none and the existing PTY", r.Superseded, r.Spawned)
	}
	if info, _ := h.listed(t, tok); info.Writer != writer || info.Viewers != 1 {
		t.Errorf("after a view attach: got writer %v viewers %d, want %v 1", info.Writer, info.Viewers, writer)
	}
	wantErr(t, "Write from a viewer", h.b.Write(ctx, tok, watcher, []byte("x")), contract.ErrStaleTransport)
	wantErr(t, "Resize from a viewer", h.b.Resize(ctx, tok, watcher, 100, 30), contract.ErrStaleTransport)
	h.write(t, tok, writer, "x\n")
	if err := h.b.Detach(ctx, tok, watcher); err != nil {
		t.Errorf("Detach of a viewer: got error %v, want nil", err)
	}
	if info, _ := h.listed(t, tok); info.Writer != writer || info.Viewers != 0 {
		t.Errorf("after the viewer detached: got writer %v viewers %d, want %v 0", info.Writer, info.Viewers, writer)
	}
	wantErr(t, "second Detach of the viewer", h.b.Detach(ctx, tok, watcher), contract.ErrStaleTransport)

	// A view attach of a token with no PTY spawns nothing, with a cursor
	// or without.
	only := h.token("viewonly")
	for _, cursor := range []bool{false, true} {
		_, err := h.b.Attach(ctx, contract.AttachRequest{Token: only, Viewer: watcher, View: true, HasCursor: cursor, Epoch: "0123456789abcdef"})
		wantErr(t, fmt.Sprintf("view attach of a token with no PTY (cursor %v)", cursor), err, contract.ErrNoSuchTerminal)
	}
	if _, ok := h.listed(t, only); ok {
		t.Error("a view attach spawned a PTY")
	}
	// The writer's PTY turned over to a viewer: the writer's own view
	// attach makes it one, and the PTY stays.
	if r := h.attach(t, contract.AttachRequest{Token: tok, Viewer: writer, View: true}); r.Spawned || !r.Superseded.IsZero() {
		t.Errorf("the writer's view attach: got spawned=%v superseded %v, want neither", r.Spawned, r.Superseded)
	}
	if info, _ := h.listed(t, tok); !info.Writer.IsZero() || info.Viewers != 1 {
		t.Errorf("after the writer's view attach: got writer %v viewers %d, want none 1", info.Writer, info.Viewers)
	}
}

func checkExit(t *testing.T, nb newBackendFunc) {
	ctx := context.Background()
	h := start(t, nb, contract.BackendConfig{})
	tok, w := h.token("exit"), h.viewer()
	const lines = 2000
	r := h.attach(t, contract.AttachRequest{Token: tok, Viewer: w,
		Argv: sh(fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo line$i; i=$((i+1)); done; exit 3`, lines))})

	s := h.out.waitExit(t, r.Epoch)
	var want strings.Builder
	for i := range lines {
		fmt.Fprintf(&want, "line%d\n", i)
	}
	if got := noCR(s.bytes(t, 0, s.exit.Offset)); got != want.String() {
		t.Errorf("output: got %d bytes ending %q, want the %d lines, then the exit marker", len(got), clip([]byte(got)), lines)
	}
	if s.exit.ExitCode != 3 || s.exit.Token != tok {
		t.Errorf("exit marker: got code %d token %q, want 3 %q", s.exit.ExitCode, s.exit.Token, tok)
	}
	if _, ok := h.listed(t, tok); ok {
		t.Error("an exited PTY is still listed")
	}
	if err := h.b.Write(ctx, tok, w, []byte("x")); !errors.Is(err, contract.ErrNotFound) && !errors.Is(err, contract.ErrExited) {
		t.Errorf("Write after exit: got error %v, want contract.ErrNotFound", err)
	}
	if err := h.b.Detach(ctx, tok, w); !errors.Is(err, contract.ErrNotFound) && !errors.Is(err, contract.ErrExited) {
		t.Errorf("Detach after exit: got error %v, want contract.ErrNotFound", err)
	}
	if !waitGone(r.Pid) {
		t.Errorf("process %d still running after its exit marker", r.Pid)
	}

	r2 := h.attach(t, contract.AttachRequest{Token: tok, Viewer: w, HasCursor: true, Epoch: r.Epoch, Offset: s.exit.Offset,
		Argv: sh("exec sleep 60")})
	if !r2.Spawned || r2.Epoch == r.Epoch || r2.Reason != wire.ReasonEpochMismatch {
		t.Errorf("attach after exit: got spawned=%v epoch %q (old %q) reason %q, want a new PTY and %q",
			r2.Spawned, r2.Epoch, r.Epoch, r2.Reason, wire.ReasonEpochMismatch)
	}
}

func checkClose(t *testing.T, nb newBackendFunc) {
	ctx := context.Background()
	h := start(t, nb, contract.BackendConfig{})
	tok := h.token("close")
	r := h.attach(t, contract.AttachRequest{Token: tok, Viewer: h.viewer(), Argv: sh(`sleep 60 & echo "bg=$!"; wait`)})
	s := h.out.waitOutput(t, r.Epoch, "\n")
	m := regexp.MustCompile(`bg=(\d+)\r?\n`).FindSubmatch(s.data)
	if m == nil {
		t.Fatalf("no background pid in the output %q", s.data)
	}
	grandchild, _ := strconv.Atoi(string(m[1]))
	if err := syscall.Kill(grandchild, 0); err != nil {
		t.Fatalf("background process %d: got %v, want it running before Close", grandchild, err)
	}

	if err := h.b.Close(ctx, tok); err != nil {
		t.Fatalf("Close: got error %v, want nil", err)
	}
	h.out.waitExit(t, r.Epoch)
	if _, ok := h.listed(t, tok); ok {
		t.Error("a closed PTY is still listed")
	}
	wantErr(t, "second Close", h.b.Close(ctx, tok), contract.ErrNotFound)
	if !waitGone(r.Pid) {
		t.Errorf("child %d still running after Close", r.Pid)
	}
	if !waitGone(grandchild) {
		t.Errorf("background process %d of the PTY still running after Close: want the process group killed", grandchild)
	}
}

func checkTTL(t *testing.T, nb newBackendFunc) {
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	h := start(t, nb, contract.BackendConfig{Argv: sh("exec sleep 60"), TTL: ttl})
	w1, w2 := h.viewer(), h.viewer()

	watcher := h.viewer()
	watched := h.attach(t, contract.AttachRequest{Token: h.token("watched"), Viewer: watcher})
	watchedAt := time.Now()
	h.attach(t, contract.AttachRequest{Token: h.token("watched"), Viewer: watcher, View: true}) // the writer turns viewer
	attached := h.attach(t, contract.AttachRequest{Token: h.token("attached"), Viewer: w2})
	detached := h.attach(t, contract.AttachRequest{Token: h.token("detached"), Viewer: w1})
	detachedAt := time.Now()
	if err := h.b.Detach(ctx, h.token("detached"), w1); err != nil {
		t.Fatalf("Detach: got error %v, want nil", err)
	}
	for _, name := range []string{"watched", "detached"} {
		if info, _ := h.listed(t, h.token(name)); !info.Writer.IsZero() {
			t.Fatalf("%s PTY: got writer %v, want none, so that the TTL runs", name, info.Writer)
		}
	}

	for _, c := range []struct {
		name  string
		r     contract.AttachResponse
		since time.Time
	}{{"detached", detached, detachedAt}, {"watched", watched, watchedAt}} {
		h.out.waitExit(t, c.r.Epoch)
		if d := time.Since(c.since); d < ttl {
			t.Errorf("%s PTY: reaped after %v, want no sooner than the TTL %v", c.name, d, ttl)
		}
		if _, ok := h.listed(t, h.token(c.name)); ok {
			t.Errorf("%s PTY: still listed after its exit marker", c.name)
		}
		if !waitGone(c.r.Pid) {
			t.Errorf("%s PTY: process %d still running", c.name, c.r.Pid)
		}
	}
	if _, ok := h.listed(t, h.token("attached")); !ok || processGone(attached.Pid) {
		t.Errorf("attached PTY: got listed=%v, process gone=%v; want it alive", ok, processGone(attached.Pid))
	}
}

func checkCap(t *testing.T, nb newBackendFunc) {
	ctx := context.Background()
	h := start(t, nb, contract.BackendConfig{Argv: sh("exec sleep 60"), MaxSessions: 2})
	w := []contract.TransportID{h.viewer(), h.viewer(), h.viewer(), h.viewer()}
	a := h.attach(t, contract.AttachRequest{Token: h.token("a"), Viewer: w[0]})
	h.attach(t, contract.AttachRequest{Token: h.token("b"), Viewer: w[1]})

	_, err := h.b.Attach(ctx, contract.AttachRequest{Token: h.token("c"), Viewer: w[2]})
	wantErr(t, "Attach of a new token at the cap, every PTY attached", err, contract.ErrRegistryFull)
	if r := h.attach(t, contract.AttachRequest{Token: h.token("b"), Viewer: h.viewer(), View: true}); r.Spawned {
		t.Error("view attach of an existing PTY at the cap: got Spawned")
	}

	if err := h.b.Detach(ctx, h.token("a"), w[0]); err != nil {
		t.Fatalf("Detach: got error %v, want nil", err)
	}
	if r := h.attach(t, contract.AttachRequest{Token: h.token("c"), Viewer: w[2]}); !r.Spawned {
		t.Error("attach of a new token after a detach: got the existing PTY, want a spawn")
	}
	h.out.waitExit(t, a.Epoch)
	if _, ok := h.listed(t, h.token("a")); ok {
		t.Error("the evicted PTY is still listed")
	}
	_, err = h.b.Attach(ctx, contract.AttachRequest{Token: h.token("d"), Viewer: w[3]})
	wantErr(t, "Attach of a new token at the cap again", err, contract.ErrRegistryFull)
}

func checkResize(t *testing.T, nb newBackendFunc) {
	ctx := context.Background()
	h := start(t, nb, contract.BackendConfig{})
	tok, w := h.token("resize"), h.viewer()
	r := h.attach(t, contract.AttachRequest{Token: tok, Viewer: w, Cols: 100, Rows: 30,
		Argv: sh("stty size; read x; stty size; read x; stty size; exec cat")})
	h.out.waitOutput(t, r.Epoch, "30 100\r\n")

	wantErr(t, "Resize to zero columns", h.b.Resize(ctx, tok, w, 0, 40), contract.ErrInvalidArgument)
	if err := h.b.Resize(ctx, tok, w, 120, 40); err != nil {
		t.Fatalf("Resize: got error %v, want nil", err)
	}
	h.write(t, tok, w, "\n")
	h.out.waitOutput(t, r.Epoch, "40 120\r\n")

	// A view's size changes nothing; a writer's attach with its size
	// resizes the PTY before the snapshot, which is of that size.
	view := h.attach(t, contract.AttachRequest{Token: tok, Viewer: h.viewer(), View: true, Cols: 70, Rows: 20})
	wantSnapshot(t, "a view attach with a size", view, 120, 40)
	w2 := h.viewer()
	again := h.attach(t, contract.AttachRequest{Token: tok, Viewer: w2, Cols: 90, Rows: 25})
	wantSnapshot(t, "a writer's attach with its size", again, 90, 25)
	if info, ok := h.listed(t, tok); !ok || info.Cols != 90 || info.Rows != 25 {
		t.Errorf("after a writer's attach at 90x25: listed %v, size %dx%d, want 90x25", ok, info.Cols, info.Rows)
	}
	h.write(t, tok, w2, "\n")
	h.out.waitOutput(t, r.Epoch, "25 90\r\n")
}

func checkOneStream(t *testing.T, nb newBackendFunc) {
	h := start(t, nb, contract.BackendConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	err := h.b.Output(ctx, func(context.Context, []contract.Output) error {
		return errors.New("the second stream's sink must not be called")
	})
	wantErr(t, "a second Output stream", err, contract.ErrAlreadyLinked)

	tok, w := h.token("stream"), h.viewer()
	r := h.attach(t, contract.AttachRequest{Token: tok, Viewer: w})
	h.write(t, tok, w, "one\n")
	end := h.out.waitOutput(t, r.Epoch, "one\r\none\r\n").end()

	// A new stream after the first ended starts at the PTY's end.
	h.stopStream(t)
	h.startStream(t)
	deadline := time.Now().Add(waitTimeout)
	for {
		h.write(t, tok, w, "two\n")
		if h.out.waitFor(50*time.Millisecond, func() bool { return h.out.streams[r.Epoch] != nil }) {
			break
		}
		select {
		case <-h.stream.ended:
			// Over gRPC the first Output returns as soon as its context
			// ends, maybe before the backend has seen the stream end: a
			// new one may be refused for that long.
			if !errors.Is(h.stream.err, contract.ErrAlreadyLinked) {
				t.Fatalf("new Output stream: returned %v, want it running", h.stream.err)
			}
			h.startStream(t)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new Output stream shows nothing of a PTY that echoes its input, %v after the first ended", waitTimeout)
		}
	}
	s := h.out.waitOutput(t, r.Epoch, "two")
	if s.first < end {
		t.Errorf("new stream: first output at offset %d, want it at the end %d or later: a new stream replays nothing", s.first, end)
	}
}

func checkConcurrentAttach(t *testing.T, nb newBackendFunc) {
	const n = 8
	h := start(t, nb, contract.BackendConfig{Argv: sh("exec sleep 60")})
	tok := h.token("race")
	viewers := make([]contract.TransportID, n)
	for i := range viewers {
		viewers[i] = h.viewer()
	}
	resps := make([]contract.AttachResponse, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			defer cancel()
			resps[i], errs[i] = h.b.Attach(ctx, contract.AttachRequest{Token: tok, Viewer: viewers[i]})
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
			t.Errorf("attach %d: got epoch %q, want %q: one PTY", i, resps[i].Epoch, resps[0].Epoch)
		}
	}
	if spawns != 1 {
		t.Errorf("got %d spawning attaches of one new token, want 1", spawns)
	}
	infos, err := h.b.List(context.Background())
	if err != nil || len(infos) != 1 {
		t.Errorf("List: got %d PTYs (error %v), want 1", len(infos), err)
	}
}

func checkInvalidRequests(t *testing.T, nb newBackendFunc) {
	ctx := context.Background()
	h := start(t, nb, contract.BackendConfig{})
	for _, tok := range []string{"", "short", "has space_0123456789", "has/slash_0123456789", strings.Repeat("a", 129)} {
		_, err := h.b.Attach(ctx, contract.AttachRequest{Token: tok, Viewer: h.viewer()})
		wantErr(t, fmt.Sprintf("Attach with token %q", tok), err, contract.ErrInvalidArgument)
	}
	_, err := h.b.Attach(ctx, contract.AttachRequest{Token: h.token("noviewer")})
	wantErr(t, "Attach without a viewer", err, contract.ErrInvalidArgument)

	unknown, w := h.token("unknown"), h.viewer()
	wantErr(t, "Detach of an unknown token", h.b.Detach(ctx, unknown, w), contract.ErrNotFound)
	wantErr(t, "Write to an unknown token", h.b.Write(ctx, unknown, w, []byte("x")), contract.ErrNotFound)
	wantErr(t, "Resize of an unknown token", h.b.Resize(ctx, unknown, w, 80, 24), contract.ErrNotFound)
	wantErr(t, "Close of an unknown token", h.b.Close(ctx, unknown), contract.ErrNotFound)
	if infos, err := h.b.List(ctx); err != nil || len(infos) != 0 {
		t.Errorf("List: got %d PTYs (error %v), want none", len(infos), err)
	}
}

// snapshotScript asks the terminal every kind of question, then prints in
// colour, sets a title and input modes, and echoes its input.
const snapshotScript = `printf '\033[c\033[>c\033[6n\033[5n\033]10;?\007\033]11;?\033\\\033[?2004$p\033[>q\033P$qm\033\\\033[?u\033[18t'
printf '\033[1;31mRED\033[m plain \033]2;kit-title\007\033[?2004h\033[?1h SNAPMARK\n'
exec cat`

// bracketedPaste matches a DECSET that turns on bracketed paste mode.
var bracketedPaste = regexp.MustCompile(`\x1b\[\?(?:[0-9]+;)*2004(?:;[0-9]+)*h`)

func checkSnapshot(t *testing.T, nb newBackendFunc) {
	ctx := context.Background()
	h := start(t, nb, contract.BackendConfig{})
	tok, w := h.token("snap"), h.viewer()

	first := h.attach(t, contract.AttachRequest{Token: tok, Viewer: w, Cols: 100, Rows: 30, Argv: sh(snapshotScript)})
	wantSnapshot(t, "the spawning attach", first, 100, 30)
	seen := h.out.waitOutput(t, first.Epoch, "SNAPMARK\r\n").end()

	snap := h.attach(t, contract.AttachRequest{Token: tok, Viewer: h.viewer(), View: true})
	wantSnapshot(t, "a view attach without a cursor", snap, 100, 30)
	if snap.ReplayEnd < seen {
		t.Errorf("snapshot at offset %d, want it at %d or later: the output before the attach is in it", snap.ReplayEnd, seen)
	}
	for _, want := range []string{"RED", "plain", "SNAPMARK", "kit-title"} {
		if !bytes.Contains(snap.Replay, []byte(want)) {
			t.Errorf("snapshot %q: want it to show %q", snap.Replay, want)
		}
	}
	if !bracketedPaste.Match(snap.Replay) {
		t.Errorf("snapshot %q: want bracketed paste mode (?2004h) restored", snap.Replay)
	}

	// Live output after the snapshot is every byte from ReplayEnd on.
	fol := follow(snap)
	h.write(t, tok, w, "after\n")
	s := h.out.waitOutput(t, first.Epoch, "after\r\nafter\r\n")
	fol.take(t, s, s.end())
	if !bytes.Contains(fol.got, []byte("after\r\nafter\r\n")) {
		t.Errorf("output after the snapshot: got %q, want the echo of the input", fol.got)
	}

	// A valid cursor still gets the raw bytes.
	resume := h.attach(t, contract.AttachRequest{Token: tok, Viewer: h.viewer(), View: true, HasCursor: true, Epoch: snap.Epoch, Offset: snap.ReplayEnd})
	if resume.Reset || resume.Snapshot || resume.Reason != wire.ReasonResume {
		t.Errorf("attach with a valid cursor: got reset=%v snapshot=%v reason %q, want the raw bytes (%q)", resume.Reset, resume.Snapshot, resume.Reason, wire.ReasonResume)
	} else if want := s.bytes(t, snap.ReplayEnd, resume.ReplayEnd); !bytes.Equal(resume.Replay, want) {
		t.Errorf("resume from %d: got %q, want the raw bytes %q", snap.ReplayEnd, resume.Replay, want)
	}

	// Every reset reason gets a snapshot, of the size the PTY has now.
	if err := h.b.Resize(ctx, tok, w, 120, 40); err != nil {
		t.Fatalf("Resize: got error %v, want nil", err)
	}
	h.write(t, tok, w, "resized\n")
	end := h.out.waitOutput(t, first.Epoch, "resized\r\nresized\r\n").end()
	for _, c := range []struct {
		name   string
		req    contract.AttachRequest
		reason string
	}{
		{"epoch mismatch", contract.AttachRequest{HasCursor: true, Epoch: "0123456789abcdef", Offset: 1}, wire.ReasonEpochMismatch},
		{"offset ahead", contract.AttachRequest{HasCursor: true, Epoch: snap.Epoch, Offset: end + 1000}, wire.ReasonOffsetAhead},
		{"invalid cursor", contract.AttachRequest{HasCursor: true, Epoch: snap.Epoch, Offset: -5}, wire.ReasonInvalidCursor},
		{"initial", contract.AttachRequest{}, wire.ReasonInitial},
	} {
		c.req.Token, c.req.Viewer, c.req.View = tok, h.viewer(), true
		r := h.attach(t, c.req)
		if r.Reason != c.reason {
			t.Errorf("%s: got reason %q, want %q", c.name, r.Reason, c.reason)
		}
		wantSnapshot(t, c.name, r, 120, 40)
		if r.ReplayEnd < end || !bytes.Contains(r.Replay, []byte("resized")) {
			t.Errorf("%s: snapshot at %d %q, want it at %d or later, showing %q", c.name, r.ReplayEnd, r.Replay, end, "resized")
		}
	}
}

// wantSnapshot checks the fields of a reset attach's snapshot, and that it
// holds no terminal query.
func wantSnapshot(t *testing.T, what string, r contract.AttachResponse, cols, rows int) {
	t.Helper()
	if !r.Reset || !r.Snapshot {
		t.Errorf("%s: got reset=%v snapshot=%v, want a snapshot", what, r.Reset, r.Snapshot)
		return
	}
	if r.StartOffset != r.ReplayEnd || r.ReplayEnd < 0 {
		t.Errorf("%s: snapshot window [%d, %d), want StartOffset = ReplayEnd", what, r.StartOffset, r.ReplayEnd)
	}
	if r.SnapshotBytes != int64(len(r.Replay)) {
		t.Errorf("%s: SnapshotBytes %d, want the %d bytes of the snapshot", what, r.SnapshotBytes, len(r.Replay))
	}
	if r.Cols != cols || r.Rows != rows {
		t.Errorf("%s: snapshot of %dx%d, want %dx%d", what, r.Cols, r.Rows, cols, rows)
	}
	f := vtquery.New()
	if out := f.Flush(f.Append(nil, r.Replay)); f.Dropped() != 0 || !bytes.Equal(out, r.Replay) {
		t.Errorf("%s: snapshot %q holds %d terminal queries, want none", what, r.Replay, f.Dropped())
	}
}
