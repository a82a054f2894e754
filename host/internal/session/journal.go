package session

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/store"
)

// Journal retry and backlog bounds.
const (
	// retryMin and retryMax bound the wait between commit attempts while
	// the database cannot be written.
	retryMin = 50 * time.Millisecond
	retryMax = 2 * time.Second
	// maxBacklog is how many bytes of withheld events may pile up while
	// commits fail before the runs producing them are interrupted.
	maxBacklog = 64 << 20
	// faultLogEvery rate-limits the error log of a failing database.
	faultLogEvery = 10 * time.Second
)

// journal makes events durable before clients see them. Emitters queue
// each event with the viewers it goes to (never blocking, under the
// session's lock), together with the rows that must be stored with it
// (an answer, a run's end, the cursor); one writer goroutine commits what
// is queued in one transaction and only then delivers those frames, in
// seq order. When a commit fails (disk full, I/O error) nothing of the
// batch is delivered: it stays queued, later events queue behind it, and
// the writer retries with backoff until a commit succeeds, then delivers
// everything in order. So every event a client was sent is in state.db,
// also after a kill -9, and a seq is never shown to a client before its
// event is stored.
type journal struct {
	store   store.Backend
	keep    store.Retention
	log     zerolog.Logger
	metrics *metrics.Metrics
	// overloaded is called (no lock held) when the withheld backlog
	// passes maxBacklog: it stops what produces events.
	overloaded func()
	wake       chan struct{}
	stop       chan struct{}
	done       chan struct{}
	// life ends at close, cutting a commit in flight short (a store that
	// does not answer must not hold a shutdown past its budget).
	life   context.Context
	cancel context.CancelFunc

	mu        sync.Mutex // guards the fields below
	cond      *sync.Cond // signalled when delivered grows
	pending   []journalEntry
	bytes     int    // frame bytes in pending
	added     uint64 // entries ever queued
	delivered uint64 // entries ever committed and delivered (or given up on at close)
	failing   error  // the last commit's error while commits fail; nil when healthy
}

// journalEntry is one thing waiting for the commit of everything queued
// before it: an event (with the rows stored with it), rows alone, or a
// frame to one viewer that must not overtake the events before it (a
// bind's snapshot).
type journalEntry struct {
	s       *Session // whose committed seq the event advances; nil for none
	ev      *store.Event
	ops     ops
	frame   []byte
	viewers []Viewer
	done    chan error // if not nil, told the outcome once committed
}

// ops are the rows stored in the same transaction as an entry's event.
type ops struct {
	messages []store.Message
	runEnds  []store.RunEnd
	runSeqs  []store.RunSeq
	ends     []store.End
	cursor   *store.Cursor
}

func newJournal(st store.Backend, keep store.Retention, log zerolog.Logger, m *metrics.Metrics) *journal {
	j := &journal{store: st, keep: keep, log: log, metrics: m, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	j.cond = sync.NewCond(&j.mu)
	j.life, j.cancel = context.WithCancel(context.Background())
	go j.run()
	return j
}

// add queues an event of s (with the rows to store with it); it never
// blocks.
func (j *journal) add(s *Session, seq uint64, params json.RawMessage, frame []byte, viewers []Viewer, o ops) {
	j.enqueue(journalEntry{s: s, ev: &store.Event{Key: s.key, Seq: seq, Params: params}, ops: o, frame: frame, viewers: viewers})
}

// addFrame queues frame for v behind everything queued so far.
func (j *journal) addFrame(v Viewer, frame []byte) {
	j.enqueue(journalEntry{frame: frame, viewers: []Viewer{v}})
}

// addOps queues rows to store and returns a channel told the outcome.
func (j *journal) addOps(o ops) <-chan error {
	done := make(chan error, 1)
	j.enqueue(journalEntry{ops: o, done: done})
	return done
}

func (j *journal) enqueue(e journalEntry) {
	j.mu.Lock()
	j.pending = append(j.pending, e)
	j.bytes += len(e.frame)
	j.added++
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// health is nil while commits succeed, else the error of the last one.
func (j *journal) health() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.failing
}

func (j *journal) run() {
	defer close(j.done)
	for {
		select {
		case <-j.wake:
		case <-j.stop:
			j.flushPending(false)
			return
		}
		if !j.flushPending(true) {
			j.flushPending(false) // stopped while retrying: one last try
			return
		}
	}
}

// flushPending commits everything queued, then delivers it. With retry
// it waits and tries again while commits fail, until one succeeds or the
// journal is stopped (it then reports false); without, it gives up after
// one failed attempt, and what is queued is dropped undelivered.
func (j *journal) flushPending(retry bool) bool {
	wait := retryMin
	var lastLog time.Time
	failures := 0
	for {
		j.mu.Lock()
		batch := j.pending
		j.mu.Unlock()
		if len(batch) == 0 {
			return true
		}
		var b store.Batch
		for _, e := range batch {
			if e.ev != nil {
				b.Events = append(b.Events, *e.ev)
			}
			b.Messages = append(b.Messages, e.ops.messages...)
			b.RunEnds = append(b.RunEnds, e.ops.runEnds...)
			b.RunSeqs = append(b.RunSeqs, e.ops.runSeqs...)
			b.Ends = append(b.Ends, e.ops.ends...)
			if e.ops.cursor != nil {
				b.Cursors = append(b.Cursors, *e.ops.cursor)
			}
		}
		ctx, cancel := context.WithTimeout(j.life, 10*time.Second)
		err := j.store.Commit(ctx, b, j.keep)
		cancel()
		if err != nil {
			failures++
			if !errors.Is(err, store.ErrUnavailable) {
				// Storage faults are counted where every write's are
				// (Table.storeFault); this is some other failure.
				j.metrics.StoreErrors.Inc()
			}
			j.mu.Lock()
			j.failing = err
			backlog := j.bytes
			j.mu.Unlock()
			if time.Since(lastLog) >= faultLogEvery {
				j.log.Error().Err(err).Int("withheld", len(batch)).Int("failed_commits", failures).
					Msg("cannot write the journal; events are withheld from clients until a commit succeeds")
				lastLog = time.Now()
			}
			if backlog > maxBacklog && j.overloaded != nil {
				j.overloaded()
			}
			if !retry {
				j.drop(len(batch), err)
				return false
			}
			select {
			case <-j.stop:
				return false
			case <-time.After(wait):
			}
			wait = min(2*wait, retryMax)
			continue
		}
		if failures > 0 {
			j.log.Warn().Int("failed_commits", failures).Int("delivered", len(batch)).Msg("the journal is written again; withheld events delivered")
			failures = 0
		}
		j.mu.Lock()
		j.pending = j.pending[len(batch):]
		j.failing = nil
		for _, e := range batch {
			j.bytes -= len(e.frame)
		}
		j.mu.Unlock()
		// Committed: the sessions' committed seqs move on, then the
		// frames go out in order.
		top := map[*Session]uint64{}
		for _, e := range batch {
			if e.s != nil && e.ev != nil {
				top[e.s] = max(top[e.s], e.ev.Seq)
			}
		}
		for s, seq := range top {
			s.setCommitted(seq)
		}
		for _, e := range batch {
			for _, v := range e.viewers {
				v.Send(e.frame)
			}
			if e.done != nil {
				e.done <- nil
			}
		}
		j.mu.Lock()
		j.delivered += uint64(len(batch))
		j.cond.Broadcast()
		j.mu.Unlock()
		wait = retryMin
	}
}

// drop gives up on the first n queued entries at close: they were
// never delivered.
func (j *journal) drop(n int, err error) {
	j.mu.Lock()
	dropped := j.pending[:n]
	j.pending = j.pending[n:]
	for _, e := range dropped {
		j.bytes -= len(e.frame)
	}
	j.delivered += uint64(n)
	j.cond.Broadcast()
	j.mu.Unlock()
	for _, e := range dropped {
		if e.done != nil {
			e.done <- err
		}
	}
	j.log.Error().Err(err).Int("entries", n).Msg("the journal could not be written before shutdown; withheld events were never delivered and are lost")
}

// flush waits until every entry queued before the call is committed and
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
			if j.failing != nil {
				return errors.Join(ctx.Err(), j.failing)
			}
			return ctx.Err()
		}
		j.cond.Wait()
	}
	return nil
}

// close delivers what can be committed and stops the writer.
func (j *journal) close() {
	select {
	case <-j.stop:
	default:
		close(j.stop)
	}
	j.cancel()
	<-j.done
}
