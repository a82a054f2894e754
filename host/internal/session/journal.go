package session

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/store"
)

// journal makes events durable before clients see them: emitters queue
// each event with the viewers it goes to (never blocking, under the
// session's lock); one writer goroutine commits what is queued in one
// transaction and only then delivers those frames, in seq order. So every
// event a client was sent is in state.db, also after a kill -9.
type journal struct {
	store *store.Store
	keep  store.Retention
	log   zerolog.Logger
	wake  chan struct{}
	stop  chan struct{}
	done  chan struct{}

	mu        sync.Mutex // guards the fields below
	cond      *sync.Cond // signalled when delivered grows
	pending   []journalEntry
	added     uint64 // entries ever queued
	delivered uint64 // entries ever committed (or given up on) and delivered
}

// journalEntry is one event waiting for its commit.
type journalEntry struct {
	ev      store.Event
	frame   []byte
	viewers []Viewer
}

func newJournal(st *store.Store, keep store.Retention, log zerolog.Logger) *journal {
	j := &journal{store: st, keep: keep, log: log, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	j.cond = sync.NewCond(&j.mu)
	go j.run()
	return j
}

// add queues an event; it never blocks.
func (j *journal) add(key string, seq uint64, params json.RawMessage, frame []byte, viewers []Viewer) {
	j.mu.Lock()
	j.pending = append(j.pending, journalEntry{ev: store.Event{Key: key, Seq: seq, Params: params}, frame: frame, viewers: viewers})
	j.added++
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

func (j *journal) run() {
	defer close(j.done)
	for {
		select {
		case <-j.wake:
		case <-j.stop:
			j.flushPending()
			return
		}
		j.flushPending()
	}
}

// flushPending commits everything queued, then delivers it.
func (j *journal) flushPending() {
	for {
		j.mu.Lock()
		batch := j.pending
		j.pending = nil
		j.mu.Unlock()
		if len(batch) == 0 {
			return
		}
		events := make([]store.Event, len(batch))
		for i := range batch {
			events[i] = batch[i].ev
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := j.store.AppendEvents(ctx, events, j.keep)
		cancel()
		if err != nil {
			// Availability over durability: the clients still get the
			// events; the journal has a hole that resume reports as
			// truncated.
			j.log.Error().Err(err).Int("events", len(events)).Msg("journaling events")
		}
		for _, e := range batch {
			for _, v := range e.viewers {
				v.Send(e.frame)
			}
		}
		j.mu.Lock()
		j.delivered += uint64(len(batch))
		j.cond.Broadcast()
		j.mu.Unlock()
	}
}

// flush waits until every event queued before the call is committed and
// delivered, or ctx ends.
func (j *journal) flush(ctx context.Context) error {
	j.mu.Lock()
	target := j.added
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
	stop := context.AfterFunc(ctx, func() {
		j.mu.Lock()
		j.cond.Broadcast()
		j.mu.Unlock()
	})
	defer stop()
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.delivered < target {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		j.cond.Wait()
	}
	return nil
}

// close delivers what is queued and stops the writer.
func (j *journal) close() {
	select {
	case <-j.stop:
	default:
		close(j.stop)
	}
	<-j.done
}
