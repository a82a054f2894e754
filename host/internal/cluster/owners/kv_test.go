package owners

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tether-agent/tether/host/internal/cluster/bus"
	"github.com/tether-agent/tether/host/internal/cluster/clustertest"
	"github.com/tether-agent/tether/host/internal/ownership"
	"github.com/tether-agent/tether/host/internal/ownership/ownershiptest"
)

// TestKVConformance holds KV to the contract of every ownership
// store, and compares it with the in-memory store operation by operation
// (MatchesMem): revision 0, stale and foreign revisions, create after
// delete and concurrent writers included.
func TestKVConformance(t *testing.T) {
	srv := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, srv.ClientURL())
	ownershiptest.Run(t, func(tb testing.TB) ownership.Store {
		return openOwners(tb, js, KVConfig{Bucket: clustertest.NewBucket()})
	})
}

// TestBucketConfig: the bucket is created with history 1, file storage,
// the replicas asked for, and no direct gets.
func TestBucketConfig(t *testing.T) {
	srv := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, srv.ClientURL())
	openOwners(t, js, KVConfig{})
	st, err := js.Stream(t.Context(), "KV_"+Bucket)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.MaxMsgsPerSubject != 1 || cfg.Storage != jetstream.FileStorage || cfg.Replicas != 1 || cfg.AllowDirect || cfg.MirrorDirect {
		t.Fatalf("stream config: history %d, storage %v, replicas %d, allow direct %v, mirror direct %v; want 1, file, 1, false, false",
			cfg.MaxMsgsPerSubject, cfg.Storage, cfg.Replicas, cfg.AllowDirect, cfg.MirrorDirect)
	}
}

// spy counts the direct gets of a bucket's stream: what a replica (or
// a mirror) would answer, possibly with a stale value.
type spy struct {
	nc     *nats.Conn
	subj   string
	msgs   chan *nats.Msg
	fences int
}

func directSpy(tb testing.TB, nc *nats.Conn, bucket string) *spy {
	tb.Helper()
	s := &spy{nc: nc, subj: "$JS.API.DIRECT.GET.KV_" + bucket, msgs: make(chan *nats.Msg, 1024)}
	for _, subj := range []string{s.subj, s.subj + ".>"} {
		sub, err := nc.ChanSubscribe(subj, s.msgs)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		tb.Fatal(err)
	}
	return s
}

// count returns how many direct gets the server routed before this call
// (of those sent by requests that were answered before it): it publishes
// a fence on the spied subject from the spy's own connection and counts
// until the fence comes back, the server delivering in the order it
// routed.
func (s *spy) count(tb testing.TB) int {
	tb.Helper()
	s.fences++
	fence := fmt.Sprint(s.subj, ".fence.", s.fences)
	if err := s.nc.Publish(fence, nil); err != nil {
		tb.Fatal(err)
	}
	n := 0
	timeout := time.After(clustertest.Timeout)
	for {
		select {
		case m := <-s.msgs:
			if m.Subject == fence {
				return n
			}
			n++
		case <-timeout:
			tb.Fatalf("the spy's fence %s never came back", fence)
		}
	}
}

// TestGetNeverDirect: a Get is a message get answered by the stream
// leader, never a direct get (which any replica, or a mirror, may answer
// with a stale value). A spy on the direct-get subjects sees the library's
// default handle use them, and never a KV — not even after another
// client reconfigured the bucket with the library's KV calls (direct gets
// on again), and a KV opened after that turns them off again.
func TestGetNeverDirect(t *testing.T) {
	srv := clustertest.StartServer(t)
	spyConn, _ := clustertest.Connect(t, srv.ClientURL())
	_, js := clustertest.Connect(t, srv.ClientURL())
	ctx := t.Context()
	bucket := clustertest.NewBucket()

	// The control: a bucket made and read with the library's defaults.
	plain, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
	if err != nil {
		t.Fatal(err)
	}
	spied := directSpy(t, spyConn, bucket)
	if _, err := plain.Put(ctx, ownershiptest.Key(1), []byte(`{"session_id":"a"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Get(ctx, ownershiptest.Key(1)); err != nil {
		t.Fatalf("library default get: %v", err)
	}
	if spied.count(t) == 0 {
		t.Fatal("the library's default Get sent no direct get: the spy cannot see one")
	}

	k := openOwners(t, js, KVConfig{Bucket: bucket})
	for range 5 {
		if o, _, err := k.Get(ctx, ownershiptest.Key(1)); err != nil || o.SessionID != "a" {
			t.Fatalf("get = %+v, %v; want session a", o, err)
		}
	}
	if n := spied.count(t); n != 0 {
		t.Fatalf("KV.Get sent %d direct gets, want 0", n)
	}

	// Another client configures the bucket with the library's KV calls,
	// which always ask for direct gets: they are on again.
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket}); err != nil {
		t.Fatalf("reconfigure: %v", err)
	}
	if st, _ := js.Stream(ctx, "KV_"+bucket); !st.CachedInfo().Config.AllowDirect {
		t.Fatal("reconfiguring the bucket left direct gets off: this check checks nothing")
	}
	if _, _, err := k.Get(ctx, ownershiptest.Key(1)); err != nil {
		t.Fatal(err)
	}
	k2 := openOwners(t, js, KVConfig{Bucket: bucket})
	if _, _, err := k2.Get(ctx, ownershiptest.Key(1)); err != nil {
		t.Fatal(err)
	}
	if n := spied.count(t); n != 0 {
		t.Fatalf("after the bucket was reconfigured: %d direct gets, want 0", n)
	}
	if st, _ := js.Stream(ctx, "KV_"+bucket); st.CachedInfo().Config.AllowDirect {
		t.Fatal("a KV opened on the reconfigured bucket left direct gets on")
	}
}

// TestRevisionsAreStreamSequences: a revision is the bucket stream's
// sequence, shared by every key and taken by delete markers too: one
// key's revisions jump, and the next integer after a key's revision is
// another key's (so a caller that counts per key is refused).
func TestRevisionsAreStreamSequences(t *testing.T) {
	srv := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, srv.ClientURL())
	k := openOwners(t, js, KVConfig{Bucket: clustertest.NewBucket()})
	ctx := t.Context()
	k1, k2 := ownershiptest.Key(1), ownershiptest.Key(2)
	o := ownership.Owner{SessionID: "s"}

	r1, err := k.Create(ctx, k1, o)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := k.Create(ctx, k2, o)
	if err != nil {
		t.Fatal(err)
	}
	if r2 != r1+1 {
		t.Fatalf("revisions %d then %d of two keys: not consecutive stream sequences", r1, r2)
	}
	// Counting per key: k1's "next" revision is k2's.
	if _, err := k.Update(ctx, k1, o, r1+1); !errors.Is(err, ownership.ErrConflict) {
		t.Fatalf("update of %s at %d (its revision + 1): %v, want ErrConflict", k1, r1+1, err)
	}
	r3, err := k.Update(ctx, k1, o, r1)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Delete(ctx, k1, r3); err != nil {
		t.Fatal(err)
	}
	r5, err := k.Create(ctx, k1, o)
	if err != nil {
		t.Fatal(err)
	}
	// r3+1 is the delete marker's sequence.
	if r3 != r2+1 || r5 != r3+2 {
		t.Fatalf("revisions of %s: %d, %d, then %d after a delete; want %d, %d (a delete marker takes a sequence)", k1, r1, r3, r5, r2+1, r3+2)
	}
	if _, rev, err := k.Get(ctx, k1); err != nil || rev != r5 {
		t.Fatalf("get %s = rev %d, %v; want %d", k1, rev, err, r5)
	}
}

// TestCreateOverDeleteMarker: a deleted key keeps a delete marker (the
// bucket's one message for it), and creators racing over that marker from
// separate connections get exactly one winner, round after round.
func TestCreateOverDeleteMarker(t *testing.T) {
	srv := clustertest.StartServer(t)
	bucket := clustertest.NewBucket()
	_, js := clustertest.Connect(t, srv.ClientURL())
	first := openOwners(t, js, KVConfig{Bucket: bucket})
	const racers = 6
	owners := make([]*KV, racers)
	for i := range owners {
		_, js := clustertest.Connect(t, srv.ClientURL())
		owners[i] = openOwners(t, js, KVConfig{Bucket: bucket})
	}
	ctx := t.Context()
	key := ownershiptest.Key(7)
	rev, err := first.Create(ctx, key, ownership.Owner{SessionID: "first"})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 20 {
		if err := first.Delete(ctx, key, rev); err != nil {
			t.Fatalf("round %d: delete: %v", round, err)
		}
		// The race goes over a marker, not over an empty key.
		w, err := first.kv.Watch(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		e := <-w.Updates()
		bus.StopWatch(w)
		if e == nil || e.Operation() != jetstream.KeyValueDelete {
			t.Fatalf("round %d: last message of a deleted key = %v, want a delete marker", round, e)
		}

		revs := make([]uint64, racers)
		errs := make([]error, racers)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, k := range owners {
			wg.Go(func() {
				<-start
				revs[i], errs[i] = k.Create(ctx, key, ownership.Owner{SessionID: fmt.Sprint("r", round, "-", i)})
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("round %d: creators %d and %d both won over the delete marker", round, winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, ownership.ErrConflict):
				t.Fatalf("round %d: creator %d: %v, want ErrConflict", round, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no creator won: %v", round, errs)
		}
		o, got, err := first.Get(ctx, key)
		if err != nil || got != revs[winner] || o.SessionID != fmt.Sprint("r", round, "-", winner) {
			t.Fatalf("round %d: get = %+v at %d, %v; want the winner's at %d", round, o, got, err, revs[winner])
		}
		rev = got
	}
}

// TestErrorClasses: every error is one of the store's classes, wrapping
// the nats error too.
func TestErrorClasses(t *testing.T) {
	srv := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, srv.ClientURL())
	bucket := clustertest.NewBucket()
	k := openOwners(t, js, KVConfig{Bucket: bucket})
	ctx := t.Context()
	key := ownershiptest.Key(1)
	o := ownership.Owner{SessionID: "s"}
	rev, err := k.Create(ctx, key, o)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("conflict", func(t *testing.T) {
		_, err := k.Create(ctx, key, o)
		if !errors.Is(err, ownership.ErrConflict) || !errors.Is(err, jetstream.ErrKeyExists) {
			t.Errorf("create of an owned key: %v; want ErrConflict wrapping jetstream.ErrKeyExists", err)
		}
		_, err = k.Update(ctx, key, o, rev+100)
		if !errors.Is(err, ownership.ErrConflict) || !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			t.Errorf("update at a wrong revision: %v; want ErrConflict wrapping jetstream.ErrKeyRevisionMismatch", err)
		}
		err = k.Delete(ctx, key, rev+100)
		if !errors.Is(err, ownership.ErrConflict) || !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			t.Errorf("delete at a wrong revision: %v; want ErrConflict wrapping jetstream.ErrKeyRevisionMismatch", err)
		}
	})
	t.Run("no owner", func(t *testing.T) {
		_, _, err := k.Get(ctx, ownershiptest.Key(2))
		if !errors.Is(err, ownership.ErrNoOwner) || !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("get of a key never written: %v; want ErrNoOwner wrapping jetstream.ErrKeyNotFound", err)
		}
	})
	t.Run("invalid key", func(t *testing.T) {
		_, err := k.Create(ctx, "no spaces allowed", o)
		if !errors.Is(err, jetstream.ErrInvalidKey) || errors.Is(err, ownership.ErrConflict) || errors.Is(err, ownership.ErrUnavailable) {
			t.Errorf("create of an invalid key: %v; want jetstream.ErrInvalidKey and no store class", err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		dctx, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		defer cancel()
		_, _, err := k.Get(dctx, key)
		if !errors.Is(err, ownership.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("get past its deadline: %v; want ErrUnavailable wrapping context.DeadlineExceeded", err)
		}
		_, err = k.Update(dctx, key, o, rev)
		if !errors.Is(err, ownership.ErrUnavailable) {
			t.Errorf("update past its deadline: %v; want ErrUnavailable", err)
		}
	})
	t.Run("no bucket", func(t *testing.T) {
		// The bucket's stream is gone: writes find no responders.
		_, js2 := clustertest.Connect(t, srv.ClientURL())
		gone := openOwners(t, js2, KVConfig{Bucket: clustertest.NewBucket()})
		if err := js2.DeleteKeyValue(ctx, gone.bucket); err != nil {
			t.Fatal(err)
		}
		_, err := gone.Create(ctx, key, o)
		if !errors.Is(err, ownership.ErrUnavailable) || !errors.Is(err, jetstream.ErrNoStreamResponse) {
			t.Errorf("create in a deleted bucket: %v; want ErrUnavailable wrapping jetstream.ErrNoStreamResponse", err)
		}
		if _, _, err := gone.Get(ctx, key); !errors.Is(err, ownership.ErrUnavailable) {
			t.Errorf("get in a deleted bucket: %v; want ErrUnavailable (not ErrNoOwner: nobody may create it)", err)
		}
	})
	t.Run("server down", func(t *testing.T) {
		// A connection that keeps trying to reconnect to a server that is
		// gone: every call ends at its deadline.
		srv2 := clustertest.StartServer(t)
		_, js2 := clustertest.Connect(t, srv2.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond))
		down := openOwners(t, js2, KVConfig{Bucket: clustertest.NewBucket()})
		r, err := down.Create(ctx, key, o)
		if err != nil {
			t.Fatal(err)
		}
		srv2.Shutdown()
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		calls := map[string]error{}
		_, calls["create"] = down.Create(dctx, ownershiptest.Key(3), o)
		_, _, calls["get"] = down.Get(dctx, key)
		_, calls["update"] = down.Update(dctx, key, o, r)
		calls["delete"] = down.Delete(dctx, key, r)
		for name, err := range calls {
			if !errors.Is(err, ownership.ErrUnavailable) {
				t.Errorf("%s with the server down: %v; want ErrUnavailable", name, err)
			}
		}
	})
	t.Run("connection closed", func(t *testing.T) {
		nc2, js2 := clustertest.Connect(t, srv.ClientURL())
		closed := openOwners(t, js2, KVConfig{Bucket: bucket})
		nc2.Close()
		_, err := closed.Update(ctx, key, o, rev)
		if !errors.Is(err, ownership.ErrUnavailable) || !errors.Is(err, nats.ErrConnectionClosed) {
			t.Errorf("update on a closed connection: %v; want ErrUnavailable wrapping nats.ErrConnectionClosed", err)
		}
		if _, _, err := closed.Get(ctx, key); !errors.Is(err, ownership.ErrUnavailable) {
			t.Errorf("get on a closed connection: %v; want ErrUnavailable", err)
		}
	})
}

// TestList: the watch behind List ends at the initial-values marker —
// at once on an empty bucket and on one holding only delete markers,
// after every live key otherwise — also with more keys than the watch's
// channel holds and writes going on meanwhile.
func TestList(t *testing.T) {
	srv := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, srv.ClientURL())
	k := openOwners(t, js, KVConfig{Bucket: clustertest.NewBucket()})
	ctx := t.Context()
	list := func() map[string]Entry {
		t.Helper()
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		es, err := k.List(lctx)
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		m := map[string]Entry{}
		for _, e := range es {
			m[e.Key] = e
		}
		return m
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("empty bucket: %d entries", len(got))
	}
	rev, err := k.Create(ctx, ownershiptest.Key(0), ownership.Owner{SessionID: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Delete(ctx, ownershiptest.Key(0), rev); err != nil {
		t.Fatal(err)
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("bucket of delete markers: %d entries", len(got))
	}

	const n = 300 // more than the watch channel's 256
	revs := map[string]uint64{}
	for i := 1; i <= n; i++ {
		r, err := k.Create(ctx, ownershiptest.Key(i), ownership.Owner{SessionID: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		revs[ownershiptest.Key(i)] = r
	}
	// Writes to other keys while the list is read.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := n + 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := k.Create(ctx, ownershiptest.Key(i), ownership.Owner{SessionID: "late"}); err != nil {
				t.Errorf("create during list: %v", err)
				return
			}
		}
	})
	got := list()
	close(stop)
	wg.Wait()
	for key, r := range revs {
		e, ok := got[key]
		if !ok || e.Rev != r || e.Owner.SessionID == "late" {
			t.Fatalf("list: %s = %+v (present %v), want revision %d", key, e, ok, r)
		}
	}
	if _, ok := got[ownershiptest.Key(0)]; ok {
		t.Fatal("list has the deleted key")
	}
}

// busyKV answers the first n writes with the server's busy code, then
// passes them to the bucket.
type busyKV struct {
	jetstream.KeyValue
	code  jetstream.ErrorCode
	n     int // busy answers left
	calls int
}

func (b *busyKV) busy() error {
	b.calls++
	if b.n > 0 {
		b.n--
		return &jetstream.APIError{Code: 400, ErrorCode: b.code, Description: "wrong last sequence"}
	}
	return nil
}

func (b *busyKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if err := b.busy(); err != nil {
		// As the library returns it from a create: wrapped as a key
		// that exists.
		return 0, fmt.Errorf("%w: %w", err, jetstream.ErrKeyExists)
	}
	return b.KeyValue.Create(ctx, key, value, opts...)
}

func (b *busyKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if err := b.busy(); err != nil {
		return 0, fmt.Errorf("%w: %w", err, jetstream.ErrKeyRevisionMismatch)
	}
	return b.KeyValue.Update(ctx, key, value, rev)
}

func (b *busyKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	if err := b.busy(); err != nil {
		return fmt.Errorf("%w: %w", err, jetstream.ErrKeyRevisionMismatch)
	}
	return b.KeyValue.Delete(ctx, key, opts...)
}

// TestBusyIsAskedAgain: a write the server refused without deciding it
// (10164: another write of the key still in process, as for a moment
// after the previous one was acknowledged on a replicated stream; 10163:
// a new leader still applying its log) is asked again until decided, and
// is never a conflict; still busy when the context ends, it is
// ErrUnavailable.
func TestBusyIsAskedAgain(t *testing.T) {
	srv := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, srv.ClientURL())
	real := openOwners(t, js, KVConfig{Bucket: clustertest.NewBucket()})
	ctx := t.Context()
	for _, code := range []jetstream.ErrorCode{jetstream.JSErrCodeStreamWrongLastSequenceConstant, bus.CodeExpectedLastSeqNotReady} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			fake := &busyKV{KeyValue: real.kv, code: code}
			k := &KV{kv: fake, bucket: real.bucket}
			key := ownershiptest.Key(int(code))
			o := ownership.Owner{SessionID: "s"}

			fake.n, fake.calls = 3, 0
			rev, err := k.Create(ctx, key, o)
			if err != nil || fake.calls != 4 {
				t.Fatalf("create after 3 busy answers: %v after %d calls; want success on the 4th", err, fake.calls)
			}
			fake.n, fake.calls = 2, 0
			if rev, err = k.Update(ctx, key, o, rev); err != nil || fake.calls != 3 {
				t.Fatalf("update after 2 busy answers: %v after %d calls; want success on the 3rd", err, fake.calls)
			}
			fake.n, fake.calls = 1, 0
			if err := k.Delete(ctx, key, rev); err != nil || fake.calls != 2 {
				t.Fatalf("delete after a busy answer: %v after %d calls; want success on the 2nd", err, fake.calls)
			}
			if got := k.busyRetries.Load(); got != 6 {
				t.Fatalf("busy retries counted: %d, want 6", got)
			}

			fake.n = 1 << 30
			dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_, err = k.Create(dctx, key, o)
			if !errors.Is(err, ownership.ErrUnavailable) || errors.Is(err, ownership.ErrConflict) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("create busy until its deadline: %v; want ErrUnavailable (not ErrConflict) wrapping the deadline", err)
			}
			if _, _, err := k.Get(ctx, key); !errors.Is(err, ownership.ErrNoOwner) {
				t.Fatalf("after the busy create: %v, want no owner", err)
			}
		})
	}
}
