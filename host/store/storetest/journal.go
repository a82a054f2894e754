package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/store"
)

func testJournalAppendAndSince(t *testing.T, s Store) {
	ctx := context.Background()
	key := Key(1)
	mustCreate(t, s, store.Session{Key: key, StartedAt: T0})
	if err := s.AppendEvents(ctx, events(key, 1, 10), store.Retention{}); err != nil {
		t.Fatal(err)
	}
	// Seqs already journaled are ignored, not an error.
	if err := s.AppendEvents(ctx, events(key, 8, 12), store.Retention{}); err != nil {
		t.Fatalf("append over journaled seqs: got %v, want nil", err)
	}
	got, first, last, err := s.EventsSince(ctx, key, 4, 0)
	if err != nil || first != 1 || last != 12 || len(got) != 8 || got[0].Seq != 5 || got[7].Seq != 12 {
		t.Fatalf("since 4: got %d events, bounds %d..%d, %v; want 8 events 5..12, bounds 1..12", len(got), first, last, err)
	}
	for i, e := range got {
		if want := fmt.Sprintf(`{"seq":%d}`, 5+i); e.Key != key || string(e.Params) != want {
			t.Errorf("event %d: got %s %s, want %s %s", i, e.Key, e.Params, key, want)
		}
	}
	for _, tt := range []struct {
		after     uint64
		limit     int
		wantSeqs  []uint64
		wantFirst uint64
	}{
		{4, 3, []uint64{5, 6, 7}, 1},
		{0, 2, []uint64{1, 2}, 1},
		{11, 0, []uint64{12}, 1},
		{12, 0, nil, 1},
		{1 << 62, 1, nil, 1}, // ahead of the journal: bounds only
	} {
		got, first, last, err := s.EventsSince(ctx, key, tt.after, tt.limit)
		var seqs []uint64
		for _, e := range got {
			seqs = append(seqs, e.Seq)
		}
		if err != nil || !slices.Equal(seqs, tt.wantSeqs) || first != tt.wantFirst || last != 12 {
			t.Errorf("EventsSince(%d, %d): got %v %d..%d, %v; want %v %d..12", tt.after, tt.limit, seqs, first, last, err, tt.wantSeqs, tt.wantFirst)
		}
	}
	// Two sessions' journals in one call, each unaffected by the other.
	other := Key(2)
	mustCreate(t, s, store.Session{Key: other, StartedAt: T0})
	if err := s.AppendEvents(ctx, append(events(other, 1, 3), events(key, 13, 13)...), store.Retention{}); err != nil {
		t.Fatal(err)
	}
	if _, first, last, err := s.EventsSince(ctx, other, 0, 0); err != nil || first != 1 || last != 3 {
		t.Errorf("other session: got bounds %d..%d, %v; want 1..3", first, last, err)
	}
	if _, _, last, err := s.EventsSince(ctx, key, 0, 0); err != nil || last != 13 {
		t.Errorf("first session: got last %d, %v; want 13", last, err)
	}
}

// testJournalPage: a whole journal of retention's default size comes
// back in seq order, a page at a time as the host reads it.
func testJournalPage(t *testing.T, s Store) {
	ctx := context.Background()
	key := Key(1)
	mustCreate(t, s, store.Session{Key: key, StartedAt: T0})
	const n = 1200
	for from := uint64(1); from <= n; from += 300 {
		if err := s.AppendEvents(ctx, events(key, from, from+299), store.Retention{}); err != nil {
			t.Fatal(err)
		}
	}
	var seen uint64
	for seen < n {
		got, first, last, err := s.EventsSince(ctx, key, seen, 500)
		if err != nil || first != 1 || last != n || len(got) == 0 {
			t.Fatalf("since %d: got %d events %d..%d, %v", seen, len(got), first, last, err)
		}
		for _, e := range got {
			if e.Seq != seen+1 {
				t.Fatalf("since %d: got seq %d after %d", seen, e.Seq, seen)
			}
			seen = e.Seq
		}
	}
}

func testJournalRetention(t *testing.T, open func(t *testing.T) Store) {
	ctx := context.Background()
	for _, tt := range []struct {
		name       string
		keep       store.Retention
		perKey     uint64
		wantFirstA uint64
		wantFirstB uint64
	}{
		{"per session", store.Retention{PerSession: 5, Total: 1000}, 20, 16, 16},
		{"total", store.Retention{PerSession: 1000, Total: 10}, 20, 0, 11},
		{"nothing pruned", store.Retention{PerSession: 100, Total: 1000}, 20, 1, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := open(t)
			a, b := Key(1), Key(2)
			mustCreate(t, s, store.Session{Key: a, StartedAt: T0})
			mustCreate(t, s, store.Session{Key: b, StartedAt: T0})
			if err := s.AppendEvents(ctx, events(a, 1, tt.perKey), tt.keep); err != nil {
				t.Fatal(err)
			}
			if err := s.AppendEvents(ctx, events(b, 1, tt.perKey), tt.keep); err != nil {
				t.Fatal(err)
			}
			_, firstA, _, errA := s.EventsSince(ctx, a, 0, 0)
			evsB, firstB, lastB, errB := s.EventsSince(ctx, b, 0, 0)
			if err := errors.Join(errA, errB); err != nil || firstA != tt.wantFirstA || firstB != tt.wantFirstB || lastB != tt.perKey {
				t.Fatalf("after pruning: a from %d, b %d..%d, %v; want a from %d, b %d..%d", firstA, firstB, lastB, err, tt.wantFirstA, tt.wantFirstB, tt.perKey)
			}
			if len(evsB) != int(lastB-firstB+1) || evsB[0].Seq != firstB {
				t.Errorf("after pruning: b's events %d from %d, want %d from %d", len(evsB), evsB[0].Seq, lastB-firstB+1, firstB)
			}
			// Truncated: a client that saw less than the first kept
			// gets the journal from its first event.
			if got, _, _, err := s.EventsSince(ctx, b, 1, 1); err != nil || len(got) != 1 || got[0].Seq != max(firstB, 2) {
				t.Errorf("since 1 after pruning: got %v, %v; want seq %d", got, err, max(firstB, 2))
			}
		})
	}
}

func testRuns(t *testing.T, s Store) {
	ctx := context.Background()
	key := Key(1)
	mustCreate(t, s, store.Session{Key: key, StartedAt: T0})
	if err := s.StartRun(ctx, key, store.Run{ID: "r2", Status: "running", StartedAt: time.Unix(20, 0), StartSeq: 9, By: "alice"}); err != nil {
		t.Fatal(err)
	}
	if err := s.StartRun(ctx, key, store.Run{ID: "r1", Status: "running", StartedAt: time.Unix(10, 0), StartSeq: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.EndRun(ctx, key, "r1", "complete", time.Unix(15, 0)); err != nil {
		t.Fatal(err)
	}
	// An ended run keeps its first status; an unknown one is no error.
	if err := s.EndRun(ctx, key, "r1", "failed", time.Unix(16, 0)); err != nil {
		t.Fatal(err)
	}
	if err := s.EndRun(ctx, key, "nope", "failed", time.Unix(16, 0)); err != nil {
		t.Fatalf("EndRun of an unknown run: got %v, want nil", err)
	}
	runs, err := s.Runs(ctx, key)
	if err != nil || len(runs) != 2 || runs[0].ID != "r1" || runs[0].Status != "complete" || runs[0].EndedAt.Unix() != 15 ||
		runs[1].ID != "r2" || runs[1].Status != "running" || !runs[1].EndedAt.IsZero() || runs[1].StartSeq != 9 ||
		runs[0].By != "" || runs[1].By != "alice" {
		t.Fatalf("Runs: got %+v, %v; want r1 complete at 15 by nobody, r2 running from seq 9 by alice", runs, err)
	}
}

func testStartTurn(t *testing.T, s Store) {
	ctx := context.Background()
	key := Key(1)
	mustCreate(t, s, store.Session{Key: key, StartedAt: T0})
	mustAppend(t, s, key, "before")
	if err := s.StartTurn(ctx, key, agent.Message{Role: agent.RoleUser, Text: "prompt"}, store.Run{ID: "r1", Status: "running", StartedAt: T0, By: "carol"}); err != nil {
		t.Fatalf("StartTurn: got %v, want nil", err)
	}
	if runs, err := s.Runs(ctx, key); err != nil || len(runs) != 1 || runs[0].By != "carol" {
		t.Fatalf("Runs after StartTurn: got %+v, %v; want r1 by carol", runs, err)
	}
	msgs, err := s.Messages(ctx, key)
	runs, rerr := s.Runs(ctx, key)
	if err := errors.Join(err, rerr); err != nil || !slices.Equal(texts(msgs), []string{"before", "prompt"}) || len(runs) != 1 || runs[0].ID != "r1" || runs[0].Status != "running" {
		t.Errorf("after StartTurn: messages %v, runs %+v, %v; want [before prompt] and r1 running", texts(msgs), runs, err)
	}
}

func testCommit(t *testing.T, s Store) {
	ctx := context.Background()
	a, b := Key(1), Key(2)
	mustCreate(t, s, store.Session{Key: a, StartedAt: T0})
	mustCreate(t, s, store.Session{Key: b, StartedAt: T0})
	if err := s.StartRun(ctx, a, store.Run{ID: "r1", Status: "running", StartedAt: T0}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, store.Batch{}, store.Retention{}); err != nil {
		t.Fatalf("Commit of nothing: got %v, want nil", err)
	}
	batch := store.Batch{
		Messages: []store.Message{
			{Key: a, Message: agent.Message{Role: agent.RoleAssistant, Text: "a1"}},
			{Key: b, Message: agent.Message{Role: agent.RoleUser, Text: "b1"}},
			{Key: a, Message: agent.Message{Role: agent.RoleAssistant, Text: "a2"}},
		},
		RunSeqs: []store.RunSeq{{Key: a, RunID: "r1", StartSeq: 1}},
		RunEnds: []store.RunEnd{{Key: a, RunID: "r1", Status: "complete", At: T0.Add(time.Second)}},
		Events:  append(events(a, 1, 3), events(b, 1, 1)...),
		Cursors: []store.Cursor{{Key: a, Epoch: "e1", LastSeq: 2}, {Key: a, Epoch: "e1", LastSeq: 3}, {Key: b, Epoch: "eb", LastSeq: 1}},
		Ends:    []store.End{{Key: b, Reason: "closed", At: T0.Add(time.Minute)}, {Key: b, Reason: "shutdown", At: T0.Add(time.Hour)}},
	}
	if err := s.Commit(ctx, batch, store.Retention{}); err != nil {
		t.Fatalf("Commit: got %v, want nil", err)
	}
	ma, _ := s.Messages(ctx, a)
	mb, _ := s.Messages(ctx, b)
	sa, _ := s.GetSession(ctx, a)
	sb, _ := s.GetSession(ctx, b)
	runs, _ := s.Runs(ctx, a)
	_, _, lastA, _ := s.EventsSince(ctx, a, 0, 0)
	_, _, lastB, _ := s.EventsSince(ctx, b, 0, 0)
	if !slices.Equal(texts(ma), []string{"a1", "a2"}) || !slices.Equal(texts(mb), []string{"b1"}) {
		t.Errorf("messages after Commit: a %v, b %v; want [a1 a2], [b1]", texts(ma), texts(mb))
	}
	if sa.Epoch != "e1" || sa.LastSeq != 3 || sb.Epoch != "eb" || sb.LastSeq != 1 || sa.MessageCount != 2 {
		t.Errorf("cursors after Commit: a %s/%d (%d messages), b %s/%d; want e1/3 (2), eb/1", sa.Epoch, sa.LastSeq, sa.MessageCount, sb.Epoch, sb.LastSeq)
	}
	if sb.EndReason != "closed" || !sb.EndedAt.Equal(T0.Add(time.Minute)) || sa.EndReason != "" {
		t.Errorf("ends after Commit: a %q, b %q at %v; want none, closed at T0+1m", sa.EndReason, sb.EndReason, sb.EndedAt)
	}
	if len(runs) != 1 || runs[0].Status != "complete" || runs[0].StartSeq != 1 || !runs[0].EndedAt.Equal(T0.Add(time.Second)) {
		t.Errorf("runs after Commit: %+v; want r1 complete from seq 1", runs)
	}
	if lastA != 3 || lastB != 1 {
		t.Errorf("journals after Commit: a to %d, b to %d; want 3, 1", lastA, lastB)
	}
	// A commit retried after its events were journaled journals none twice.
	if err := s.Commit(ctx, store.Batch{Events: events(a, 2, 4)}, store.Retention{}); err != nil {
		t.Fatalf("Commit over journaled events: got %v, want nil", err)
	}
	if evs, _, last, err := s.EventsSince(ctx, a, 0, 0); err != nil || len(evs) != 4 || last != 4 {
		t.Errorf("journal after a retried commit: %d events to %d, %v; want 4 to 4", len(evs), last, err)
	}
}

// testWriteFault: with a write fault injected every write fails with
// ErrUnavailable wrapping the cause, is reported once to the fault hook
// and changes nothing; reads keep working; without it writes work again.
func testWriteFault(t *testing.T, s Store) {
	ctx := context.Background()
	key := Key(1)
	mustCreate(t, s, store.Session{Key: key, StartedAt: T0})
	full := errors.New("database or disk is full")
	s.SetWriteFault(func() error { return full })
	writes := map[string]func() error{
		"CreateSession":  func() error { return s.CreateSession(ctx, store.Session{Key: Key(2), StartedAt: T0}) },
		"AppendMessages": func() error { return s.AppendMessages(ctx, key, agent.Message{Role: agent.RoleUser, Text: "x"}) },
		"Commit": func() error {
			return s.Commit(ctx, store.Batch{Events: events(key, 1, 1)}, store.Retention{})
		},
		"StartTurn": func() error {
			return s.StartTurn(ctx, key, agent.Message{Role: agent.RoleUser, Text: "x"}, store.Run{ID: "r", Status: "running"})
		},
		"End":           func() error { return s.End(ctx, key, "closed", T0) },
		"SetCursor":     func() error { return s.SetCursor(ctx, key, "e", 3) },
		"AppendEvents":  func() error { return s.AppendEvents(ctx, events(key, 1, 1), store.Retention{}) },
		"StartRun":      func() error { return s.StartRun(ctx, key, store.Run{ID: "r2", Status: "running"}) },
		"EndRun":        func() error { return s.EndRun(ctx, key, "r", "interrupted", T0) },
		"Reopen":        func() error { return s.Reopen(ctx, key) },
		"SetAgentState": func() error { return s.SetAgentState(ctx, key, "state") },
		"SetTitle":      func() error { return s.SetTitle(ctx, key, "title") },
	}
	var reported []error
	s.OnWriteFault(func(err error) { reported = append(reported, err) })
	for name, w := range writes {
		n := len(reported)
		if err := w(); !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, full) {
			t.Errorf("%s with a full disk: %v; want ErrUnavailable wrapping the cause", name, err)
		}
		if len(reported) != n+1 || !errors.Is(reported[len(reported)-1], store.ErrUnavailable) {
			t.Errorf("%s with a full disk: the fault hook got %d reports, want 1", name, len(reported)-n)
		}
	}
	msgs, err := s.Messages(ctx, key)
	sess, gerr := s.GetSession(ctx, key)
	if err := errors.Join(err, gerr); err != nil || len(msgs) != 0 || sess.EndReason != "" || sess.Title != "" || sess.LastSeq != 0 {
		t.Errorf("reads with a full disk: %v, %+v, %v; want them to work and to see nothing written", msgs, sess, err)
	}
	s.SetWriteFault(nil)
	if err := s.Commit(ctx, store.Batch{
		Messages: []store.Message{{Key: key, Message: agent.Message{Role: agent.RoleUser, Text: "a"}}, {Key: key, Message: agent.Message{Role: agent.RoleAssistant, Text: "b"}}},
		Events:   []store.Event{{Key: key, Seq: 1, Params: []byte(`{"n":1}`)}},
		Cursors:  []store.Cursor{{Key: key, Epoch: "e1", LastSeq: 1}},
	}, store.Retention{}); err != nil {
		t.Fatalf("commit after the fault: %v", err)
	}
	if len(reported) != len(writes) {
		t.Errorf("the fault hook got %d reports after a write that worked, want %d", len(reported), len(writes))
	}
	s.OnWriteFault(nil)
	msgs, _ = s.Messages(ctx, key)
	sess, _ = s.GetSession(ctx, key)
	evs, _, last, _ := s.EventsSince(ctx, key, 0, 0)
	if len(msgs) != 2 || msgs[1].Text != "b" || sess.Epoch != "e1" || sess.LastSeq != 1 || len(evs) != 1 || last != 1 {
		t.Errorf("after one commit: messages %v, cursor %s/%d, %d events to %d; want 2 rows, e1/1, 1 event", texts(msgs), sess.Epoch, sess.LastSeq, len(evs), last)
	}
}

// sized is the event seq of key with params of exactly n bytes (n >= 12).
func sized(key string, seq uint64, n int) store.Event {
	p := fmt.Sprintf(`{"seq":%d,"p":"`, seq)
	p += strings.Repeat("x", max(0, n-len(p)-2)) + `"}`
	return store.Event{Key: key, Seq: seq, Params: json.RawMessage(p)}
}

// journalOf reads key's whole journal: its seqs, its bytes (the params'
// lengths) and its bounds.
func journalOf(t *testing.T, s Store, key string) (seqs []uint64, bytes int64, first, last uint64) {
	t.Helper()
	evs, first, last, err := s.EventsSince(context.Background(), key, 0, 0)
	if err != nil {
		t.Fatalf("EventsSince(%s, 0): %v", key, err)
	}
	for _, e := range evs {
		seqs = append(seqs, e.Seq)
		bytes += int64(len(e.Params))
	}
	return seqs, bytes, first, last
}

// seqRange is [from, to].
func seqRange(from, to uint64) []uint64 {
	var out []uint64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

// testJournalRetentionBytes: past the bytes bound a session's oldest
// events go as with the count bound — the journal is the newest events
// that fit, in one piece, and EventsSince's first says where it starts
// (so a client behind it is told it is truncated) — but its newest event
// always stays, however large; the count and the bytes bounds hold
// together; other sessions' journals are untouched.
func testJournalRetentionBytes(t *testing.T, open func(t *testing.T) Store) {
	ctx := context.Background()
	t.Run("oldest go, the newest that fit stay", func(t *testing.T) {
		s := open(t)
		a, b := Key(1), Key(2)
		mustCreate(t, s, store.Session{Key: a, StartedAt: T0})
		mustCreate(t, s, store.Session{Key: b, StartedAt: T0})
		keep := store.Retention{PerSessionBytes: 1000}
		var evs []store.Event
		for seq := uint64(1); seq <= 30; seq++ {
			evs = append(evs, sized(a, seq, 100))
		}
		for seq := uint64(1); seq <= 5; seq++ {
			evs = append(evs, sized(b, seq, 150))
		}
		if err := s.AppendEvents(ctx, evs, keep); err != nil {
			t.Fatal(err)
		}
		seqs, n, first, last := journalOf(t, s, a)
		if !slices.Equal(seqs, seqRange(21, 30)) || n != 1000 || first != 21 || last != 30 {
			t.Errorf("a past 1000 bytes: seqs %v (%d bytes), bounds %d..%d; want 21..30 (1000 bytes)", seqs, n, first, last)
		}
		if seqs, n, _, _ := journalOf(t, s, b); !slices.Equal(seqs, seqRange(1, 5)) || n != 750 {
			t.Errorf("b within the bound: seqs %v (%d bytes), want 1..5 (750)", seqs, n)
		}
		// Truncated: a client that saw seq 5 gets the journal from its
		// first event, 21.
		if got, first, _, err := s.EventsSince(ctx, a, 5, 0); err != nil || len(got) != 10 || got[0].Seq != 21 || first != 21 {
			t.Errorf("a since 5: %d events from %v, first %d, %v; want 10 from 21, first 21", len(got), got, first, err)
		}
		// One more event of 250 bytes: the three oldest make room.
		if err := s.AppendEvents(ctx, []store.Event{sized(a, 31, 250)}, keep); err != nil {
			t.Fatal(err)
		}
		if seqs, n, first, last := journalOf(t, s, a); !slices.Equal(seqs, seqRange(24, 31)) || n != 950 || first != 24 || last != 31 {
			t.Errorf("a after a 250-byte event: seqs %v (%d bytes), bounds %d..%d; want 24..31 (950 bytes)", seqs, n, first, last)
		}
	})
	t.Run("one event at a time", func(t *testing.T) {
		s := open(t)
		a := Key(1)
		mustCreate(t, s, store.Session{Key: a, StartedAt: T0})
		keep := store.Retention{PerSessionBytes: 4096}
		sizes := []int{700, 20, 3000, 400, 1200, 90, 2500, 60, 1000, 333}
		for i, n := range sizes {
			seq := uint64(i + 1)
			b := store.Batch{Events: []store.Event{sized(a, seq, n)}}
			if err := s.Commit(ctx, b, keep); err != nil {
				t.Fatal(err)
			}
			// The newest events whose bytes fit, in one piece.
			var want []uint64
			var sum int64
			for j := i; j >= 0 && sum+int64(sizes[j]) <= keep.PerSessionBytes; j-- {
				sum += int64(sizes[j])
				want = append([]uint64{uint64(j + 1)}, want...)
			}
			seqs, got, first, last := journalOf(t, s, a)
			if !slices.Equal(seqs, want) || got != sum || first != want[0] || last != seq {
				t.Fatalf("after event %d of %d bytes: seqs %v (%d bytes), bounds %d..%d; want %v (%d bytes)", seq, n, seqs, got, first, last, want, sum)
			}
		}
	})
	t.Run("the newest stays however large", func(t *testing.T) {
		s := open(t)
		a := Key(1)
		mustCreate(t, s, store.Session{Key: a, StartedAt: T0})
		keep := store.Retention{PerSessionBytes: 1024}
		if err := s.AppendEvents(ctx, []store.Event{sized(a, 1, 100), sized(a, 2, 5000)}, keep); err != nil {
			t.Fatal(err)
		}
		if seqs, n, first, last := journalOf(t, s, a); !slices.Equal(seqs, []uint64{2}) || n != 5000 || first != 2 || last != 2 {
			t.Errorf("an event over the bound: seqs %v (%d bytes), bounds %d..%d; want only 2 (5000 bytes)", seqs, n, first, last)
		}
		if err := s.AppendEvents(ctx, []store.Event{sized(a, 3, 3000)}, keep); err != nil {
			t.Fatal(err)
		}
		if seqs, _, first, last := journalOf(t, s, a); !slices.Equal(seqs, []uint64{3}) || first != 3 || last != 3 {
			t.Errorf("another: seqs %v, bounds %d..%d; want only 3", seqs, first, last)
		}
		// Seqs already journaled are ignored, and count no bytes twice.
		if err := s.AppendEvents(ctx, []store.Event{sized(a, 3, 3000), sized(a, 4, 500)}, keep); err != nil {
			t.Fatal(err)
		}
		if seqs, n, _, _ := journalOf(t, s, a); !slices.Equal(seqs, []uint64{4}) || n != 500 {
			t.Errorf("after a retried event: seqs %v (%d bytes); want only 4 (500)", seqs, n)
		}
		if err := s.AppendEvents(ctx, []store.Event{sized(a, 5, 500)}, keep); err != nil {
			t.Fatal(err)
		}
		if seqs, n, _, _ := journalOf(t, s, a); !slices.Equal(seqs, []uint64{4, 5}) || n != 1000 {
			t.Errorf("two that fit: seqs %v (%d bytes); want 4, 5 (1000)", seqs, n)
		}
	})
	t.Run("count and bytes together", func(t *testing.T) {
		for _, tt := range []struct {
			name      string
			keep      store.Retention
			wantFirst uint64
		}{
			{"the count is tighter", store.Retention{PerSession: 5, PerSessionBytes: 1 << 20}, 16},
			{"the bytes are tighter", store.Retention{PerSession: 15, PerSessionBytes: 800}, 13},
			{"the default bytes keep all", store.Retention{PerSession: 100}, 1},
		} {
			t.Run(tt.name, func(t *testing.T) {
				s := open(t)
				a := Key(1)
				mustCreate(t, s, store.Session{Key: a, StartedAt: T0})
				var evs []store.Event
				for seq := uint64(1); seq <= 20; seq++ {
					evs = append(evs, sized(a, seq, 100))
				}
				if err := s.AppendEvents(ctx, evs, tt.keep); err != nil {
					t.Fatal(err)
				}
				if seqs, _, first, last := journalOf(t, s, a); !slices.Equal(seqs, seqRange(tt.wantFirst, 20)) || first != tt.wantFirst || last != 20 {
					t.Errorf("seqs %v, bounds %d..%d; want %d..20", seqs, first, last, tt.wantFirst)
				}
			})
		}
	})
}
