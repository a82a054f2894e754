package session

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/store"
)

// sharedStore is a store as a cluster shares it (it says whether its
// servers answer, Reachable), whose answers the test chooses.
type sharedStore struct {
	*store.Store
	// reach is what Reachable does (nil: answer at once).
	reach atomic.Pointer[func(context.Context) error]
	// getErr, when set, is GetSession's answer.
	getErr atomic.Pointer[error]
	// createErr, when set, is CreateSession's answer.
	createErr atomic.Pointer[error]
	probes    atomic.Int32
}

func (s *sharedStore) Reachable(ctx context.Context) error {
	s.probes.Add(1)
	if f := s.reach.Load(); f != nil {
		return (*f)(ctx)
	}
	return nil
}

func (s *sharedStore) GetSession(ctx context.Context, key string) (store.Session, error) {
	if err := s.getErr.Load(); err != nil {
		return store.Session{}, *err
	}
	return s.Store.GetSession(ctx, key)
}

func (s *sharedStore) CreateSession(ctx context.Context, sess store.Session) error {
	if err := s.createErr.Load(); err != nil {
		return *err
	}
	return s.Store.CreateSession(ctx, sess)
}

// noAnswer is what the cluster's store answers when its servers did not
// answer: store.ErrUnreachable, which comes with store.ErrUnavailable.
func noAnswer(cause error) error {
	return fmt.Errorf("get session: %w: %w: %w", cause, store.ErrUnreachable, store.ErrUnavailable)
}

// TestResumeSharedStoreUnreachable: a resume that would rebuild a
// session from a shared store whose servers do not answer (a cluster
// electing leaders) fails with ErrStoreUnreachable (5002, retry) within
// the ownership bound, whether the probe or a read meets it, and never
// with ErrStorageUnavailable (5003); a real storage fault still is 5003,
// and so is a create (which has no owner to retry); once the store
// answers the resume rebuilds the session with its history.
func TestResumeSharedStoreUnreachable(t *testing.T) {
	const bound = 200 * time.Millisecond
	inner, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := &sharedStore{Store: inner}
	tbl := NewTable(Config{Store: st, Agents: agent.NewEchoFactory(0), OwnersTimeout: bound, Log: zerolog.Nop()})
	t.Cleanup(func() {
		if err := tbl.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		inner.Close()
	})
	v := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}}
	var created Snapshot
	if err := tbl.Create(context.Background(), v, CreateOptions{Title: "stored", ForkCount: -1}, capture(v, &created)); err != nil {
		t.Fatal(err)
	}
	if _, err := tbl.Close(context.Background(), created.SessionID); err != nil {
		t.Fatal(err)
	}

	hang := func(ctx context.Context) error {
		<-ctx.Done() // no leader answers: the request waits out its bound
		return fmt.Errorf("asking the cluster's meta leader: %w: %w: %w", ctx.Err(), store.ErrUnreachable, store.ErrUnavailable)
	}
	refused := noAnswer(errors.New("JetStream system temporarily unavailable"))
	fault := fmt.Errorf("get session: %w: %w", errors.New("insufficient resources"), store.ErrUnavailable)
	tests := []struct {
		name   string
		target string
		reach  func(context.Context) error
		getErr error
		want   error
	}{
		{"the probe waits out its bound: retry", created.SessionKey, hang, nil, ErrStoreUnreachable},
		{"the probe is refused for now: retry", created.SessionKey, func(context.Context) error { return refused }, nil, ErrStoreUnreachable},
		{"a resume by title asks too: retry", "stored", hang, nil, ErrStoreUnreachable},
		{"the read is not answered: retry", created.SessionKey, nil, noAnswer(context.DeadlineExceeded), ErrStoreUnreachable},
		{"a storage fault is still one", created.SessionKey, nil, fault, ErrStorageUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.reach != nil {
				st.reach.Store(&tt.reach)
				defer st.reach.Store(nil)
			}
			if tt.getErr != nil {
				st.getErr.Store(&tt.getErr)
				defer st.getErr.Store(nil)
			}
			began := time.Now()
			var snap Snapshot
			err := tbl.Resume(context.Background(), v, tt.target, capture(v, &snap))
			took := time.Since(began)
			if !errors.Is(err, tt.want) {
				t.Fatalf("resume: got %v, want %v", err, tt.want)
			}
			if tt.want == ErrStoreUnreachable && errors.Is(err, ErrStorageUnavailable) {
				t.Errorf("resume: got %v, which is also ErrStorageUnavailable (5003)", err)
			}
			if took > bound+time.Second {
				t.Errorf("resume answered after %v, want within the bound %v (and a margin)", took, bound)
			}
			if len(tbl.Active()) != 0 {
				t.Errorf("after a refused resume: %d live sessions, want none", len(tbl.Active()))
			}
		})
	}

	t.Run("a create stays a storage fault", func(t *testing.T) {
		e := noAnswer(context.DeadlineExceeded)
		st.createErr.Store(&e)
		defer st.createErr.Store(nil)
		err := tbl.Create(context.Background(), v, CreateOptions{ForkCount: -1}, capture(v, new(Snapshot)))
		if !errors.Is(err, ErrStorageUnavailable) || errors.Is(err, ErrStoreUnreachable) {
			t.Fatalf("create: got %v, want ErrStorageUnavailable alone", err)
		}
	})

	t.Run("once it answers, the session is rebuilt", func(t *testing.T) {
		before := st.probes.Load()
		var snap Snapshot
		if err := tbl.Resume(context.Background(), v, created.SessionKey, capture(v, &snap)); err != nil {
			t.Fatal(err)
		}
		if snap.SessionKey != created.SessionKey || snap.Epoch != created.Epoch {
			t.Errorf("resumed %s epoch %s, want %s epoch %s", snap.SessionKey, snap.Epoch, created.SessionKey, created.Epoch)
		}
		if st.probes.Load() == before {
			t.Error("the rebuild did not ask the shared store whether it answers")
		}
	})
}
