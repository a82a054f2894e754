package session

import (
	"context"
	"database/sql"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
)

// TestEpochChangesWhenJournalLost: when the journal has lost events the
// session had sent (the database restored from an older backup, or the
// file lost), resuming the session starts a new epoch, and the events
// after it never reuse a seq the old epoch had sent. With the journal
// intact the epoch is kept.
func TestEpochChangesWhenJournalLost(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lose    string // the SQL that loses history, with the session key as ?1
		changed bool
	}{
		{"intact", ``, false},
		{"tail lost", `DELETE FROM events WHERE session_key = ?1 AND seq > 2`, true},
		{"journal lost", `DELETE FROM events WHERE session_key = ?1`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "state.db")
			ft := newFaultTable(t, path)
			v := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}}
			s, snap := ft.open(t, v)
			if _, err := s.Submit("hello"); err != nil {
				t.Fatal(err)
			}
			ft.say("one ")
			ft.say("two ")
			close(ft.agent.step)
			ft.tbl.wg.Wait()
			if err := ft.flush(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			sent := v.events(t)
			oldLatest := sent[len(sent)-1].Seq
			if len(sent) != 4 || oldLatest != 4 {
				t.Fatalf("before the restart: %d events up to seq %d, want 4 up to 4", len(sent), oldLatest)
			}
			ft.stop(t)

			if tc.lose != "" {
				db, err := sql.Open("sqlite", path)
				if err != nil {
					t.Fatal(err)
				}
				res, err := db.Exec(tc.lose, snap.SessionKey)
				if err != nil {
					t.Fatal(err)
				}
				if n, _ := res.RowsAffected(); n == 0 {
					t.Fatal("losing history deleted no event")
				}
				db.Close()
			}

			ft2 := newFaultTable(t, path)
			defer ft2.stop(t)
			v2 := &fakeViewer{id: contract.TransportID{Instance: "b", Conn: 1}}
			var again Snapshot
			if err := ft2.tbl.Resume(ctx, v2, snap.SessionKey, capture(v2, &again)); err != nil {
				t.Fatal(err)
			}
			if changed := again.Epoch != snap.Epoch; changed != tc.changed {
				t.Fatalf("epoch after restart %s, before %s: changed %v, want %v", again.Epoch, snap.Epoch, changed, tc.changed)
			}
			if again.LatestSeq < oldLatest {
				t.Errorf("latest_seq after restart %d, want at least %d (the old epoch's seqs are never reused)", again.LatestSeq, oldLatest)
			}

			// New events: under the resumed epoch, numbered after every
			// seq the old epoch sent.
			s2, _ := ft2.tbl.Lookup(again.SessionID)
			if _, err := s2.Submit("again"); err != nil {
				t.Fatal(err)
			}
			ft2.say("three ")
			close(ft2.agent.step)
			ft2.tbl.wg.Wait()
			if err := ft2.flush(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			evs := v2.events(t)
			if len(evs) != 3 {
				t.Fatalf("after the restart: %d events, want 3", len(evs))
			}
			for i, e := range evs {
				if want := oldLatest + uint64(i) + 1; e.Seq != want {
					t.Errorf("new event %d (%s) has seq %d, want %d", i, e.Type, e.Seq, want)
				}
			}
			res, err := s2.EventsSince(ctx, oldLatest)
			if err != nil {
				t.Fatal(err)
			}
			if res.Epoch != again.Epoch || len(res.Events) != 3 {
				t.Errorf("events.since %d: epoch %s with %d events; want %s with the 3 new", oldLatest, res.Epoch, len(res.Events), again.Epoch)
			}
			for i, raw := range res.Events {
				var e eventParams
				if err := json.Unmarshal(raw, &e); err != nil {
					t.Fatal(err)
				}
				if e.Seq != evs[i].Seq || e.Type != evs[i].Type {
					t.Errorf("journal event %d: %s seq %d, viewer got %s seq %d", i, e.Type, e.Seq, evs[i].Type, evs[i].Seq)
				}
			}
			if tc.changed {
				// What the old epoch sent is not claimed by the new one.
				res, err := s2.EventsSince(ctx, 0)
				if err != nil {
					t.Fatal(err)
				}
				for _, raw := range res.Events {
					var e eventParams
					_ = json.Unmarshal(raw, &e)
					if e.Seq > 2 && e.Seq <= oldLatest {
						t.Errorf("the new epoch's journal holds seq %d, a seq the old epoch sent and lost", e.Seq)
					}
				}
			}
		})
	}
}
