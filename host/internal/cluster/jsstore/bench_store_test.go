package jsstore

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tether-agent/tether/host/internal/cluster/bus"
	"github.com/tether-agent/tether/host/internal/cluster/clustertest"
	"github.com/tether-agent/tether/host/store"
)

// journal is one layout of a session's event journal, for
// BenchmarkJournalLayouts.
type journal interface {
	// append journals event seq (from 1, one at a time, in order).
	append(ctx context.Context, seq uint64, params []byte) error
	// since reads the events after after, at most limit, and returns how
	// many it read.
	since(ctx context.Context, after uint64, limit int) (int, error)
}

// storeJournal is a session's journal in a host/store-shaped store: the
// SQLite store, or Store (one stream, a subject per session).
type storeJournal struct {
	s interface {
		AppendEvents(ctx context.Context, events []store.Event, keep store.Retention) error
		EventsSince(ctx context.Context, key string, after uint64, limit int) ([]store.Event, uint64, uint64, error)
	}
	key string
}

func (j storeJournal) append(ctx context.Context, seq uint64, params []byte) error {
	return j.s.AppendEvents(ctx, []store.Event{{Key: j.key, Seq: seq, Params: params}}, store.Retention{})
}

func (j storeJournal) since(ctx context.Context, after uint64, limit int) (int, error) {
	evs, _, _, err := j.s.EventsSince(ctx, j.key, after, limit)
	return len(evs), err
}

// streamJournal is the other layout: a stream per session, whose stream
// sequence is the session seq (each publish expects the stream's last
// sequence to be seq-1).
type streamJournal struct {
	js   jetstream.JetStream
	st   jetstream.Stream
	subj string
}

func newStreamJournal(ctx context.Context, js jetstream.JetStream, name string, replicas int) (*streamJournal, error) {
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"bench." + name}, Storage: jetstream.FileStorage, Replicas: replicas})
	if err != nil {
		return nil, err
	}
	return &streamJournal{js: js, st: st, subj: "bench." + name}, nil
}

func (j *streamJournal) append(ctx context.Context, seq uint64, params []byte) error {
	_, err := j.js.PublishMsg(ctx, &nats.Msg{Subject: j.subj, Data: params}, jetstream.WithExpectLastSequence(seq-1))
	return err
}

func (j *streamJournal) since(ctx context.Context, after uint64, limit int) (int, error) {
	info, err := j.st.Info(ctx)
	if err != nil {
		return 0, err
	}
	last := info.State.LastSeq
	if after >= last {
		return 0, nil
	}
	want := int(min(last-after, uint64(limit)))
	cons, err := j.st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: after + 1,
		AckPolicy: jetstream.AckNonePolicy, MemoryStorage: true, InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return 0, err
	}
	defer func() { _ = j.st.DeleteConsumer(ctx, cons.CachedInfo().Name) }()
	n := 0
	for n < want {
		batch, err := cons.Fetch(min(want-n, 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return n, err
		}
		for range batch.Messages() {
			n++
		}
		if err := batch.Error(); err != nil {
			return n, err
		}
	}
	return n, nil
}

// kvJournal is a third layout: a KV key per event, created once.
type kvJournal struct {
	kv  jetstream.KeyValue
	key string
}

func (j kvJournal) append(ctx context.Context, seq uint64, params []byte) error {
	_, err := j.kv.Create(ctx, fmt.Sprintf("e.%s.%d", j.key, seq), params)
	return err
}

func (j kvJournal) since(ctx context.Context, after uint64, limit int) (int, error) {
	// Keys do not sort by seq: the watch reads them all, in stream order.
	w, err := j.kv.Watch(ctx, "e."+j.key+".*")
	if err != nil {
		return 0, err
	}
	defer bus.StopWatch(w)
	n := 0
	for e := range w.Updates() {
		if e == nil {
			break
		}
		var seq uint64
		if _, err := fmt.Sscanf(e.Key()[len("e."+j.key+"."):], "%d", &seq); err == nil && seq > after && n < limit {
			n++
		}
	}
	return n, nil
}

// journalEvents is how many events the reads of BenchmarkJournalLayouts
// read: host/store's default retention per session, so a whole journal.
const journalEvents = 10000

// BenchmarkJournalLayouts compares layouts of the event journal on one
// embedded server with file storage: "append" journals one event per
// call (appends/s), "since" reads a whole journal of 10,000 events
// (EventsSince(0, 10000)), "since-tail" its last 100; "subjects-shared"
// is Store's layout with another session's 10,000 events interleaved
// in the stream, as a shared stream has them; stream-per-session/create
// is the cost of that layout's stream per session. sqlite is host/store,
// for scale.
func BenchmarkJournalLayouts(b *testing.B) {
	ctx := context.Background()
	srv := clustertest.StartServer(b)
	_, js := clustertest.Connect(b, srv.ClientURL())
	params, _ := json.Marshal(map[string]any{"type": "message.delta", "session_id": "0123abcd", "seq": 1, "payload": map[string]string{"text": "a few words of an answer"}})
	var n int
	layouts := []struct {
		name string
		make func(b *testing.B) (main, other journal)
	}{
		{"sqlite", func(b *testing.B) (journal, journal) {
			s, err := store.Open(ctx, filepath.Join(b.TempDir(), "state.db"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			for _, k := range []string{"20250101_000000_000001", "20250101_000000_000002"} {
				if err := s.CreateSession(ctx, store.Session{Key: k, StartedAt: time.Now()}); err != nil {
					b.Fatal(err)
				}
			}
			return storeJournal{s, "20250101_000000_000001"}, storeJournal{s, "20250101_000000_000002"}
		}},
		{"subjects", func(b *testing.B) (journal, journal) {
			n++
			s, err := Open(ctx, js, Config{Prefix: fmt.Sprint("bench", n)})
			if err != nil {
				b.Fatal(err)
			}
			return storeJournal{s, "a"}, storeJournal{s, "b"}
		}},
		{"stream-per-session", func(b *testing.B) (journal, journal) {
			n++
			main, err := newStreamJournal(ctx, js, fmt.Sprint("J", n, "a"), 1)
			if err != nil {
				b.Fatal(err)
			}
			other, err := newStreamJournal(ctx, js, fmt.Sprint("J", n, "b"), 1)
			if err != nil {
				b.Fatal(err)
			}
			return main, other
		}},
		{"kv-per-event", func(b *testing.B) (journal, journal) {
			n++
			kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: fmt.Sprint("bench_kv", n)})
			if err != nil {
				b.Fatal(err)
			}
			return kvJournal{kv, "a"}, kvJournal{kv, "b"}
		}},
	}
	fill := func(b *testing.B, js ...journal) {
		for seq := uint64(1); seq <= journalEvents; seq++ {
			for _, j := range js {
				if err := j.append(ctx, seq, params); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	// What the stream-per-session layout adds to each session's life:
	// its stream, created before its first event.
	b.Run("stream-per-session/create", func(b *testing.B) {
		for b.Loop() {
			n++
			if _, err := newStreamJournal(ctx, js, fmt.Sprint("J", n, "c"), 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("stream-per-session/create-3-node", func(b *testing.B) {
		nodes := clustertest.StartCluster(b, 3)
		_, js3 := clustertest.ConnectNode(b, nodes[0])
		// Creating a replicated stream can fail while the servers are
		// still learning of each other: the first is asked again.
		wctx, cancel := context.WithTimeout(ctx, clustertest.Timeout)
		defer cancel()
		for {
			n++
			_, err := newStreamJournal(wctx, js3, fmt.Sprint("J", n, "r"), 3)
			if err == nil {
				break
			}
			if wctx.Err() != nil {
				b.Fatal(err)
			}
			clustertest.Retry(wctx)
		}
		for b.Loop() {
			n++
			if _, err := newStreamJournal(ctx, js3, fmt.Sprint("J", n, "r"), 3); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, l := range layouts {
		b.Run(l.name+"/append", func(b *testing.B) {
			j, _ := l.make(b)
			seq := uint64(0)
			for b.Loop() {
				seq++
				if err := j.append(ctx, seq, params); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(seq)/b.Elapsed().Seconds(), "appends/s")
		})
		for _, shared := range []bool{false, true} {
			if shared && l.name != "subjects" {
				continue
			}
			name := l.name
			if shared {
				name = "subjects-shared"
			}
			b.Run(name+"/since", func(b *testing.B) {
				j, other := l.make(b)
				if shared {
					fill(b, j, other)
				} else {
					fill(b, j)
				}
				for b.Loop() {
					got, err := j.since(ctx, 0, journalEvents)
					if err != nil || got != journalEvents {
						b.Fatalf("since 0: got %d events, %v; want %d", got, err, journalEvents)
					}
				}
				b.ReportMetric(float64(b.N*journalEvents)/b.Elapsed().Seconds(), "events/s")
			})
			b.Run(name+"/since-tail", func(b *testing.B) {
				j, other := l.make(b)
				if shared {
					fill(b, j, other)
				} else {
					fill(b, j)
				}
				for b.Loop() {
					got, err := j.since(ctx, journalEvents-100, 100)
					if err != nil || got != 100 {
						b.Fatalf("since tail: got %d events, %v; want 100", got, err)
					}
				}
			})
		}
	}
}
