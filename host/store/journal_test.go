package store

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

func events(key string, from, to uint64) []Event {
	var out []Event
	for seq := from; seq <= to; seq++ {
		out = append(out, Event{Key: key, Seq: seq, Params: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, seq))})
	}
	return out
}

func TestJournalAppendAndSince(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	mustCreate(t, s, Session{Key: "20260101_000000_aaaaaa", StartedAt: time.Unix(1, 0)})
	key := "20260101_000000_aaaaaa"
	if err := s.AppendEvents(ctx, events(key, 1, 10), Retention{}); err != nil {
		t.Fatal(err)
	}
	// A duplicate seq is ignored, not an error.
	if err := s.AppendEvents(ctx, events(key, 10, 12), Retention{}); err != nil {
		t.Fatal(err)
	}
	got, first, last, err := s.EventsSince(ctx, key, 4, 0)
	if err != nil {
		t.Fatal(err)
	}
	if first != 1 || last != 12 || len(got) != 8 || got[0].Seq != 5 || got[7].Seq != 12 {
		t.Fatalf("since 4: %d events [%d..], bounds %d..%d; want 8 events 5..12, bounds 1..12", len(got), got[0].Seq, first, last)
	}
	if string(got[0].Params) != `{"seq":5}` {
		t.Errorf("params %s, want {\"seq\":5}", got[0].Params)
	}
	got, _, _, _ = s.EventsSince(ctx, key, 4, 3)
	if len(got) != 3 {
		t.Errorf("limit 3: got %d events", len(got))
	}
	none, first, last, err := s.EventsSince(ctx, "20260101_000000_bbbbbb", 0, 0)
	if err != nil || len(none) != 0 || first != 0 || last != 0 {
		t.Errorf("unknown key: %v %d %d %v, want nothing", none, first, last, err)
	}
}

func TestJournalRetention(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name       string
		keep       Retention
		perKey     uint64
		wantFirstA uint64
		wantFirstB uint64
	}{
		{"per session", Retention{PerSession: 5, Total: 1000}, 20, 16, 16},
		{"total", Retention{PerSession: 1000, Total: 10}, 20, 0, 11},
		{"nothing pruned", Retention{PerSession: 100, Total: 1000}, 20, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openTest(t)
			a, b := "20260101_000000_aaaaaa", "20260101_000000_bbbbbb"
			mustCreate(t, s, Session{Key: a, StartedAt: time.Unix(1, 0)})
			mustCreate(t, s, Session{Key: b, StartedAt: time.Unix(2, 0)})
			if err := s.AppendEvents(ctx, events(a, 1, tt.perKey), tt.keep); err != nil {
				t.Fatal(err)
			}
			if err := s.AppendEvents(ctx, events(b, 1, tt.perKey), tt.keep); err != nil {
				t.Fatal(err)
			}
			_, firstA, lastA, _ := s.EventsSince(ctx, a, 0, 0)
			_, firstB, lastB, _ := s.EventsSince(ctx, b, 0, 0)
			if firstA != tt.wantFirstA || firstB != tt.wantFirstB || lastB != tt.perKey {
				t.Fatalf("after pruning: a %d..%d, b %d..%d; want a from %d, b %d..%d", firstA, lastA, firstB, lastB, tt.wantFirstA, tt.wantFirstB, tt.perKey)
			}
		})
	}
}

func TestRuns(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	key := "20260101_000000_aaaaaa"
	mustCreate(t, s, Session{Key: key, StartedAt: time.Unix(1, 0)})
	if err := s.StartRun(ctx, key, Run{ID: "r1", Status: "running", StartedAt: time.Unix(10, 0), StartSeq: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.StartRun(ctx, key, Run{ID: "r2", Status: "running", StartedAt: time.Unix(20, 0), StartSeq: 9}); err != nil {
		t.Fatal(err)
	}
	if err := s.EndRun(ctx, key, "r1", "complete", time.Unix(15, 0)); err != nil {
		t.Fatal(err)
	}
	// An ended run keeps its first status.
	if err := s.EndRun(ctx, key, "r1", "failed", time.Unix(16, 0)); err != nil {
		t.Fatal(err)
	}
	runs, err := s.Runs(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].ID != "r1" || runs[0].Status != "complete" || runs[0].EndedAt.Unix() != 15 ||
		runs[1].ID != "r2" || runs[1].Status != "running" || !runs[1].EndedAt.IsZero() || runs[1].StartSeq != 9 {
		t.Fatalf("runs %+v", runs)
	}
}
