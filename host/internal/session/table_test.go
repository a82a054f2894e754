package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"pgregory.net/rapid"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/ownership"
	"github.com/tether-agent/tether/host/store"
)

// fakeViewer records the frames the table sends it.
type fakeViewer struct {
	id        contract.TransportID
	transport string // "fake" when empty

	mu       sync.Mutex
	frames   [][]byte
	bindings map[string]Binding // by session id: what its binds gave it
	released []string           // ids of sessions released while bound
}

func (v *fakeViewer) ID() contract.TransportID { return v.id }

func (v *fakeViewer) Transport() string {
	if v.transport == "" {
		return "fake"
	}
	return v.transport
}

func (v *fakeViewer) Send(frame []byte) {
	v.mu.Lock()
	v.frames = append(v.frames, frame)
	v.mu.Unlock()
}

func (v *fakeViewer) Released(s *Session) {
	v.mu.Lock()
	delete(v.bindings, s.ID())
	v.released = append(v.released, s.ID())
	v.mu.Unlock()
}

// binding returns the binding v's last bind of session id gave it.
func (v *fakeViewer) binding(id string) []Binding {
	v.mu.Lock()
	defer v.mu.Unlock()
	if b, ok := v.bindings[id]; ok {
		return []Binding{b}
	}
	return nil
}

// countingFactory counts agents built and closed.
type countingFactory struct {
	inner agent.Factory

	mu            sync.Mutex
	built, closed int
}

func (f *countingFactory) NewAgent(ctx context.Context, key string, state json.RawMessage) (agent.Agent, error) {
	a, err := f.inner.NewAgent(ctx, key, state)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.built++
	f.mu.Unlock()
	return &countingAgent{Agent: a, f: f}, nil
}

type countingAgent struct {
	agent.Agent
	f *countingFactory
}

func (a *countingAgent) Close() error {
	a.f.mu.Lock()
	a.f.closed++
	a.f.mu.Unlock()
	return a.Agent.Close()
}

func newTestTable(tb testing.TB, grace time.Duration) (*Table, *store.Store, *countingFactory) {
	tb.Helper()
	return newTestTableOwners(tb, grace, nil)
}

// newTestTableOwners is newTestTable with the ownership store owners
// (nil: a new ownership.Mem).
func newTestTableOwners(tb testing.TB, grace time.Duration, owners ownership.Store) (*Table, *store.Store, *countingFactory) {
	tb.Helper()
	st, err := store.Open(context.Background(), filepath.Join(tb.TempDir(), "state.db"))
	if err != nil {
		tb.Fatalf("open store: %v", err)
	}
	f := &countingFactory{inner: agent.NewEchoFactory(0)}
	tbl := NewTable(Config{Store: st, Agents: f, Owners: owners, OrphanGrace: grace, Log: zerolog.Nop()})
	tb.Cleanup(func() {
		if err := tbl.Shutdown(context.Background()); err != nil {
			tb.Errorf("shutdown: %v", err)
		}
		st.Close()
	})
	return tbl, st, f
}

// capture is the Reply of a bind of v: it keeps the snapshot and v's
// binding.
func capture(v *fakeViewer, snap *Snapshot) Reply {
	return func(b Binding, s Snapshot, _ func([]byte)) {
		*snap = s
		v.mu.Lock()
		if v.bindings == nil {
			v.bindings = make(map[string]Binding)
		}
		v.bindings[s.SessionID] = b
		v.mu.Unlock()
	}
}

// model is the reference the table's compare-and-swap is checked
// against: per live session, its key, viewers and binding generation.
type model struct {
	live map[string]*modelRec // by runtime id
	gens map[string][]uint64  // every generation each session had
}

type modelRec struct {
	id, key string
	cod     bool
	gen     uint64
	viewers map[contract.TransportID]bool
}

func (m *model) byKey(key string) *modelRec {
	for _, r := range m.live {
		if r.key == key {
			return r
		}
	}
	return nil
}

func (m *model) bind(r *modelRec, v contract.TransportID) {
	r.gen++
	r.viewers[v] = true
	m.gens[r.id] = append(m.gens[r.id], r.gen)
}

// TestTableCASMatchesModel drives the table with random creates, resumes,
// disconnects (with current and stale generations), reaps (current and
// stale timers) and closes, and checks it against the model after every
// step: a stale teardown only ever drops its own viewer, at most one live
// session per key, a session with a viewer is never reaped, and the
// ownership store records every live session's binding and nothing else.
//
// It catches the two teardown mutations it was written for, in every
// run with the default 250 checks (modelChecks):
//
//  1. In decide's Disconnected branch, a close_on_disconnect session is
//     closed by its last viewer's departure even when the caller's
//     generation is stale (`if v.current {` under
//     `if v.closeOnDisconnect && !v.run {` made `if true {`). Expected
//     failure: "disconnect removed = true, want false".
//  2. In decide's OrphanReap branch, a reap timer closes the session
//     without checking that its generation is still current
//     (`if !v.current || v.viewers > 0 {` made `if v.viewers > 0 {`).
//     Expected failure: "reap(gen 1, current 2, viewers 0) removed =
//     true, want false" (the generations vary).
//
// To re-check: apply one mutation to funnel.go, remove
// testdata/rapid (rapid replays the fail files it leaves there), run
//
//	go test -count=1 -run 'TestTableCASMatchesModel$' ./host/internal/session
//
// and revert. The test fails with "[rapid] flaky test, can not
// reproduce a failure" (the failed run leaves the shared table dirty, so
// the shrunk replay fails on something else), and the expected message
// above as its "Original traceback". TestDecide fails on either mutation
// too.
func TestTableCASMatchesModel(t *testing.T) {
	tbl, _, _ := newTestTable(t, 0)
	mem := tbl.owners.(*ownership.Mem)
	all := func() (int, error) { return mem.Len(), nil }
	checkTableCAS(t, tbl, ownerCount{of: func([]string) (int, error) { return all() }, all: all})
}

// ownerCount counts the keys an ownership store has an owner for.
type ownerCount struct {
	// of counts them among keys, the keys a model run made (a store may
	// count all of its keys instead).
	of func(keys []string) (int, error)
	// all counts every key of the store.
	all func() (int, error)
}

// checkTableCAS is the model test of the table tbl, whatever its
// ownership store: after every step the store holds the binding of each
// live session and no other key of the run, and after every run nothing.
func checkTableCAS(t *testing.T, tbl *Table, count ownerCount) {
	owners := tbl.owners
	ctx := context.Background()
	var instance int
	rapid.Check(t, func(rt *rapid.T) {
		instance++
		m := &model{live: map[string]*modelRec{}, gens: map[string][]uint64{}}
		var keys []string
		viewers := map[contract.TransportID]*fakeViewer{}
		var nextConn uint64
		newViewer := func() *fakeViewer {
			nextConn++
			v := &fakeViewer{id: contract.TransportID{Instance: fmt.Sprint("i", instance), Conn: nextConn}}
			viewers[v.id] = v
			return v
		}
		recOf := func(id string) *Session {
			tbl.mu.Lock()
			defer tbl.mu.Unlock()
			return tbl.byID[id]
		}
		liveIDs := func() []string {
			ids := make([]string, 0, len(m.live))
			for id := range m.live {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			return ids
		}

		rt.Repeat(map[string]func(*rapid.T){
			"create": func(rt *rapid.T) {
				v := newViewer()
				cod := rapid.Bool().Draw(rt, "close_on_disconnect")
				var snap Snapshot
				if err := tbl.Create(ctx, v, CreateOptions{CloseOnDisconnect: cod, ForkCount: -1}, capture(v, &snap)); err != nil {
					rt.Fatalf("create: %v", err)
				}
				r := &modelRec{id: snap.SessionID, key: snap.SessionKey, cod: cod, viewers: map[contract.TransportID]bool{}}
				m.live[r.id] = r
				m.bind(r, v.id)
				keys = append(keys, r.key)
			},
			"resume": func(rt *rapid.T) {
				if len(keys) == 0 {
					rt.Skip("no stored key")
				}
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				var v *fakeViewer
				if len(viewers) > 0 && rapid.Bool().Draw(rt, "reuse viewer") {
					ids := make([]contract.TransportID, 0, len(viewers))
					for id := range viewers {
						ids = append(ids, id)
					}
					sort.Slice(ids, func(i, j int) bool { return ids[i].Conn < ids[j].Conn })
					v = viewers[rapid.SampledFrom(ids).Draw(rt, "viewer")]
				} else {
					v = newViewer()
				}
				var snap Snapshot
				if err := tbl.Resume(ctx, v, key, capture(v, &snap)); err != nil {
					rt.Fatalf("resume %s: %v", key, err)
				}
				r := m.byKey(key)
				if r == nil {
					r = &modelRec{id: snap.SessionID, key: key, viewers: map[contract.TransportID]bool{}}
					m.live[r.id] = r
				} else if snap.SessionID != r.id {
					rt.Fatalf("resume of live key %s got session %s, want the live %s", key, snap.SessionID, r.id)
				}
				m.bind(r, v.id)
			},
			"disconnect": func(rt *rapid.T) {
				ids := liveIDs()
				if len(ids) == 0 {
					rt.Skip("nothing live")
				}
				r := m.live[rapid.SampledFrom(ids).Draw(rt, "session")]
				vids := make([]contract.TransportID, 0, len(viewers))
				for id := range viewers {
					vids = append(vids, id)
				}
				sort.Slice(vids, func(i, j int) bool { return vids[i].Conn < vids[j].Conn })
				vid := rapid.SampledFrom(vids).Draw(rt, "viewer")
				gen := rapid.SampledFrom(m.gens[r.id]).Draw(rt, "seen generation")
				rec := recOf(r.id)
				if rec == nil {
					rt.Fatalf("model has %s live, table does not", r.id)
				}
				removed := tbl.release(releaseRef{s: rec, gen: gen, tid: vid}, Disconnected)
				wantRemoved := false
				if r.viewers[vid] {
					current := gen == r.gen
					delete(r.viewers, vid)
					r.gen++
					m.gens[r.id] = append(m.gens[r.id], r.gen)
					if len(r.viewers) == 0 && current && r.cod {
						wantRemoved = true
						delete(m.live, r.id)
					}
				}
				if removed != wantRemoved {
					rt.Fatalf("disconnect removed = %v, want %v", removed, wantRemoved)
				}
				if removed {
					<-rec.released
				}
			},
			"reap timer": func(rt *rapid.T) {
				ids := liveIDs()
				if len(ids) == 0 {
					rt.Skip("nothing live")
				}
				r := m.live[rapid.SampledFrom(ids).Draw(rt, "session")]
				gen := rapid.SampledFrom(m.gens[r.id]).Draw(rt, "timer generation")
				rec := recOf(r.id)
				removed := tbl.release(releaseRef{s: rec, gen: gen}, OrphanReap)
				wantRemoved := gen == r.gen && len(r.viewers) == 0
				if removed != wantRemoved {
					rt.Fatalf("reap(gen %d, current %d, viewers %d) removed = %v, want %v", gen, r.gen, len(r.viewers), removed, wantRemoved)
				}
				if removed {
					delete(m.live, r.id)
					<-rec.released
				}
			},
			"close": func(rt *rapid.T) {
				ids := liveIDs()
				if len(ids) == 0 {
					rt.Skip("nothing live")
				}
				id := rapid.SampledFrom(ids).Draw(rt, "session")
				closed, err := tbl.Close(ctx, id)
				if err != nil || !closed {
					rt.Fatalf("close %s = %v, %v; want true, nil", id, closed, err)
				}
				delete(m.live, id)
				if again, _ := tbl.Close(ctx, id); again {
					rt.Fatalf("second close of %s reported closed", id)
				}
			},
			"": func(rt *rapid.T) {
				// Invariants after every step.
				active := tbl.Active()
				seenKey := map[string]bool{}
				got := map[string]int{}
				for _, e := range active {
					if seenKey[e.SessionKey] {
						rt.Fatalf("two live sessions for key %s", e.SessionKey)
					}
					seenKey[e.SessionKey] = true
					got[e.ID] = e.Viewers
				}
				if len(got) != len(m.live) {
					rt.Fatalf("table has %d live sessions, model %d", len(got), len(m.live))
				}
				for id, r := range m.live {
					n, ok := got[id]
					if !ok {
						rt.Fatalf("model session %s missing from the table", id)
					}
					if n != len(r.viewers) {
						rt.Fatalf("session %s has %d viewers, model %d", id, n, len(r.viewers))
					}
					// The ownership store records the same binding.
					o, _, err := owners.Get(ctx, r.key)
					if err != nil {
						rt.Fatalf("no owner recorded for live key %s: %v", r.key, err)
					}
					if o.SessionID != id || o.Gen != r.gen || len(o.Viewers) != len(r.viewers) {
						rt.Fatalf("owner of %s = %+v, want session %s gen %d with %d viewers", r.key, o, id, r.gen, len(r.viewers))
					}
					for _, vid := range o.Viewers {
						if !r.viewers[vid] {
							rt.Fatalf("owner of %s lists viewer %v, model does not", r.key, vid)
						}
					}
				}
				n, err := count.of(keys)
				if err != nil {
					rt.Fatalf("counting the ownership store's keys: %v", err)
				}
				if n != len(m.live) {
					rt.Fatalf("ownership store has %d keys, model %d live", n, len(m.live))
				}
			},
		})
		// Leave the shared table empty for the next run, and the store
		// once every teardown has given ownership back.
		for _, id := range liveIDs() {
			rec := recOf(id)
			if _, err := tbl.Close(ctx, id); err != nil {
				rt.Fatalf("cleanup close: %v", err)
			}
			<-rec.released
		}
		if n, err := count.all(); err != nil || n != 0 {
			rt.Fatalf("after closing every session the ownership store has %d keys (%v), want 0", n, err)
		}
	})
}

// TestResumeStormConvergesAndClosesLosers resumes one stored key from
// many goroutines at once: all get one runtime id, and every agent built
// by a loser is closed.
func TestResumeStormConvergesAndClosesLosers(t *testing.T) {
	tbl, _, f := newTestTable(t, 0)
	ctx := context.Background()
	creator := &fakeViewer{id: contract.TransportID{Instance: "c", Conn: 1}}
	var snap Snapshot
	if err := tbl.Create(ctx, creator, CreateOptions{ForkCount: -1}, capture(creator, &snap)); err != nil {
		t.Fatal(err)
	}
	key := snap.SessionKey
	if ok, err := tbl.Close(ctx, snap.SessionID); err != nil || !ok {
		t.Fatalf("close = %v, %v", ok, err)
	}
	const n = 48
	ids := make([]string, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			v := &fakeViewer{id: contract.TransportID{Instance: "r", Conn: uint64(i + 1)}}
			var s Snapshot
			if err := tbl.Resume(ctx, v, key, capture(v, &s)); err != nil {
				t.Errorf("resume %d: %v", i, err)
				return
			}
			ids[i] = s.SessionID
		})
	}
	close(start)
	wg.Wait()
	for i, id := range ids {
		if id != ids[0] {
			t.Fatalf("resume %d got %s, want %s", i, id, ids[0])
		}
	}
	active := tbl.Active()
	if len(active) != 1 || active[0].Viewers != n {
		t.Fatalf("active = %+v, want one session with %d viewers", active, n)
	}
	f.mu.Lock()
	built, closed := f.built, f.closed
	f.mu.Unlock()
	// One agent for the first life (closed), one for the winner (live).
	if built-closed != 1 {
		t.Errorf("agents built %d, closed %d: %d alive, want 1", built, closed, built-closed)
	}
}

func TestUnknownAndStoredErrors(t *testing.T) {
	tbl, _, _ := newTestTable(t, 0)
	v := &fakeViewer{id: contract.TransportID{Instance: "x", Conn: 1}}
	var s Snapshot
	if err := tbl.Activate(context.Background(), v, "deadbeef", capture(v, &s)); !errors.Is(err, ErrUnknownSession) {
		t.Errorf("activate unknown: got %v, want ErrUnknownSession", err)
	}
	if err := tbl.Resume(context.Background(), v, "20200101_000000_abcdef", capture(v, &s)); !errors.Is(err, ErrStoredNotFound) {
		t.Errorf("resume missing key: got %v, want ErrStoredNotFound", err)
	}
	if err := tbl.Resume(context.Background(), v, "no such title", capture(v, &s)); !errors.Is(err, ErrStoredNotFound) {
		t.Errorf("resume missing title: got %v, want ErrStoredNotFound", err)
	}
}

// testCounter reads a counter's value.
func testCounter(tb testing.TB, c prometheus.Counter) float64 {
	tb.Helper()
	return testutil.ToFloat64(c)
}

// TestEventsSincePagesTheJournal: a catch-up longer than one page of the
// journal (and than the ring) gets every event once, in order, and is not
// called truncated.
func TestEventsSincePagesTheJournal(t *testing.T) {
	defer func(n int) { journalPage = n }(journalPage)
	journalPage = 30
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tbl := NewTable(Config{Store: st, Agents: agent.NewEchoFactory(0), RingSize: 50, Log: zerolog.Nop()})
	defer tbl.Shutdown(context.Background())
	ctx := context.Background()
	v := &fakeViewer{id: contract.TransportID{Instance: "v", Conn: 1}}
	var snap Snapshot
	if err := tbl.Create(ctx, v, CreateOptions{ForkCount: -1}, capture(v, &snap)); err != nil {
		t.Fatal(err)
	}
	s, err := tbl.Lookup(snap.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(strings.Repeat("word ", 200)); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	ru := s.run
	s.mu.Unlock()
	<-ru.done
	if err := tbl.journal.flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, from := range []uint64{0, 7} {
		res, err := s.EventsSince(ctx, from)
		if err != nil {
			t.Fatal(err)
		}
		if res.Truncated || uint64(len(res.Events)) != res.LatestSeq-from || res.LatestSeq < 200 {
			t.Fatalf("since %d: %d events up to %d, truncated %v; want all %d", from, len(res.Events), res.LatestSeq, res.Truncated, res.LatestSeq-from)
		}
		for i, raw := range res.Events {
			var e struct{ Seq uint64 }
			if json.Unmarshal(raw, &e) != nil || e.Seq != from+uint64(i)+1 {
				t.Fatalf("since %d: event %d has seq %d, want %d", from, i, e.Seq, from+uint64(i)+1)
			}
		}
	}
}
