package pty

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
)

// letters returns n pseudo-random letters: bytes a terminal passes through
// unchanged.
func letters(n int) []byte {
	const abc = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	r := rand.New(rand.NewPCG(1, 2))
	p := make([]byte, n)
	for i := range p {
		p[i] = abc[r.IntN(len(abc))]
	}
	return p
}

// writeFile writes p to a file in a temporary directory and returns its
// path.
func writeFile(t testing.TB, p []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(path, p, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestDrainWaitsForStream: with a 4 KiB ring and a linked stream that does
// not take its output, the drain stops reading (the child blocks in write,
// the ring never holds more than the stream has not sent); once the
// stream takes it, every byte of 1 MiB arrives, in order, then the exit
// marker.
func TestDrainWaitsForStream(t *testing.T) {
	const ringSize = 4 << 10
	want := letters(1 << 20)
	path := writeFile(t, want)

	b, waiting := startWaitingBackend(t, ringSize)

	c := &collector{streams: make(map[string]*streamLog), changed: make(chan struct{})}
	first := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	sink := func(ctx context.Context, outs []contract.Output) error {
		once.Do(func() {
			close(first)
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
		return c.sink(ctx, outs)
	}
	up := make(chan struct{})
	b.testHookStream = func() { close(up) }
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- b.Output(ctx, sink) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Output: got error %v, want nil", err)
		}
		c.check(t)
	})
	<-up

	resp := attach(t, b, contract.AttachRequest{Token: token("bp"), Viewer: viewer(1), Argv: []string{"cat", path}})
	timeout := time.After(waitTimeout)
	for _, ch := range []<-chan struct{}{first, waiting} {
		select {
		case <-ch:
		case <-timeout:
			close(release)
			t.Fatal("the stream's first batch or the drain's wait never came")
		}
	}
	// The stream holds its first batch and its cursor is 0: the drain
	// waits, so the ring holds at most one ring's worth and the child,
	// with a megabyte left to write, has not exited.
	info, ok := listed(t, b, token("bp"))
	switch {
	case !ok:
		t.Errorf("pty gone while its stream holds the first batch")
	case info.EndOffset > ringSize || info.StartOffset != 0 || info.Exited:
		t.Errorf("while the stream waits: got window [%d, %d) exited %v, want within [0, %d) and running",
			info.StartOffset, info.EndOffset, info.Exited, ringSize)
	}
	if processGone(resp.Pid) {
		t.Errorf("child exited while the stream held its output")
	}
	close(release)

	s := c.waitExit(t, resp.Epoch)
	if s.start != 0 || !bytes.Equal(s.data, want) {
		t.Fatalf("got %d bytes from offset %d, want the file's %d bytes from 0", len(s.data), s.start, len(want))
	}
	if s.exit.ExitCode != 0 || s.exit.Offset != int64(len(want)) {
		t.Errorf("exit marker %+v, want code 0 at %d", *s.exit, len(want))
	}
}

// TestDrainRunsFreeUnlinked: with no stream linked the drain does not
// wait: the child writes everything (it says so through a FIFO) and the
// ring keeps the latest bytes.
func TestDrainRunsFreeUnlinked(t *testing.T) {
	const ringSize = 4 << 10
	want := letters(1 << 20)
	path := writeFile(t, want)
	fifo := filepath.Join(t.TempDir(), "done")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	b := New(testLogger(t))
	if _, err := b.Start(context.Background(), contract.BackendConfig{Buffer: ringSize}); err != nil {
		t.Fatalf("Start: got error %v, want nil", err)
	}
	t.Cleanup(b.Shutdown)

	read := make(chan error, 1)
	go func() {
		p, err := os.ReadFile(fifo) // until the child has written its line
		if err == nil && string(p) != "done\n" {
			err = fmt.Errorf("fifo: got %q", p)
		}
		read <- err
	}()
	resp := attach(t, b, contract.AttachRequest{Token: token("free"), Viewer: viewer(1),
		Argv: sh("cat " + path + "; echo done > " + fifo + "; exec sleep 1000")})
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitTimeout):
		// Unblock the reader before failing.
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		<-read
		t.Fatal("the child never finished writing with no stream linked: the drain waited")
	}
	// The child has written everything; the drain may still be reading
	// the last of it from the PTY (nothing tells but the ring's end).
	info, _ := listed(t, b, token("free"))
	for deadline := time.Now().Add(waitTimeout); info.EndOffset < int64(len(want)); info, _ = listed(t, b, token("free")) {
		if time.Now().After(deadline) {
			t.Fatalf("the ring ends at %d after the child wrote %d bytes", info.EndOffset, len(want))
		}
		time.Sleep(time.Millisecond)
	}
	again := attach(t, b, contract.AttachRequest{Token: token("free"), Viewer: viewer(1), HasCursor: true, Epoch: resp.Epoch, Offset: info.StartOffset})
	end := int(again.ReplayEnd)
	if again.StartOffset != again.ReplayEnd-ringSize || !bytes.Equal(again.Replay, want[end-ringSize:end]) {
		t.Errorf("replay [%d, %d) (%d bytes), want the ring full of the child's bytes", again.StartOffset, again.ReplayEnd, len(again.Replay))
	}
}

// TestDrainReleasedOnUnlink: a drain waiting for a stream that never
// takes its output runs free once that stream ends, so the child can
// finish, and Shutdown does not hang.
func TestDrainReleasedOnUnlink(t *testing.T) {
	const ringSize = 4 << 10
	path := writeFile(t, letters(1<<20))
	fifo := filepath.Join(t.TempDir(), "done")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	b, waiting := startWaitingBackend(t, ringSize)
	up := make(chan struct{})
	b.testHookStream = func() { close(up) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- b.Output(ctx, func(ctx context.Context, _ []contract.Output) error {
			<-ctx.Done() // a sink that never takes anything
			return ctx.Err()
		})
	}()
	<-up

	read := make(chan error, 1)
	go func() {
		_, err := os.ReadFile(fifo)
		read <- err
	}()
	attach(t, b, contract.AttachRequest{Token: token("unlink"), Viewer: viewer(1),
		Argv: sh("cat " + path + "; echo done > " + fifo + "; exec sleep 1000")})
	unblock := func() {
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		<-read
	}
	select {
	case <-waiting:
	case <-time.After(waitTimeout):
		unblock()
		t.Fatal("the drain never waited for the stuck stream")
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Output: got error %v, want nil", err)
	}
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitTimeout):
		unblock()
		t.Fatal("the child never finished writing after the stream ended: the drain still waits")
	}
}

// startWaitingBackend starts a backend with a ring of ringSize bytes whose
// drain signals waiting (without blocking) each time it waits for room.
func startWaitingBackend(t *testing.T, ringSize int64) (*Backend, <-chan struct{}) {
	t.Helper()
	b := New(testLogger(t))
	waiting := make(chan struct{}, 1)
	b.testHookDrainWait = func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	if _, err := b.Start(context.Background(), contract.BackendConfig{Buffer: ringSize}); err != nil {
		t.Fatalf("Start: got error %v, want nil", err)
	}
	t.Cleanup(b.Shutdown)
	return b, waiting
}
