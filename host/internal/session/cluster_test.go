package session

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/cluster/embedded"
	"github.com/tether-agent/tether/host/internal/cluster/owners"
	"github.com/tether-agent/tether/host/internal/ownership"
	"github.com/tether-agent/tether/host/store"
)

// kvModelChecks is how many runs the model test makes on the JetStream
// store unless -rapid.checks says otherwise: each step is several round
// trips to the server (about 0.4 s a run with -race), and the search for
// the table's own interleavings is TestTableCASMatchesModel's, with 250.
const kvModelChecks = "25"

// startNATS starts an embedded JetStream server for tb, shut down at its
// end.
func startNATS(tb testing.TB) *embedded.Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := embedded.Start(ctx, embedded.Config{StoreDir: tb.TempDir(), Log: zerolog.Nop()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(e.Shutdown)
	if err := e.WaitJetStream(ctx); err != nil {
		tb.Fatal(err)
	}
	return e
}

// kvOwners opens the ownership bucket on srv over a connection of its
// own, as a host does, closed at tb's end.
func kvOwners(tb testing.TB, srv *embedded.Server) *owners.KV {
	tb.Helper()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	k, err := owners.NewKV(context.Background(), js, owners.KVConfig{})
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// TestTableCASMatchesModelKV is the table's model test with its
// ownership store on JetStream KV (an embedded server): the same
// operations, the same checks after every step, the store's entries read
// back from the bucket.
func TestTableCASMatchesModelKV(t *testing.T) {
	withChecks(t, kvModelChecks)
	kv := kvOwners(t, startNATS(t))
	tbl, _, _ := newTestTableOwners(t, 0, kv)
	ctx := context.Background()
	checkTableCAS(t, tbl, ownerCount{
		// A Get per key: a List (a watch of the bucket) after every step
		// would make the test several times slower.
		of: func(keys []string) (int, error) {
			n := 0
			for _, key := range keys {
				_, _, err := kv.Get(ctx, key)
				switch {
				case err == nil:
					n++
				case !errors.Is(err, ownership.ErrNoOwner):
					return 0, err
				}
			}
			return n, nil
		},
		all: func() (int, error) {
			es, err := kv.List(ctx)
			return len(es), err
		},
	})
}

// host is one "host" of TestTwoHostsOneBucket: a table of its own, with
// its own connection to the bucket, over the shared database file.
type host struct {
	tbl *Table
	kv  *owners.KV
}

func newHost(tb testing.TB, srv *embedded.Server, db, name string) host {
	tb.Helper()
	st, err := store.Open(context.Background(), db)
	if err != nil {
		tb.Fatal(err)
	}
	kv := kvOwners(tb, srv)
	tbl := NewTable(Config{Store: st, Agents: agent.NewEchoFactory(0), Owners: kv, Host: name, Log: zerolog.Nop()})
	tb.Cleanup(func() {
		if err := tbl.Shutdown(context.Background()); err != nil {
			tb.Errorf("shutdown %s: %v", name, err)
		}
		st.Close()
	})
	return host{tbl: tbl, kv: kv}
}

// TestTwoHostsOneBucket: two tables ("hosts" a and b) over one ownership
// bucket and one database. While a owns a session (bound, or parked with
// no viewer), b's resume of it is refused as owned elsewhere and b builds
// nothing live. When ownership moves to b while a still serves the
// session (its entry removed under it, as a lapsed host's would be), every
// stale write of a — a viewer leaving, a bind, the close — is refused by
// the store and leaves b's entry as it was; b keeps binding and releases
// it in the end.
func TestTwoHostsOneBucket(t *testing.T) {
	srv := startNATS(t)
	db := filepath.Join(t.TempDir(), "state.db")
	a, b := newHost(t, srv, db, "a"), newHost(t, srv, db, "b")
	ctx := t.Context()
	viewer := func(inst string, conn uint64) *fakeViewer {
		return &fakeViewer{id: contract.TransportID{Instance: inst, Conn: conn}}
	}
	wantOwner := func(key, host, id string) uint64 {
		t.Helper()
		o, rev, err := a.kv.Get(ctx, key)
		if err != nil || o.Host != host || o.SessionID != id {
			t.Fatalf("owner of %s = %+v, %v; want session %s of host %s", key, o, err, id, host)
		}
		return rev
	}
	refused := func(h host, v *fakeViewer, key string) {
		t.Helper()
		var snap Snapshot
		err := h.tbl.Resume(ctx, v, key, capture(v, &snap))
		if !errors.Is(err, ErrOwnedElsewhere) {
			t.Fatalf("resume of %s on host %s: %v, want ErrOwnedElsewhere", key, h.tbl.host, err)
		}
	}

	va := viewer("a", 1)
	var snapA Snapshot
	if err := a.tbl.Create(ctx, va, CreateOptions{ForkCount: -1}, capture(va, &snapA)); err != nil {
		t.Fatal(err)
	}
	key := snapA.SessionKey
	wantOwner(key, "a", snapA.SessionID)

	refused(b, viewer("b", 1), key)
	// Parked on a (its one viewer gone), it is still a's.
	a.tbl.Detach(va.id, va.binding(snapA.SessionID))
	refused(b, viewer("b", 2), key)
	if n := len(b.tbl.Active()); n != 0 {
		t.Fatalf("host b has %d live sessions after refused resumes, want 0", n)
	}
	// a binds it again at its own revision.
	va2 := viewer("a", 2)
	var snap Snapshot
	if err := a.tbl.Resume(ctx, va2, key, capture(va2, &snap)); err != nil || snap.SessionID != snapA.SessionID {
		t.Fatalf("resume on a = %s, %v; want the live %s", snap.SessionID, err, snapA.SessionID)
	}
	revA := wantOwner(key, "a", snapA.SessionID)

	// Ownership moves to b while a still serves the session.
	if err := a.kv.Delete(ctx, key, revA); err != nil {
		t.Fatal(err)
	}
	vb := viewer("b", 3)
	var snapB Snapshot
	if err := b.tbl.Resume(ctx, vb, key, capture(vb, &snapB)); err != nil {
		t.Fatalf("resume on b once a's entry is gone: %v", err)
	}
	revB := wantOwner(key, "b", snapB.SessionID)

	errsBefore := testCounter(t, a.tbl.metrics.OwnerErrors)
	a.tbl.Detach(va2.id, va2.binding(snapA.SessionID)) // a viewer leaves: an update at a's revision
	if got := wantOwner(key, "b", snapB.SessionID); got != revB {
		t.Fatalf("a's stale teardown moved b's entry from revision %d to %d", revB, got)
	}
	refused(a, viewer("a", 3), key) // a bind on a: an update at a's revision
	a.tbl.mu.Lock()
	sa := a.tbl.byID[snapA.SessionID]
	a.tbl.mu.Unlock()
	if closed, err := a.tbl.Close(ctx, snapA.SessionID); err != nil || !closed {
		t.Fatalf("close on a = %v, %v", closed, err)
	}
	<-sa.released // its teardown gave ownership back: a delete at a's revision
	if got := wantOwner(key, "b", snapB.SessionID); got != revB {
		t.Fatalf("a's stale close moved b's entry from revision %d to %d", revB, got)
	}
	if n := testCounter(t, a.tbl.metrics.OwnerErrors) - errsBefore; n != 2 {
		t.Fatalf("host a counted %v refused ownership writes, want 2 (the viewer leaving, the close)", n)
	}

	// b's own writes go on from its revision.
	vb2 := viewer("b", 4)
	if err := b.tbl.Resume(ctx, vb2, key, capture(vb2, &snap)); err != nil || snap.SessionID != snapB.SessionID {
		t.Fatalf("second resume on b = %s, %v; want %s", snap.SessionID, err, snapB.SessionID)
	}
	if got := wantOwner(key, "b", snapB.SessionID); got <= revB {
		t.Fatalf("b's bind left its entry at revision %d, want past %d", got, revB)
	}
	b.tbl.mu.Lock()
	sb := b.tbl.byID[snapB.SessionID]
	b.tbl.mu.Unlock()
	if closed, err := b.tbl.Close(ctx, snapB.SessionID); err != nil || !closed {
		t.Fatalf("close on b = %v, %v", closed, err)
	}
	<-sb.released
	if _, _, err := a.kv.Get(ctx, key); !errors.Is(err, ownership.ErrNoOwner) {
		t.Fatalf("after b's close: owner lookup %v, want ErrNoOwner", err)
	}
}
