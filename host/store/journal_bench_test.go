package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// BenchmarkCommitEvents commits batches of events as the table's journal
// does: a group commit of 100 events of 200 bytes over 10 sessions whose
// journals are at their count bound (so every commit prunes each); one
// of 2,000 events over 1,000 sessions (a storm's: every session touched,
// none pruned); and one of a 1 MiB event, in a journal at its bytes
// bound.
func BenchmarkCommitEvents(b *testing.B) {
	for _, tc := range []struct {
		name     string
		sessions int
		perBatch int
		size     int
		keep     Retention
		fill     int // commits before the timer starts
	}{
		{"pruned/100x200B", 10, 100, 200, Retention{PerSession: 1000}, 200},
		{"spread/2000x200B", 1000, 2000, 200, Retention{}, 1},
		{"big/1x1MiB", 1, 1, 1 << 20, Retention{PerSessionBytes: 16 << 20}, 20},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := openTest(b)
			ctx := context.Background()
			keys := make([]string, tc.sessions)
			for i := range keys {
				keys[i] = fmt.Sprintf("20250102_030405_%06d", i)
				mustCreate(b, s, Session{Key: keys[i], StartedAt: t0})
			}
			params := []byte(`{"text":"` + strings.Repeat("x", tc.size-11) + `"}`)
			seq := make([]uint64, tc.sessions)
			batch := func() Batch {
				var bt Batch
				for i := range tc.perBatch {
					k := i % tc.sessions
					seq[k]++
					bt.Events = append(bt.Events, Event{Key: keys[k], Seq: seq[k], Params: params})
				}
				return bt
			}
			for range tc.fill {
				if err := s.Commit(ctx, batch(), tc.keep); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(tc.perBatch * len(params)))
			b.ResetTimer()
			for range b.N {
				if err := s.Commit(ctx, batch(), tc.keep); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
