package jsstore

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// entry is a jetstream.KeyValueEntry of a watch of the rows.
type entry struct {
	key string
	val []byte
	rev uint64
	op  jetstream.KeyValueOp
}

func (e entry) Bucket() string                  { return "test_store" }
func (e entry) Key() string                     { return e.key }
func (e entry) Value() []byte                   { return e.val }
func (e entry) Revision() uint64                { return e.rev }
func (e entry) Created() time.Time              { return time.Time{} }
func (e entry) Delta() uint64                   { return 0 }
func (e entry) Operation() jetstream.KeyValueOp { return e.op }

// put is the watch's entry of key's row titled title at stream sequence
// rev.
func put(t *testing.T, key, title string, rev uint64) jetstream.KeyValueEntry {
	t.Helper()
	val, err := json.Marshal(row{Title: title})
	if err != nil {
		t.Fatal(err)
	}
	return entry{key: rowKey(key), val: val, rev: rev, op: jetstream.KeyValuePut}
}

// watch is a watch's updates channel holding es, then closed.
func watch(es ...jetstream.KeyValueEntry) <-chan jetstream.KeyValueEntry {
	ch := make(chan jetstream.KeyValueEntry, len(es))
	for _, e := range es {
		ch <- e
	}
	close(ch)
	return ch
}

// TestCollectRows: the rows of a watch are every write up to the last
// row's stream sequence, also when the watch's server lagged the leader
// and ended its initial values before it (a replica of a replicated
// bucket: FindByTitle on a 3-server cluster found an older session of
// the title). Past the initial values it waits, within its budget, for
// the lagging server to deliver that sequence.
func TestCollectRows(t *testing.T) {
	ctx := context.Background()
	titles := func(rows map[string]row) map[string]string {
		out := map[string]string{}
		for k, r := range rows {
			out[k] = r.Title
		}
		return out
	}
	for _, tt := range []struct {
		name    string
		updates <-chan jetstream.KeyValueEntry
		last    uint64
		want    map[string]string
	}{
		{"caught up", watch(put(t, "a", "work", 1), put(t, "b", "work", 2), nil), 2,
			map[string]string{"a": "work", "b": "work"}},
		{"caught up, a later write not awaited", watch(put(t, "a", "work", 1), nil, put(t, "b", "late", 2)), 1,
			map[string]string{"a": "work"}},
		{"lagging: the rest after the initial values", watch(put(t, "a", "work", 1), put(t, "b", "old", 2), nil, put(t, "b", "work", 4), put(t, "c", "work", 5)), 5,
			map[string]string{"a": "work", "b": "work", "c": "work"}},
		{"lagging: the last write deletes a row", watch(put(t, "a", "work", 1), nil, entry{key: rowKey("a"), rev: 2, op: jetstream.KeyValueDelete}), 2,
			map[string]string{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := collectRows(ctx, tt.updates, tt.last, time.Minute)
			if err != nil {
				t.Fatalf("collectRows: %v", err)
			}
			got := titles(rows)
			if len(got) != len(tt.want) {
				t.Errorf("rows: got %v, want %v", got, tt.want)
			}
			for k, title := range tt.want {
				if got[k] != title {
					t.Errorf("row %s: got %q, want %q (all: %v)", k, got[k], title, got)
				}
			}
		})
	}

	// A server that never delivers the last row: an error the store
	// reports as unreachable, after the budget.
	never := make(chan jetstream.KeyValueEntry, 2)
	never <- put(t, "a", "work", 1)
	never <- nil
	if _, err := collectRows(ctx, never, 3, time.Millisecond); !errors.Is(err, context.DeadlineExceeded) || !noAnswer(err) {
		t.Errorf("never caught up: got %v, want a timeout", err)
	}
	if _, err := collectRows(ctx, watch(put(t, "a", "work", 1)), 1, time.Minute); err == nil {
		t.Error("a watch that ended before its initial values: got no error")
	}
}
