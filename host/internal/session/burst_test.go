package session

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/store"
)

// TestSubmitBurstGroupCommitted: 2,000 prompts submitted at once, each
// to a session of its own, on a real SQLite store: each is served or
// answered ErrOverloaded (5003), never another error (5000), and the
// store commits them in groups: fewer transactions than submits.
func TestSubmitBurstGroupCommitted(t *testing.T) {
	const n = 2000
	tbl, st, _ := newTestTable(t, time.Minute)
	ctx := context.Background()
	sessions := make([]*Session, n)
	var made sync.WaitGroup
	failed := make(chan error, n)
	sem := make(chan struct{}, 64) // made 64 at a time: their writes are grouped too
	for i := range sessions {
		made.Add(1)
		sem <- struct{}{}
		go func() {
			defer made.Done()
			defer func() { <-sem }()
			v := &fakeViewer{id: contract.TransportID{Instance: "burst", Conn: uint64(i + 1)}}
			var snap Snapshot
			if err := tbl.Create(ctx, v, CreateOptions{Title: fmt.Sprintf("s%d", i), ForkCount: -1}, capture(v, &snap)); err != nil {
				failed <- err
				return
			}
			s, err := tbl.Lookup(snap.SessionID)
			if err != nil {
				failed <- err
				return
			}
			sessions[i] = s
		}()
	}
	made.Wait()
	close(failed)
	for err := range failed {
		t.Fatal(err)
	}
	before := st.WriteStats()
	start := make(chan struct{})
	var wg sync.WaitGroup
	var served, overloaded atomic.Int64
	errs := make(chan error, n)
	for _, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := s.SubmitBy("hello", "burst")
			switch {
			case err == nil:
				served.Add(1)
			case errors.Is(err, ErrOverloaded):
				overloaded.Add(1)
			default:
				errs <- err
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("submit: %v; want it served or ErrOverloaded", err)
	}
	after := st.WriteStats()
	commits, writes := after.Commits-before.Commits, after.Writes-before.Writes
	t.Logf("%d served, %d overloaded; %d writes in %d transactions, at most %d in one", served.Load(), overloaded.Load(), writes, commits, after.MaxGroup)
	if served.Load() == 0 {
		t.Error("no submit was served")
	}
	if commits >= uint64(served.Load()) {
		t.Errorf("transactions during the burst: got %d for %d submits served, want fewer (group commit)", commits, served.Load())
	}
}

// overloadedStore is a store whose StartTurn answers what the test
// chooses.
type overloadedStore struct {
	*store.Store
	turnErr atomic.Pointer[error]
}

func (s *overloadedStore) StartTurn(ctx context.Context, key string, prompt agent.Message, r store.Run) error {
	if err := s.turnErr.Load(); err != nil {
		return *err
	}
	return s.Store.StartTurn(ctx, key, prompt, r)
}

// TestSubmitOverloaded: a prompt whose turn could not be stored in time,
// as the store's queue says (*store.OverloadError) or as a write that
// ran out of time says (context.DeadlineExceeded), is ErrOverloaded
// with a retry hint, not ErrBuildFailed (5000); the session stays idle,
// and the same prompt is served once the store takes it.
func TestSubmitOverloaded(t *testing.T) {
	inner, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := &overloadedStore{Store: inner}
	tbl := NewTable(Config{Store: st, Agents: agent.NewEchoFactory(0), Log: zerolog.Nop()})
	t.Cleanup(func() {
		if err := tbl.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		inner.Close()
	})
	v := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}}
	var snap Snapshot
	if err := tbl.Create(context.Background(), v, CreateOptions{ForkCount: -1}, capture(v, &snap)); err != nil {
		t.Fatal(err)
	}
	s, err := tbl.Lookup(snap.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		err  error
		want time.Duration
	}{
		{"the queue said so", fmt.Errorf("start turn: %w", &store.OverloadError{Queued: 7, RetryAfter: 1500 * time.Millisecond, Err: context.Canceled}), 1500 * time.Millisecond},
		{"the write ran out of time", fmt.Errorf("start turn of k: begin: %w", context.DeadlineExceeded), defaultRetryAfter},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st.turnErr.Store(&tt.err)
			_, err := s.SubmitBy("hello", "")
			if !errors.Is(err, ErrOverloaded) || errors.Is(err, ErrBuildFailed) {
				t.Fatalf("submit: got %v, want ErrOverloaded", err)
			}
			if got, ok := RetryAfter(err); !ok || got != tt.want {
				t.Errorf("RetryAfter: got %v, %v; want %v, true", got, ok, tt.want)
			}
		})
	}
	st.turnErr.Store(nil)
	if _, err := s.SubmitBy("hello", ""); err != nil {
		t.Errorf("submit once the store takes it: %v", err)
	}
}
