package pty

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

// waitTimeout guards every wait in these tests; reaching it is a failure,
// never a way to synchronise.
const waitTimeout = 10 * time.Second

func testLogger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
}

// newBackend starts a Backend with cfg and an Output stream into a
// collector, registered before it returns, so PTYs spawned afterwards are
// streamed from offset 0. Cleanup ends the stream and shuts the backend
// down.
func newBackend(t testing.TB, cfg contract.BackendConfig) (*Backend, *collector) {
	t.Helper()
	return newBackendWith(t, cfg, nil)
}

// newBackendWith is newBackend with setup called on the Backend first
// (to set test hooks).
func newBackendWith(t testing.TB, cfg contract.BackendConfig, setup func(*Backend)) (*Backend, *collector) {
	t.Helper()
	b := New(testLogger(t))
	if setup != nil {
		setup(b)
	}
	if _, err := b.Start(context.Background(), cfg); err != nil {
		t.Fatalf("Start: got error %v, want nil", err)
	}
	t.Cleanup(b.Shutdown)

	c := &collector{streams: make(map[string]*streamLog), changed: make(chan struct{})}
	up := make(chan struct{})
	b.testHookStream = func() { close(up) }
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- b.Output(ctx, c.sink) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Output: got error %v, want nil", err)
		}
		c.check(t)
	})
	select {
	case <-up:
	case err := <-errc:
		t.Fatalf("Output: got %v before the stream started", err)
	case <-time.After(waitTimeout):
		t.Fatal("Output stream did not start")
	}
	return b, c
}

// collector is an OutputSink that keeps every PTY's output by epoch and
// checks that it is contiguous and ends with one exit marker.
type collector struct {
	mu      sync.Mutex
	streams map[string]*streamLog // by epoch
	errs    []string
	changed chan struct{} // closed and replaced after every batch
}

// streamLog is one PTY's output as received.
type streamLog struct {
	start int64 // offset of data[0]
	data  []byte
	exit  *contract.Output
}

func (c *collector) sink(_ context.Context, outs []contract.Output) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range outs {
		s := c.streams[o.Epoch]
		if s == nil {
			s = &streamLog{start: o.Offset}
			c.streams[o.Epoch] = s
		}
		switch {
		case s.exit != nil:
			c.errs = append(c.errs, fmt.Sprintf("epoch %s: output at %d after the exit marker", o.Epoch, o.Offset))
		case o.Offset != s.start+int64(len(s.data)):
			c.errs = append(c.errs, fmt.Sprintf("epoch %s: got output at offset %d, want %d",
				o.Epoch, o.Offset, s.start+int64(len(s.data))))
		}
		if o.Exited {
			s.exit = &o
			continue
		}
		s.data = append(s.data, o.Data...)
	}
	close(c.changed)
	c.changed = make(chan struct{})
	return nil
}

// check reports contiguity errors.
func (c *collector) check(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.errs {
		t.Error(e)
	}
}

// wait waits until cond holds for the output of epoch and returns a copy
// of it.
func (c *collector) wait(t testing.TB, epoch, what string, cond func(*streamLog) bool) streamLog {
	t.Helper()
	timeout := time.NewTimer(waitTimeout)
	defer timeout.Stop()
	for {
		c.mu.Lock()
		s, ch := c.streams[epoch], c.changed
		if s != nil && cond(s) {
			cp := streamLog{start: s.start, data: slices.Clone(s.data), exit: s.exit}
			c.mu.Unlock()
			return cp
		}
		var got []byte
		if s != nil {
			got = slices.Clone(s.data)
		}
		c.mu.Unlock()
		select {
		case <-ch:
		case <-timeout.C:
			t.Fatalf("waiting for %s of epoch %s: timed out; output so far %q", what, epoch, got)
		}
	}
}

// waitOutput waits until the output of epoch contains want.
func (c *collector) waitOutput(t testing.TB, epoch, want string) []byte {
	t.Helper()
	s := c.wait(t, epoch, fmt.Sprintf("output %q", want), func(s *streamLog) bool {
		return bytes.Contains(s.data, []byte(want))
	})
	return s.data
}

// waitExit waits for the exit marker of epoch.
func (c *collector) waitExit(t testing.TB, epoch string) streamLog {
	t.Helper()
	return c.wait(t, epoch, "the exit marker", func(s *streamLog) bool { return s.exit != nil })
}

// token makes a valid attach token from name.
func token(name string) string { return "tok_" + name + "_0123456789abcdef" }

// viewer makes a transport identity.
func viewer(n uint64) contract.TransportID { return contract.TransportID{Instance: "test", Conn: n} }

// sh returns the argv that runs script with sh -c.
func sh(script string) []string { return []string{"/bin/sh", "-c", script} }

// attach attaches and fails the test on error.
func attach(t testing.TB, b *Backend, req contract.AttachRequest) contract.AttachResponse {
	t.Helper()
	resp, err := b.Attach(context.Background(), req)
	if err != nil {
		t.Fatalf("Attach(%s, %v): got error %v, want nil", req.Token, req.Viewer, err)
	}
	return resp
}

// wantErr fails the test unless errors.Is(err, want).
func wantErr(t testing.TB, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want %v", what, err, want)
	}
}

// listed returns the PTYInfo of token, if listed.
func listed(t testing.TB, b *Backend, token string) (contract.PTYInfo, bool) {
	t.Helper()
	infos, err := b.List(context.Background())
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

// waitGone waits until process pid is gone (or a zombie nobody reaps:
// this test process is not its parent). Polling real process state is the
// only way to observe it.
func waitGone(t testing.TB, pid int) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still running", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) state ...; comm may contain ") ".
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && strings.HasPrefix(string(stat[i+1:]), " Z")
}
