package backendtest_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/pty"
	"github.com/tether-agent/tether/testing/backendtest"
	"github.com/tether-agent/tether/testing/internal/kitcheck"
)

// brokenEnv names the broken backend TestBrokenHelper runs the kit on.
const brokenEnv = "BACKENDTEST_BROKEN"

// broken backends: each wraps a real pty.Backend and breaks one rule.
var broken = map[string]func(inner contract.Backend) contract.Backend{
	// The baseline: nothing broken.
	"none": func(inner contract.Backend) contract.Backend { return inner },
	// Detach and Write ignore the compare-and-swap on the writer: a
	// stale writer's detach detaches whoever writes now, its input goes
	// in.
	"no-cas": func(inner contract.Backend) contract.Backend { return &noCAS{inner} },
	// A view attach is taken as a writer's.
	"view-writes": func(inner contract.Backend) contract.Backend { return &viewWrites{inner} },
	// The cursor is ignored: every attach replays the whole ring.
	"no-resume": func(inner contract.Backend) contract.Backend { return &noResume{inner} },
	// A reset attach gets the raw ring, queries and all, as before
	// snapshots.
	"raw-reset": func(inner contract.Backend) contract.Backend { return &rawReset{inner} },
	// A view attach of an unknown token spawns a PTY.
	"view-spawns": func(inner contract.Backend) contract.Backend { return &viewSpawns{inner} },
	// A writer's size sizes only a PTY its attach spawns, as before the
	// PTY took the attaching writer's size.
	"size-on-spawn": func(inner contract.Backend) contract.Backend { return &sizeOnSpawn{inner} },
}

// TestBrokenHelper is not a test: TestKitFailsBrokenBackends runs it in a
// subprocess with brokenEnv set.
func TestBrokenHelper(t *testing.T) {
	name := os.Getenv(brokenEnv)
	if name == "" {
		t.Skip("helper process of TestKitFailsBrokenBackends")
	}
	wrap := broken[name]
	if wrap == nil {
		t.Fatalf("%s=%q: no such broken backend", brokenEnv, name)
	}
	backendtest.Run(t, func(t *testing.T) contract.Backend {
		b := pty.New(zerolog.Nop())
		t.Cleanup(b.Shutdown)
		return wrap(b)
	})
}

// TestKitFailsBrokenBackends checks that the kit catches each broken
// backend in the checks named, running it in a child process (the kit
// takes a *testing.T, so a failing run must be a failing test).
func TestKitFailsBrokenBackends(t *testing.T) {
	kitcheck.RunBroken(t, brokenEnv, "backend", []kitcheck.Broken{
		{Name: "none"},
		{Name: "no-cas", WantFail: []string{"Supersede"}},
		{Name: "view-writes", WantFail: []string{"View", "TTL"}},
		{Name: "no-resume", WantFail: []string{"Replay", "ExactlyOnce", "Snapshot"}},
		{Name: "raw-reset", WantFail: []string{"Replay", "Snapshot"}},
		{Name: "view-spawns", WantFail: []string{"View"}},
		{Name: "size-on-spawn", WantFail: []string{"Resize"}},
	})
}

// noCAS lets anyone detach or write as the current writer.
type noCAS struct{ contract.Backend }

func (n *noCAS) writer(ctx context.Context, token string) (contract.TransportID, bool) {
	infos, err := n.List(ctx)
	if err != nil {
		return contract.TransportID{}, false
	}
	for _, info := range infos {
		if info.Token == token && !info.Writer.IsZero() {
			return info.Writer, true
		}
	}
	return contract.TransportID{}, false
}

func (n *noCAS) Detach(ctx context.Context, token string, viewer contract.TransportID) error {
	err := n.Backend.Detach(ctx, token, viewer)
	if errors.Is(err, contract.ErrStaleTransport) {
		if w, ok := n.writer(ctx, token); ok {
			return n.Backend.Detach(ctx, token, w)
		}
		return nil
	}
	return err
}

func (n *noCAS) Write(ctx context.Context, token string, viewer contract.TransportID, data []byte) error {
	err := n.Backend.Write(ctx, token, viewer, data)
	if errors.Is(err, contract.ErrStaleTransport) {
		if w, ok := n.writer(ctx, token); ok {
			return n.Backend.Write(ctx, token, w, data)
		}
	}
	return err
}

// viewWrites attaches viewers as writers.
type viewWrites struct{ contract.Backend }

func (v *viewWrites) Attach(ctx context.Context, req contract.AttachRequest) (contract.AttachResponse, error) {
	req.View = false
	return v.Backend.Attach(ctx, req)
}

// noResume drops the client's cursor.
type noResume struct{ contract.Backend }

func (n *noResume) Attach(ctx context.Context, req contract.AttachRequest) (contract.AttachResponse, error) {
	req.HasCursor, req.Offset, req.Epoch = false, 0, ""
	return n.Backend.Attach(ctx, req)
}

// rawReset answers a reset attach with the raw bytes of the ring.
type rawReset struct{ contract.Backend }

func (r *rawReset) Attach(ctx context.Context, req contract.AttachRequest) (contract.AttachResponse, error) {
	req.OnHeader, req.OnReplay = nil, nil
	resp, err := r.Backend.Attach(ctx, req)
	if err != nil || !resp.Reset {
		return resp, err
	}
	infos, err := r.List(ctx)
	if err != nil {
		return resp, err
	}
	for _, info := range infos {
		if info.Token != req.Token {
			continue
		}
		raw, err := r.Backend.Attach(ctx, contract.AttachRequest{Token: req.Token, Viewer: req.Viewer, View: req.View,
			HasCursor: true, Epoch: resp.Epoch, Offset: info.StartOffset})
		if err != nil {
			return resp, err
		}
		raw.Reset, raw.Reason, raw.StartOffset = true, resp.Reason, info.StartOffset
		raw.Spawned, raw.Superseded = resp.Spawned, resp.Superseded
		return raw, nil
	}
	return resp, nil
}

// viewSpawns turns a view attach of an unknown token into a spawn.
type viewSpawns struct{ contract.Backend }

func (v *viewSpawns) Attach(ctx context.Context, req contract.AttachRequest) (contract.AttachResponse, error) {
	resp, err := v.Backend.Attach(ctx, req)
	if errors.Is(err, contract.ErrNoSuchTerminal) {
		req.View = false
		if resp, err = v.Backend.Attach(ctx, req); err == nil {
			req.View = true
			return v.Backend.Attach(ctx, req)
		}
	}
	return resp, err
}

// sizeOnSpawn drops the writer's size of an attach to a live PTY.
type sizeOnSpawn struct{ contract.Backend }

func (s *sizeOnSpawn) Attach(ctx context.Context, req contract.AttachRequest) (contract.AttachResponse, error) {
	infos, err := s.List(ctx)
	if err != nil {
		return contract.AttachResponse{}, err
	}
	for _, info := range infos {
		if info.Token == req.Token {
			req.Cols, req.Rows = 0, 0
		}
	}
	return s.Backend.Attach(ctx, req)
}
