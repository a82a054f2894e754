package backendtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
)

// waitTimeout bounds every wait of the kit. Reaching it is a failure,
// never a way to synchronise.
const waitTimeout = 10 * time.Second

// defaultArgv is the command the kit configures with Start: a PTY that
// echoes its input (the terminal echoes the line, cat prints it again).
var defaultArgv = sh("exec cat")

// Run checks that the backends newBackend returns implement
// contract.Backend. Every check is a subtest of t with a backend of its
// own: Run calls newBackend once per check and must get a new, unstarted
// backend each time; it calls Start (Argv `/bin/sh -c 'exec cat'`, and the
// TTL, MaxSessions and Buffer the check needs), keeps an Output stream
// running into a sink that checks the offsets of every PTY, and spawns
// PTYs with small /bin/sh scripts given in AttachRequest.Argv. When the
// check ends it Closes every PTY still listed, waits for their exit
// markers, and ends the stream; whatever newBackend registers with
// t.Cleanup (Shutdown, killing a plugin process) runs after that.
//
// The backend must run on this machine: the kit checks processes by pid.
//
// The checks:
//
//   - Replay: the first attach spawns (reason initial, reset); attaches
//     with cursors replay exactly [offset, end) (resume) or, with reset
//     and the reason — epoch_mismatch, offset_ahead, invalid_cursor
//     (negative offset, empty epoch), offset_rolled_out (ring of 64
//     bytes) — a snapshot that shows what the ring holds; a resume
//     never replays more than Buffer bytes.
//   - ExactlyOnce: a client that keeps the bytes of its attach's replay
//     and of the stream from ReplayEnd on, detaches, and reattaches with
//     its offset and epoch while another writer came and went, has every
//     byte of the PTY exactly once; so has a read-only viewer.
//   - Supersede: a second writer's attach returns the first as
//     Superseded; the first's Write, Resize and Detach fail with
//     contract.ErrStaleTransport and change nothing.
//   - View: a view attach never supersedes, writes or resizes; a view
//     attach of a token with no PTY fails with
//     contract.ErrNoSuchTerminal and spawns nothing; the writer's own
//     view attach turns it into a viewer.
//   - Snapshot: every reset attach (initial, epoch_mismatch,
//     offset_ahead, invalid_cursor) answers a snapshot: Snapshot set,
//     StartOffset = ReplayEnd at or past the output seen before the
//     attach, SnapshotBytes its length, Cols×Rows the PTY's size (also
//     after a Resize), showing the text and title printed and bracketed
//     paste mode, and holding no terminal query (wire/vtquery finds
//     none) although the program asked many; live output follows from
//     ReplayEnd on; an attach with a valid cursor still gets the raw
//     bytes.
//   - Exit: every byte, then Output{Exited} with the exit code at the
//     end offset; then the PTY is not listed, its process is gone, and
//     its token spawns a new PTY with a new epoch.
//   - Close: Close kills the process group (a background grandchild too)
//     and removes the PTY; its exit marker follows; a second Close is
//     contract.ErrNotFound.
//   - TTL: a PTY detached (or only watched) for longer than the TTL is
//     killed and removed, no sooner; an attached one lives.
//   - Cap: at MaxSessions a new token evicts the PTY detached the
//     longest, else fails with contract.ErrRegistryFull; attaching to an
//     existing PTY needs no room.
//   - Resize: the PTY starts with the attach's size, and Resize changes
//     it (stty size sees both); a writer's attach with a size resizes
//     the PTY before its snapshot, which is of that size (stty size and
//     List see it too); a view attach's size changes nothing.
//   - OneStream: a second Output stream fails with
//     contract.ErrAlreadyLinked while one runs; a new stream starts at
//     each PTY's end offset, replaying nothing.
//   - ConcurrentAttach: attaches of one new token at once spawn one PTY.
//   - InvalidRequests: a malformed token or a zero viewer is
//     contract.ErrInvalidArgument; an unknown token is contract.ErrNotFound
//     for Detach, Write, Resize and Close.
//
// Across every check, the kit's Output sink also fails the check on
// output of one PTY out of order (overlapping a previous Output, or after
// the exit marker) and on an exit marker whose offset is not the end.
func Run(t *testing.T, newBackend func(t *testing.T) contract.Backend) {
	t.Helper()
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) { c.run(t, newBackend) })
	}
}

// check is one named subtest of Run.
type check struct {
	name string
	run  func(t *testing.T, newBackend func(t *testing.T) contract.Backend)
}

// harness is one started backend with an Output stream.
type harness struct {
	b     contract.Backend
	cfg   contract.BackendConfig
	out   *collector
	names map[string]string // token by name, so that a check can reuse a name
	next  uint64            // last viewer number handed out

	stream *outStream // the running Output stream
}

// outStream is one Output call running in a goroutine.
type outStream struct {
	cancel context.CancelFunc // ends it
	ended  chan struct{}      // closed when Output has returned
	err    error              // what Output returned; read after ended
}

// start starts a new backend with cfg and an Output stream, and waits
// until the stream is registered. Cleanup closes every PTY, waits for
// their exit markers, ends the stream and checks its output.
func start(t *testing.T, newBackend func(t *testing.T) contract.Backend, cfg contract.BackendConfig) *harness {
	t.Helper()
	b := newBackend(t)
	if b == nil {
		t.Fatal("newBackend returned nil")
	}
	if cfg.Argv == nil {
		cfg.Argv = defaultArgv
	}
	cfg.Instance = "backendtest"
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := b.Start(ctx, cfg); err != nil {
		t.Fatalf("Start: got error %v, want nil", err)
	}
	h := &harness{b: b, cfg: cfg, names: make(map[string]string)}
	h.startStream(t)
	t.Cleanup(func() {
		h.closeAll(t)
		h.stopStream(t)
	})
	h.syncStream(t)
	return h
}

// startStream runs Output into a new collector.
func (h *harness) startStream(t *testing.T) {
	t.Helper()
	h.out = newCollector()
	ctx, cancel := context.WithCancel(context.Background())
	st := &outStream{cancel: cancel, ended: make(chan struct{})}
	h.stream = st
	out := h.out
	go func() {
		defer close(st.ended)
		st.err = h.b.Output(ctx, out.sink)
	}()
}

// stopStream ends the Output stream and reports what its sink saw.
func (h *harness) stopStream(t *testing.T) {
	t.Helper()
	st := h.stream
	st.cancel()
	select {
	case <-st.ended:
		if st.err != nil && !errors.Is(st.err, context.Canceled) {
			t.Errorf("Output: returned %v when its context ended, want nil", st.err)
		}
	case <-time.After(waitTimeout):
		t.Errorf("Output: still running %v after its context ended", waitTimeout)
	}
	h.out.report(t)
}

// syncStream waits until the Output stream is registered: it spawns a PTY
// that echoes its input and writes to it until its output shows on the
// stream, then closes it. (A stream starts at each PTY's end offset, so
// output before it registered is not on it.)
func (h *harness) syncStream(t *testing.T) {
	t.Helper()
	tok, w := h.token("probe"), h.viewer()
	r := h.attach(t, contract.AttachRequest{Token: tok, Viewer: w, Argv: sh("exec cat")})
	deadline := time.Now().Add(waitTimeout)
	for {
		if err := h.b.Write(context.Background(), tok, w, []byte("p\n")); err != nil {
			t.Fatalf("Write to the probe PTY: got error %v, want nil", err)
		}
		if h.out.waitFor(50*time.Millisecond, func() bool {
			s := h.out.streams[r.Epoch]
			return s != nil && len(s.data) > 0
		}) {
			break
		}
		select {
		case <-h.stream.ended:
			t.Fatalf("Output returned %v before delivering anything", h.stream.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Output stream shows nothing of a PTY that echoes its input, %v after Start", waitTimeout)
		}
	}
	if err := h.b.Close(context.Background(), tok); err != nil {
		t.Fatalf("Close of the probe PTY: got error %v, want nil", err)
	}
	h.out.waitExit(t, r.Epoch)
}

// closeAll closes every listed PTY and waits for its exit marker, so that
// no process the kit spawned outlives the check.
func (h *harness) closeAll(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	infos, err := h.b.List(ctx)
	if err != nil {
		t.Errorf("List at cleanup: got error %v, want nil", err)
		return
	}
	for _, info := range infos {
		if err := h.b.Close(ctx, info.Token); err != nil && !errors.Is(err, contract.ErrNotFound) {
			t.Errorf("Close(%s) at cleanup: got error %v, want nil", info.Token, err)
			continue
		}
		if !h.out.waitExitFor(waitTimeout, info.Epoch) {
			t.Errorf("PTY %s: no exit marker %v after Close", info.Token, waitTimeout)
		}
		if info.Pid > 0 && !waitGone(info.Pid) {
			t.Errorf("PTY %s: process %d still running after its exit marker", info.Token, info.Pid)
		}
	}
}

// token returns the attach token for name in this check.
func (h *harness) token(name string) string {
	if tok, ok := h.names[name]; ok {
		return tok
	}
	tok := "bt_" + name + "_" + contract.RandomHex(8)
	h.names[name] = tok
	return tok
}

// viewer returns a new transport identity.
func (h *harness) viewer() contract.TransportID {
	h.next++
	return contract.TransportID{Instance: "backendtest", Conn: h.next}
}

// attach attaches and fails the test on an error.
func (h *harness) attach(t *testing.T, req contract.AttachRequest) contract.AttachResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	// Ask for the replay streamed; a backend may or may not stream it.
	var header *contract.AttachResponse
	var pieces []byte
	req.OnHeader = func(r contract.AttachResponse) {
		if header != nil || pieces != nil {
			t.Errorf("Attach(%s): OnHeader called twice or after OnReplay", req.Token)
		}
		header = &r
	}
	req.OnReplay = func(p []byte) {
		if header == nil {
			t.Errorf("Attach(%s): OnReplay called before OnHeader", req.Token)
		}
		pieces = append(pieces, p...)
	}
	resp, err := h.b.Attach(ctx, req)
	if err != nil {
		t.Fatalf("Attach(%s, %v, view=%v): got error %v, want nil", req.Token, req.Viewer, req.View, err)
	}
	if resp.Epoch == "" {
		t.Fatalf("Attach(%s): got an empty Epoch", req.Token)
	}
	if header != nil {
		if len(resp.Replay) != 0 || len(header.Replay) != 0 {
			t.Errorf("Attach(%s): streamed, yet the response or header holds %d+%d replay bytes", req.Token, len(resp.Replay), len(header.Replay))
		}
		if h := *header; h.Epoch != resp.Epoch || h.StartOffset != resp.StartOffset || h.ReplayEnd != resp.ReplayEnd ||
			h.Reset != resp.Reset || h.Reason != resp.Reason || h.Superseded != resp.Superseded || h.Pid != resp.Pid ||
			h.Snapshot != resp.Snapshot || h.SnapshotBytes != resp.SnapshotBytes || h.Cols != resp.Cols || h.Rows != resp.Rows {
			t.Errorf("Attach(%s): header %+v differs from the response %+v", req.Token, h, resp)
		}
		if header.Snapshot && header.SnapshotBytes != int64(len(pieces)) {
			t.Errorf("Attach(%s): header says a snapshot of %d bytes, %d streamed", req.Token, header.SnapshotBytes, len(pieces))
		}
		resp.Replay = pieces
	} else if pieces != nil {
		t.Errorf("Attach(%s): replay pieces without a header", req.Token)
	}
	return resp
}

// listed returns the PTYInfo of token, if it is listed.
func (h *harness) listed(t *testing.T, token string) (contract.PTYInfo, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	infos, err := h.b.List(ctx)
	if err != nil {
		t.Fatalf("List: got error %v, want nil", err)
	}
	for _, info := range infos {
		if info.Token == token {
			return info, true
		}
	}
	return contract.PTYInfo{}, false
}

// write writes data as viewer and fails the test on an error.
func (h *harness) write(t *testing.T, token string, viewer contract.TransportID, data string) {
	t.Helper()
	if err := h.b.Write(context.Background(), token, viewer, []byte(data)); err != nil {
		t.Fatalf("Write(%s, %v, %q): got error %v, want nil", token, viewer, data, err)
	}
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want %v", what, err, want)
	}
}

// sh returns the argv that runs script with /bin/sh -c.
func sh(script string) []string { return []string{"/bin/sh", "-c", script} }

// collector is the kit's OutputSink: it keeps each PTY's output by epoch
// and checks offsets as output arrives.
type collector struct {
	mu       sync.Mutex // guards the fields below
	streams  map[string]*stream
	problems []string
	changed  chan struct{} // closed and replaced after every batch
}

// stream is the output of one PTY, as received.
type stream struct {
	token string
	start int64  // offset of data[0]
	data  []byte // bytes from start on; a skipped range is zero-filled
	gaps  [][2]int64
	exit  *contract.Output
	first int64 // offset of the first Output received
}

// end is the offset after the last byte received.
func (s stream) end() int64 { return s.start + int64(len(s.data)) }

func newCollector() *collector {
	return &collector{streams: make(map[string]*stream), changed: make(chan struct{})}
}

func (c *collector) sink(_ context.Context, outs []contract.Output) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range outs {
		s := c.streams[o.Epoch]
		if s == nil {
			s = &stream{token: o.Token, start: o.Offset, first: o.Offset}
			c.streams[o.Epoch] = s
		}
		switch {
		case s.exit != nil:
			c.problemf("PTY %s (epoch %s): output at offset %d after its exit marker", o.Token, o.Epoch, o.Offset)
			continue
		case o.Token != s.token:
			c.problemf("epoch %s: output for token %s, earlier for %s", o.Epoch, o.Token, s.token)
		case o.Offset < s.end():
			c.problemf("PTY %s: output at offset %d, but bytes up to %d were already sent (every byte once)", o.Token, o.Offset, s.end())
			continue
		case o.Offset > s.end():
			// Allowed for a stream too slow for the ring; checks that
			// need every byte look at gaps.
			s.gaps = append(s.gaps, [2]int64{s.end(), o.Offset})
			s.data = append(s.data, make([]byte, o.Offset-s.end())...)
		}
		s.data = append(s.data, o.Data...)
		if o.Exited {
			e := o
			e.Data = nil
			s.exit = &e
			if o.Offset+int64(len(o.Data)) != s.end() {
				c.problemf("PTY %s: exit marker at offset %d, want the end %d", o.Token, o.Offset, s.end())
			}
		}
	}
	close(c.changed)
	c.changed = make(chan struct{})
	return nil
}

func (c *collector) problemf(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

func (c *collector) report(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.problems {
		t.Error(p)
	}
}

// waitFor waits up to d for cond, called with c.mu held.
func (c *collector) waitFor(d time.Duration, cond func() bool) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		c.mu.Lock()
		ok, ch := cond(), c.changed
		c.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		}
	}
}

// wait waits for cond on the stream of epoch and returns a copy of the
// stream.
func (c *collector) wait(t *testing.T, epoch, what string, cond func(s *stream) bool) stream {
	t.Helper()
	var cp stream
	ok := c.waitFor(waitTimeout, func() bool {
		s := c.streams[epoch]
		if s == nil || !cond(s) {
			return false
		}
		cp = *s
		cp.data = bytes.Clone(s.data)
		cp.gaps = append([][2]int64(nil), s.gaps...)
		return true
	})
	if !ok {
		c.mu.Lock()
		var got []byte
		if s := c.streams[epoch]; s != nil {
			got = bytes.Clone(s.data)
		}
		c.mu.Unlock()
		t.Fatalf("waiting for %s of epoch %s: nothing after %v; output so far %q", what, epoch, waitTimeout, clip(got))
	}
	return cp
}

// waitOutput waits until the output of epoch contains want and returns it.
func (c *collector) waitOutput(t *testing.T, epoch, want string) stream {
	t.Helper()
	return c.wait(t, epoch, fmt.Sprintf("output %q", want), func(s *stream) bool {
		return bytes.Contains(s.data, []byte(want))
	})
}

// waitEnd waits until the output of epoch reaches offset end.
func (c *collector) waitEnd(t *testing.T, epoch string, end int64) stream {
	t.Helper()
	return c.wait(t, epoch, fmt.Sprintf("output up to offset %d", end), func(s *stream) bool { return s.end() >= end })
}

// waitExit waits for the exit marker of epoch.
func (c *collector) waitExit(t *testing.T, epoch string) stream {
	t.Helper()
	return c.wait(t, epoch, "the exit marker", func(s *stream) bool { return s.exit != nil })
}

func (c *collector) waitExitFor(d time.Duration, epoch string) bool {
	return c.waitFor(d, func() bool { s := c.streams[epoch]; return s != nil && s.exit != nil })
}

// bytes returns the output of epoch in [from, to), which must have been
// received in full.
func (s *stream) bytes(t *testing.T, from, to int64) []byte {
	t.Helper()
	if from < s.start || to > s.end() || from > to {
		t.Fatalf("PTY %s: want bytes [%d, %d), received [%d, %d)", s.token, from, to, s.start, s.end())
	}
	for _, g := range s.gaps {
		if g[0] < to && g[1] > from {
			t.Fatalf("PTY %s: bytes [%d, %d) were skipped by the Output stream, want every byte", s.token, g[0], g[1])
		}
	}
	return s.data[from-s.start : to-s.start]
}

func clip(p []byte) []byte {
	if len(p) > 200 {
		return p[len(p)-200:]
	}
	return p
}

// noCR removes carriage returns (the terminal turns \n into \r\n).
func noCR(p []byte) string { return strings.ReplaceAll(string(p), "\r", "") }

// processGone reports whether pid is gone, or a zombie (whose parent has
// not reaped it yet; the kit is not its parent).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// pid (comm) state ...; comm may contain ") ".
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && bytes.HasPrefix(stat[i+1:], []byte(" Z"))
}

// waitGone waits until pid is gone. A process's end is not an event the
// kit can wait for, so it polls.
func waitGone(pid int) bool {
	deadline := time.Now().Add(waitTimeout)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
