package jsstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/cluster/clustertest"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/host/store/storetest"
)

// openStore opens a Store on its own bucket and streams of js.
func openStore(tb testing.TB, js jetstream.JetStream, prefix string) *Store {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clustertest.Timeout)
	defer cancel()
	s, err := Open(ctx, js, Config{Prefix: prefix, Storage: jetstream.MemoryStorage})
	if err != nil {
		tb.Fatalf("open store: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// TestJSStoreConformance runs the store conformance suite on the
// JetStream store, each check on its own bucket and streams of one
// embedded server.
func TestJSStoreConformance(t *testing.T) {
	e := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, e.ClientURL())
	storetest.Run(t, func(t *testing.T) storetest.Store { return openStore(t, js, clustertest.NewBucket()) })
}

// TestJSStoreTwoHosts: two stores on one bucket and streams, each on its
// own connection (two hosts), see each other's writes; racing creates of
// one key have one winner; racing journal appends of the same events
// journal each seq once, in order; racing appends of display rows keep
// every call's rows.
func TestJSStoreTwoHosts(t *testing.T) {
	ctx := context.Background()
	e := clustertest.StartServer(t)
	_, jsA := clustertest.Connect(t, e.ClientURL())
	_, jsB := clustertest.Connect(t, e.ClientURL())
	prefix := clustertest.NewBucket()
	a, b := openStore(t, jsA, prefix), openStore(t, jsB, prefix)

	key := storetest.Key(1)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, s := range []*Store{a, b} {
		wg.Go(func() {
			errs[i] = s.CreateSession(ctx, store.Session{Key: key, Title: string(rune('a' + i)), StartedAt: storetest.T0})
		})
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) || !errors.Is(errors.Join(errs...), store.ErrExists) {
		t.Fatalf("racing creates: got %v; want one nil, one ErrExists", errs)
	}

	errs = make([]error, 2)
	const n = 60
	evs := make([]store.Event, n)
	for i := range evs {
		evs[i] = store.Event{Key: key, Seq: uint64(i + 1), Params: []byte(`{}`)}
	}
	for i, s := range []*Store{a, b} {
		wg.Go(func() {
			// Both hosts journal the same events, a few at a time.
			for from := 0; from < n && errs[i] == nil; from += 7 {
				errs[i] = s.AppendEvents(ctx, evs[from:min(from+7, n)], store.Retention{})
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("racing journal appends: %v", err)
	}
	got, first, last, err := b.EventsSince(ctx, key, 0, 0)
	if err != nil || first != 1 || last != n || len(got) != n {
		t.Fatalf("journal after racing appends: %d events %d..%d, %v; want %d, 1..%d", len(got), first, last, err, n, n)
	}
	for i, e := range got {
		if e.Seq != uint64(i+1) {
			t.Fatalf("journal after racing appends: event %d has seq %d", i, e.Seq)
		}
	}
	if info, err := a.events.Info(ctx); err != nil || info.State.Msgs != n {
		t.Errorf("events stream: %v messages, %v; want exactly %d (no seq twice)", info.State.Msgs, err, n)
	}
	// A gap in a journal is refused.
	if err := a.AppendEvents(ctx, []store.Event{{Key: key, Seq: n + 2, Params: []byte(`{}`)}}, store.Retention{}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("append of seq %d after %d: got %v, want ErrInvalid", n+2, n, err)
	}

	errs = make([]error, 2)
	for i, s := range []*Store{a, b} {
		wg.Go(func() {
			for r := 0; r < 10 && errs[i] == nil; r++ {
				errs[i] = s.AppendMessages(ctx, key, agent.Message{Role: agent.RoleUser, Text: "q"}, agent.Message{Role: agent.RoleAssistant, Text: "a"})
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("racing message appends: %v", err)
	}
	msgs, err := a.Messages(ctx, key)
	if err != nil || len(msgs) != 40 {
		t.Fatalf("messages after racing appends: %d, %v; want 40", len(msgs), err)
	}
	for i := 0; i < len(msgs); i += 2 {
		if msgs[i].Text != "q" || msgs[i+1].Text != "a" {
			t.Fatalf("rows %d, %d: %q %q, want a call's q and a together", i, i+1, msgs[i].Text, msgs[i+1].Text)
		}
	}

	// Row updates from both hosts all land (compare-and-swap, read again
	// on a lost race).
	for i, s := range []*Store{a, b} {
		wg.Go(func() {
			for r := 0; r < 10 && errs[i] == nil; r++ {
				errs[i] = s.StartRun(ctx, key, store.Run{ID: string(rune('a'+i)) + string(rune('0'+r)), Status: "running"})
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("racing run starts: %v", err)
	}
	if runs, err := b.Runs(ctx, key); err != nil || len(runs) != 20 {
		t.Errorf("runs after racing starts: %d, %v; want 20", len(runs), err)
	}
}

// TestJSStoreUnavailable: with the server gone, reads and writes fail
// with store.ErrUnavailable (the table's 5003), and the fault hook hears
// of the writes.
func TestJSStoreUnavailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), clustertest.Timeout)
	defer cancel()
	e := clustertest.StartServer(t)
	nc, js := clustertest.Connect(t, e.ClientURL())
	s := openStore(t, js, clustertest.NewBucket())
	if err := s.CreateSession(ctx, store.Session{Key: storetest.Key(1), StartedAt: storetest.T0}); err != nil {
		t.Fatal(err)
	}
	var reported int
	s.OnWriteFault(func(error) { reported++ })
	nc.Close()
	if err := s.SetTitle(ctx, storetest.Key(1), "x"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("SetTitle with no connection: got %v, want ErrUnavailable", err)
	}
	if _, err := s.GetSession(ctx, storetest.Key(1)); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("GetSession with no connection: got %v, want ErrUnavailable", err)
	}
	if err := s.QuickCheck(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("QuickCheck with no connection: got %v, want ErrUnavailable", err)
	}
	if reported != 1 {
		t.Errorf("fault hook: got %d reports, want 1", reported)
	}
}

// TestJSStoreInterleavedJournals: sessions journaling into the one
// stream at once each read back their own events, whole or from any
// point, and are pruned alone.
func TestJSStoreInterleavedJournals(t *testing.T) {
	ctx := context.Background()
	e := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, e.ClientURL())
	s := openStore(t, js, clustertest.NewBucket())
	keys := []string{storetest.Key(1), storetest.Key(2), storetest.Key(3)}
	const n = 300
	keep := store.Retention{PerSession: 250}
	for seq := uint64(1); seq <= n; seq++ {
		var evs []store.Event
		for i, k := range keys {
			if i == 2 && seq > n/2 {
				continue // the third stops half way
			}
			evs = append(evs, store.Event{Key: k, Seq: seq, Params: []byte(fmt.Sprintf(`{"k":%d,"seq":%d}`, i, seq))})
		}
		if err := s.AppendEvents(ctx, evs, keep); err != nil {
			t.Fatal(err)
		}
	}
	for i, k := range keys {
		wantFirst, wantLast := uint64(n-250+1), uint64(n)
		if i == 2 {
			wantFirst, wantLast = 1, n/2
		}
		for _, after := range []uint64{0, wantFirst, wantLast - 7, wantLast} {
			got, first, last, err := s.EventsSince(ctx, k, after, 5)
			if err != nil || first != wantFirst || last != wantLast {
				t.Fatalf("session %d since %d: bounds %d..%d, %v; want %d..%d", i, after, first, last, err, wantFirst, wantLast)
			}
			from := max(after+1, wantFirst)
			want := int(min(5, wantLast+1-from))
			if len(got) != want {
				t.Fatalf("session %d since %d: got %d events, want %d", i, after, len(got), want)
			}
			for j, e := range got {
				if wantParams := fmt.Sprintf(`{"k":%d,"seq":%d}`, i, from+uint64(j)); e.Seq != from+uint64(j) || string(e.Params) != wantParams {
					t.Errorf("session %d since %d: event %d is %d %s, want %d %s", i, after, j, e.Seq, e.Params, from+uint64(j), wantParams)
				}
			}
		}
	}
}

// TestJSStoreRebuildOnAnotherHost: what one host stored of a session
// (display rows, a run in flight, journal, cursor) another host reads
// back whole, as the table rebuilds a session, and continues: its next
// seq follows the journal, and the first host, whose cache of the
// journal is now stale, can neither journal that seq twice nor leave a
// gap.
func TestJSStoreRebuildOnAnotherHost(t *testing.T) {
	ctx := context.Background()
	e := clustertest.StartServer(t)
	_, jsA := clustertest.Connect(t, e.ClientURL())
	_, jsB := clustertest.Connect(t, e.ClientURL())
	prefix := clustertest.NewBucket()
	a, b := openStore(t, jsA, prefix), openStore(t, jsB, prefix)
	parent, key := storetest.Key(1), storetest.Key(2)
	if err := a.CreateSession(ctx, store.Session{Key: parent, StartedAt: storetest.T0}); err != nil {
		t.Fatal(err)
	}
	if err := a.AppendMessages(ctx, parent, agent.Message{Role: agent.RoleUser, Text: "p1"}, agent.Message{Role: agent.RoleAssistant, Text: "p2"}); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateSession(ctx, store.Session{Key: key, Parent: parent, ForkCount: 1, StartedAt: storetest.T0, Epoch: "e1"}); err != nil {
		t.Fatal(err)
	}
	if err := a.StartTurn(ctx, key, agent.Message{Role: agent.RoleUser, Text: "q"}, store.Run{ID: "r1", Status: "running", StartedAt: storetest.T0, StartSeq: 1}); err != nil {
		t.Fatal(err)
	}
	var evs []store.Event
	for seq := uint64(1); seq <= 5; seq++ {
		evs = append(evs, store.Event{Key: key, Seq: seq, Params: []byte(fmt.Sprintf(`{"seq":%d}`, seq))})
	}
	if err := a.Commit(ctx, store.Batch{Events: evs, Cursors: []store.Cursor{{Key: key, Epoch: "e1", LastSeq: 5}}}, store.Retention{}); err != nil {
		t.Fatal(err)
	}

	// Host B rebuilds it.
	sess, err := b.GetSession(ctx, key)
	if err != nil || sess.Epoch != "e1" || sess.LastSeq != 5 || sess.MessageCount != 1 || sess.Parent != parent {
		t.Fatalf("B: GetSession: %+v, %v; want epoch e1, last seq 5, 1 message, parent %s", sess, err, parent)
	}
	if _, first, last, err := b.EventsSince(ctx, key, 1<<62, 1); err != nil || first != 1 || last != 5 {
		t.Fatalf("B: journal bounds %d..%d, %v; want 1..5", first, last, err)
	}
	display, err := b.DisplayMessages(ctx, key)
	if err != nil || len(display) != 2 || display[0].Text != "p1" || display[1].Text != "q" {
		t.Fatalf("B: DisplayMessages: %v, %v; want [p1 q]", display, err)
	}
	runs, err := b.Runs(ctx, key)
	if err != nil || len(runs) != 1 || runs[0].Status != "running" || runs[0].StartSeq != 1 {
		t.Fatalf("B: Runs: %+v, %v; want r1 running from seq 1", runs, err)
	}
	// B recovers the run as after a kill, and goes on at seq 6.
	if err := b.Commit(ctx, store.Batch{
		Messages: []store.Message{{Key: key, Message: agent.Message{Role: agent.RoleAssistant, Text: "partial"}}},
		RunEnds:  []store.RunEnd{{Key: key, RunID: "r1", Status: "interrupted", At: storetest.T0}},
		Events:   []store.Event{{Key: key, Seq: 6, Params: []byte(`{"seq":6}`)}},
		Cursors:  []store.Cursor{{Key: key, Epoch: "e1", LastSeq: 6}},
	}, store.Retention{}); err != nil {
		t.Fatal(err)
	}
	// A, its cache still at seq 5: seq 6 again is skipped, 8 is a gap,
	// 7 follows.
	if err := a.AppendEvents(ctx, []store.Event{{Key: key, Seq: 6, Params: []byte(`{"from":"a"}`)}}, store.Retention{}); err != nil {
		t.Fatalf("A: seq 6 again: got %v, want nil (skipped)", err)
	}
	if err := a.AppendEvents(ctx, []store.Event{{Key: key, Seq: 8, Params: []byte(`{}`)}}, store.Retention{}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("A: seq 8 after 6: got %v, want ErrInvalid", err)
	}
	if err := a.AppendEvents(ctx, []store.Event{{Key: key, Seq: 7, Params: []byte(`{"seq":7}`)}}, store.Retention{}); err != nil {
		t.Fatalf("A: seq 7: got %v, want nil", err)
	}
	got, _, last, err := a.EventsSince(ctx, key, 5, 0)
	if err != nil || last != 7 || len(got) != 2 || string(got[0].Params) != `{"seq":6}` || got[1].Seq != 7 {
		t.Fatalf("A: events since 5: %v to %d, %v; want B's seq 6, then 7", got, last, err)
	}
	if msgs, err := a.Messages(ctx, key); err != nil || len(msgs) != 2 || msgs[1].Text != "partial" {
		t.Errorf("A: Messages: %v, %v; want [q partial]", msgs, err)
	}
}

// TestJSStoreCommitRetried: a Commit that failed after storing a
// session's display rows, tried again as the table's journal does (the
// same entries first, more behind), stores none of them twice; a later
// Commit with the same texts stores them again.
func TestJSStoreCommitRetried(t *testing.T) {
	ctx := context.Background()
	e := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, e.ClientURL())
	s := openStore(t, js, clustertest.NewBucket())
	key := storetest.Key(1)
	if err := s.CreateSession(ctx, store.Session{Key: key, StartedAt: storetest.T0}); err != nil {
		t.Fatal(err)
	}
	row := func(text string) store.Message {
		return store.Message{Key: key, Message: agent.Message{Role: agent.RoleAssistant, Text: text}}
	}
	ev := func(seq uint64) store.Event { return store.Event{Key: key, Seq: seq, Params: []byte(`{}`)} }
	// The first attempt got as far as the events and the rows.
	first := store.Batch{Messages: []store.Message{row("a"), row("b")}, Events: []store.Event{ev(1), ev(2)}}
	if err := s.AppendEvents(ctx, first.Events, store.Retention{}); err != nil {
		t.Fatal(err)
	}
	if err := s.appendMessages(ctx, key, []agent.Message{row("a").Message, row("b").Message}, 1); err != nil {
		t.Fatal(err)
	}
	retried := store.Batch{
		Messages: []store.Message{row("a"), row("b"), row("c")},
		Events:   []store.Event{ev(1), ev(2), ev(3)},
		Cursors:  []store.Cursor{{Key: key, Epoch: "e", LastSeq: 3}},
	}
	if err := s.Commit(ctx, retried, store.Retention{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, store.Batch{Messages: []store.Message{row("a")}, Events: []store.Event{ev(4)}}, store.Retention{}); err != nil {
		t.Fatal(err)
	}
	msgs, err := s.Messages(ctx, key)
	var got []string
	for _, m := range msgs {
		got = append(got, m.Text)
	}
	if err != nil || fmt.Sprint(got) != "[a b c a]" {
		t.Errorf("Messages: got %v, %v; want [a b c a]", got, err)
	}
	if evs, _, last, err := s.EventsSince(ctx, key, 0, 0); err != nil || len(evs) != 4 || last != 4 {
		t.Errorf("journal: %d events to %d, %v; want 4 to 4", len(evs), last, err)
	}
}

// TestJSStoreConformanceCluster runs the conformance suite on a bucket
// and streams of 3 replicas on a 3-node cluster, each store on a
// connection to another node: the leader decides every expected-last
// check, and the busy answers of a replicated stream are asked again.
func TestJSStoreConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node cluster")
	}
	nodes := clustertest.StartCluster(t, 3)
	var js []jetstream.JetStream
	for _, n := range nodes {
		_, j := clustertest.ConnectNode(t, n)
		js = append(js, j)
	}
	var i int
	storetest.Run(t, func(t *testing.T) storetest.Store {
		i++
		ctx, cancel := context.WithTimeout(context.Background(), clustertest.Timeout)
		defer cancel()
		for {
			s, err := Open(ctx, js[i%len(js)], Config{Prefix: clustertest.NewBucket(), Replicas: 3})
			if err == nil {
				t.Cleanup(func() { _ = s.Close() })
				return s
			}
			if ctx.Err() != nil {
				t.Fatalf("open store: %v", err)
			}
			// The servers may still be learning of each other.
			clustertest.Retry(ctx)
		}
	})
}

// TestJSStoreQuickCheck: a stream deleted, or changed to drop messages,
// is damage; a store opened on existing objects uses them as they are.
func TestJSStoreQuickCheck(t *testing.T) {
	ctx := context.Background()
	e := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, e.ClientURL())
	prefix := clustertest.NewBucket()
	s := openStore(t, js, prefix)
	if err := s.QuickCheck(ctx); err != nil {
		t.Fatalf("QuickCheck: got %v, want nil", err)
	}
	cfg := s.messages.CachedInfo().Config
	cfg.MaxMsgsPerSubject = 10
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// Opening again keeps the change (and so does not hide it).
	again := openStore(t, js, prefix)
	if err := again.QuickCheck(ctx); !errors.Is(err, store.ErrDamaged) {
		t.Errorf("QuickCheck with a per-subject limit: got %v, want ErrDamaged", err)
	}
	if err := js.DeleteStream(ctx, s.evName); err != nil {
		t.Fatal(err)
	}
	if err := s.QuickCheck(ctx); !errors.Is(err, store.ErrDamaged) {
		t.Errorf("QuickCheck with the journal stream gone: got %v, want ErrDamaged", err)
	}
}

// TestJSStoreBytesInterleaved: the bytes bound on journals interleaved in
// the stream, appended to by two hosts in turn (so each one's cached
// first event is behind the other's prunes): each journal is always the
// newest of its events that fit the bound, its newest always kept.
func TestJSStoreBytesInterleaved(t *testing.T) {
	ctx := context.Background()
	e := clustertest.StartServer(t)
	_, jsA := clustertest.Connect(t, e.ClientURL())
	_, jsB := clustertest.Connect(t, e.ClientURL())
	prefix := clustertest.NewBucket()
	hosts := []*Store{openStore(t, jsA, prefix), openStore(t, jsB, prefix)}
	keys := []string{storetest.Key(1), storetest.Key(2), storetest.Key(3)}
	for _, k := range keys {
		if err := hosts[0].CreateSession(ctx, store.Session{Key: k, StartedAt: storetest.T0}); err != nil {
			t.Fatal(err)
		}
	}
	keep := store.Retention{PerSessionBytes: 3000}
	sizes := make([][]int, len(keys)) // by session, by seq-1
	for round := range 60 {
		var evs []store.Event
		for i, k := range keys {
			if (round+i)%3 == 2 {
				continue // sessions skip rounds, so their events interleave unevenly
			}
			seq := uint64(len(sizes[i]) + 1)
			n := 40 + (round*131+i*977)%900 // 40-939 bytes
			if round == 30 && i == 0 {
				n = 5000 // one event alone over the bound
			}
			sizes[i] = append(sizes[i], n)
			p := fmt.Sprintf(`{"k":%d,"seq":%d,"p":"`, i, seq)
			evs = append(evs, store.Event{Key: k, Seq: seq, Params: []byte(p + strings.Repeat("x", n-len(p)-2) + `"}`)})
		}
		if err := hosts[round%2].AppendEvents(ctx, evs, keep); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i, k := range keys {
			if len(sizes[i]) == 0 {
				continue
			}
			var want []uint64
			sum := 0
			for j := len(sizes[i]) - 1; j >= 0 && (len(want) == 0 || sum+sizes[i][j] <= 3000); j-- {
				sum += sizes[i][j]
				want = append([]uint64{uint64(j + 1)}, want...)
			}
			got, first, last, err := hosts[(round+1)%2].EventsSince(ctx, k, 0, 0)
			var seqs []uint64
			for _, e := range got {
				seqs = append(seqs, e.Seq)
			}
			if err != nil || !slices.Equal(seqs, want) || first != want[0] || last != want[len(want)-1] {
				t.Fatalf("round %d, session %d: journal %v (bounds %d..%d, %v), want %v", round, i, seqs, first, last, err, want)
			}
		}
	}
}

// TestJSStoreBytesLegacyJournal: journal messages without the bytes
// header (written before the bytes bound) count as none, and go first
// once the events after them pass the bound.
func TestJSStoreBytesLegacyJournal(t *testing.T) {
	ctx := context.Background()
	e := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, e.ClientURL())
	s := openStore(t, js, clustertest.NewBucket())
	key := storetest.Key(1)
	if err := s.CreateSession(ctx, store.Session{Key: key, StartedAt: storetest.T0}); err != nil {
		t.Fatal(err)
	}
	for seq := 1; seq <= 3; seq++ {
		m := nats.NewMsg(s.evSubj + key)
		m.Header.Set(hdrSeq, fmt.Sprint(seq))
		m.Data = []byte(fmt.Sprintf(`{"seq":%d,"p":"%s"}`, seq, strings.Repeat("o", 500-len(fmt.Sprintf(`{"seq":%d,"p":""}`, seq)))))
		if _, err := s.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	keep := store.Retention{PerSessionBytes: 1000}
	for seq := uint64(4); seq <= 20; seq++ {
		p := fmt.Sprintf(`{"seq":%d,"p":"`, seq)
		if err := s.AppendEvents(ctx, []store.Event{{Key: key, Seq: seq, Params: []byte(p + strings.Repeat("x", 300-len(p)-2) + `"}`)}}, keep); err != nil {
			t.Fatal(err)
		}
	}
	// The counting starts from the last legacy event (its own 500 bytes):
	// 18-20 are the newest 300-byte events within 1000.
	got, first, last, err := s.EventsSince(ctx, key, 0, 0)
	if err != nil || len(got) != 3 || first != 18 || last != 20 {
		t.Errorf("journal: %d events %d..%d, %v; want 18..20", len(got), first, last, err)
	}
}

// TestNoAnswer: the errors that say the servers did not answer, or cannot
// decide now, are told from those that say a request failed.
func TestNoAnswer(t *testing.T) {
	api := func(code jetstream.ErrorCode) error {
		return fmt.Errorf("get: %w", &jetstream.APIError{ErrorCode: code, Description: "x"})
	}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"deadline", fmt.Errorf("get: %w", context.DeadlineExceeded), true},
		{"request timeout", nats.ErrTimeout, true},
		{"no responders", nats.ErrNoResponders, true},
		{"no response from stream", jetstream.ErrNoStreamResponse, true},
		{"reconnecting", nats.ErrConnectionReconnecting, true},
		{"no meta leader", api(errCodeClusterNotAvailable), true},
		{"stream offline", api(errCodeStreamOffline), true},
		{"consumer offline", api(errCodeConsumerOffline), true},
		{"new leader applying its log", api(errCodeLastPerSubjectPending), true},
		{"cancelled", context.Canceled, false},
		{"connection closed", nats.ErrConnectionClosed, false},
		{"stream not found", jetstream.ErrStreamNotFound, false},
		{"wrong last sequence", api(jetstream.JSErrCodeStreamWrongLastSequence), false},
		{"insufficient resources", api(10023), false},
		{"other", errors.New("disk on fire"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := noAnswer(tt.err); got != tt.want {
				t.Errorf("noAnswer(%v): got %v, want %v", tt.err, got, tt.want)
			}
			got := storeFault(tt.err)
			if !errors.Is(got, store.ErrUnavailable) {
				t.Errorf("storeFault(%v) = %v: want it to wrap store.ErrUnavailable", tt.err, got)
			}
			if errors.Is(got, store.ErrUnreachable) != tt.want {
				t.Errorf("storeFault(%v) = %v: wraps store.ErrUnreachable %v, want %v", tt.err, got, !tt.want, tt.want)
			}
			if !errors.Is(got, tt.err) {
				t.Errorf("storeFault(%v) = %v: the cause is not kept", tt.err, got)
			}
		})
	}
}

// TestJSStoreReachable: on a three-node cluster, a store of 3 replicas is
// reachable; with the two servers gone that led the cluster and the
// store's bucket and streams (the one left leads nothing and, without a
// quorum, cannot be elected), Reachable and a read with a deadline fail
// within it with store.ErrUnreachable (and store.ErrUnavailable), not
// with an error that says the storage failed.
func TestJSStoreReachable(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node cluster")
	}
	nodes := clustertest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), clustertest.Timeout)
	defer cancel()
	kept := 0
	for nodes[kept].Server().JetStreamIsLeader() {
		kept++
	}
	_, js := clustertest.ConnectNode(t, nodes[kept])
	prefix := clustertest.NewBucket()
	var s *Store
	for {
		var err error
		if s, err = Open(ctx, js, Config{Prefix: prefix, Replicas: 3}); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("open store: %v", err)
		}
		clustertest.Retry(ctx) // the servers may still be learning of each other
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.CreateSession(ctx, store.Session{Key: storetest.Key(1), StartedAt: storetest.T0}); err != nil {
		t.Fatal(err)
	}
	if err := s.Reachable(ctx); err != nil {
		t.Fatalf("Reachable on a whole cluster: %v", err)
	}
	// The kept server hands every leadership of the store's over.
	srv := nodes[kept].Server()
	for _, name := range []string{"KV_" + prefix + "_store", upper(prefix) + "_EVENTS", upper(prefix) + "_MESSAGES"} {
		for srv.JetStreamIsStreamLeader("$G", name) || !srv.JetStreamIsStreamCurrent("$G", name) {
			if ctx.Err() != nil {
				t.Fatalf("%s: node %d is still its leader", name, kept)
			}
			if srv.JetStreamIsStreamLeader("$G", name) {
				_ = srv.JetStreamStepdownStream("$G", name)
			}
			clustertest.Retry(ctx) // polling the election
		}
	}
	for i, e := range nodes {
		if i != kept {
			e.Shutdown()
		}
	}
	const bound = 500 * time.Millisecond
	for name, call := range map[string]func(context.Context) error{
		"Reachable":  s.Reachable,
		"GetSession": func(ctx context.Context) error { _, err := s.GetSession(ctx, storetest.Key(1)); return err },
	} {
		bctx, cancel := context.WithTimeout(ctx, bound)
		began := time.Now()
		err := call(bctx)
		took := time.Since(began)
		cancel()
		if !errors.Is(err, store.ErrUnreachable) || !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s with no leader: got %v, want store.ErrUnreachable with store.ErrUnavailable", name, err)
		}
		if took > bound+time.Second {
			t.Errorf("%s with no leader answered after %v, want within its deadline %v", name, took, bound)
		}
	}
}
