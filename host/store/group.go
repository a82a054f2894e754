package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Group commit. The writes a burst makes (prompts and their runs,
// journal appends, display rows) are not committed one transaction
// each: they queue for one writer goroutine, which takes all that has
// queued (up to maxGroup) and commits it in one transaction, each write
// in a savepoint of its own, so that a write that fails (a prompt to a
// session that is not stored) is rolled back alone and the others
// commit. When the group as a whole fails (a full disk, a failed
// COMMIT) each of its writes is tried again alone, so every caller gets
// the answer its own write would have had. A caller whose context ends
// while its write is still queued takes the write out of the queue:
// it was not made, and the caller is answered an *OverloadError.

// maxGroup bounds the writes one transaction commits.
const maxGroup = 1024

// Retry hints of an *OverloadError: the time the queue ahead would take
// at the writer's recent pace, within these bounds.
const (
	minRetryAfter = 50 * time.Millisecond
	maxRetryAfter = 10 * time.Second
)

// ErrOverloaded: a write waited in the writer's queue until its caller's
// context ended, and was taken out of the queue unmade. Asking again
// later is the remedy. It comes as an *OverloadError.
var ErrOverloaded = errors.New("storage overloaded")

// errClosed answers a write queued after Close.
var errClosed = errors.New("store closed")

// OverloadError is a write that was not made because it waited too long
// for the writer (ErrOverloaded): nothing of it was stored.
type OverloadError struct {
	// Queued is how many writes were queued when it gave up.
	Queued int
	// RetryAfter is a hint of when to ask again: about the time the
	// writes queued then take.
	RetryAfter time.Duration
	// Err is the context's error.
	Err error
}

func (e *OverloadError) Error() string {
	return fmt.Sprintf("%v: %d writes queued, retry after %v: %v", ErrOverloaded, e.Queued, e.RetryAfter, e.Err)
}

// Is makes errors.Is(err, ErrOverloaded) true.
func (e *OverloadError) Is(target error) bool { return target == ErrOverloaded }

// Unwrap returns the context's error.
func (e *OverloadError) Unwrap() error { return e.Err }

// WriteStats counts what the writer committed.
type WriteStats struct {
	// Commits is the transactions committed or tried.
	Commits uint64
	// Writes is the writes (calls) those transactions carried.
	Writes uint64
	// MaxGroup is the most writes one transaction carried.
	MaxGroup int
	// Abandoned is the writes taken out of the queue unmade
	// (OverloadError).
	Abandoned uint64
}

// txFunc is one write, made in tx. Its ctx is the caller's, without its
// cancellation: a write the writer has begun is finished.
type txFunc func(ctx context.Context, tx *sql.Tx) error

// The states of a queued write.
const (
	opQueued int32 = iota
	opTaken
	opAbandoned
)

// groupOp is one queued write.
type groupOp struct {
	ctx   context.Context
	label string
	fn    txFunc
	state atomic.Int32
	done  chan error // buffered: the writer never waits for the caller
}

// committer is the writer goroutine's queue.
type committer struct {
	wake    chan struct{} // buffered 1
	stopped chan struct{} // closed when the writer has returned

	commits, writes, abandoned atomic.Uint64
	maxGroup                   atomic.Int64
	perWrite                   atomic.Int64 // recent time per write, ns (moving average)

	mu     sync.Mutex // guards the fields below
	queue  []*groupOp
	closed bool
}

// startWriter starts the writer goroutine; stopWriter (Close) stops it.
func (s *Store) startWriter() {
	w := &committer{wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	s.w = w
	go s.writeLoop(w)
}

// stopWriter makes the writer commit what is queued and return, and
// waits for it. It is idempotent.
func (s *Store) stopWriter() {
	w := s.w
	if w == nil {
		return
	}
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	<-w.stopped
}

// WriteStats returns what the writer has committed so far.
func (s *Store) WriteStats() WriteStats {
	w := s.w
	if w == nil {
		return WriteStats{}
	}
	return WriteStats{Commits: w.commits.Load(), Writes: w.writes.Load(), MaxGroup: int(w.maxGroup.Load()), Abandoned: w.abandoned.Load()}
}

// group makes one write through the writer: queued, then committed
// with what else has queued. label prefixes errors of the transaction
// itself (its begin or commit).
func (s *Store) group(ctx context.Context, label string, fn txFunc) error {
	w := s.w
	if w == nil {
		return s.alone(ctx, label, fn)
	}
	if err := ctx.Err(); err != nil {
		return &OverloadError{RetryAfter: minRetryAfter, Err: err}
	}
	op := &groupOp{ctx: ctx, label: label, fn: fn, done: make(chan error, 1)}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return fmt.Errorf("%s: %w", label, errClosed)
	}
	w.queue = append(w.queue, op)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	select {
	case err := <-op.done:
		return err
	case <-ctx.Done():
	}
	if !op.state.CompareAndSwap(opQueued, opAbandoned) {
		return <-op.done // the writer has it: its answer comes soon
	}
	w.abandoned.Add(1)
	w.mu.Lock()
	queued := len(w.queue)
	w.mu.Unlock()
	return &OverloadError{Queued: queued, RetryAfter: w.retryAfter(queued), Err: ctx.Err()}
}

// retryAfter is the hint for a caller that gave up with queued writes
// ahead: about the time they take at the recent pace.
func (w *committer) retryAfter(queued int) time.Duration {
	d := time.Duration(int64(queued) * w.perWrite.Load())
	return min(max(d, minRetryAfter), maxRetryAfter)
}

// writeLoop is the writer: it commits what has queued, a group at a
// time, until the store is closed and the queue is empty.
func (s *Store) writeLoop(w *committer) {
	defer close(w.stopped)
	for {
		w.mu.Lock()
		n := min(len(w.queue), maxGroup)
		batch := make([]*groupOp, 0, n)
		batch = append(batch, w.queue[:n]...)
		if n == len(w.queue) {
			w.queue = nil
		} else {
			w.queue = w.queue[n:]
		}
		closed := w.closed
		w.mu.Unlock()
		if n == 0 {
			if closed {
				return
			}
			<-w.wake
			continue
		}
		taken := batch[:0]
		for _, op := range batch {
			if op.state.CompareAndSwap(opQueued, opTaken) {
				taken = append(taken, op)
			}
		}
		s.commitGroup(w, taken)
	}
}

// commitGroup commits ops in one transaction and answers each.
func (s *Store) commitGroup(w *committer, ops []*groupOp) {
	if len(ops) == 0 {
		return
	}
	start := time.Now()
	errs, err := s.tryGroup(ops)
	commits := 1
	if err != nil {
		// The group failed as a whole: each write alone, for its own
		// answer.
		errs = make([]error, len(ops))
		for i, op := range ops {
			errs[i] = s.alone(context.WithoutCancel(op.ctx), op.label, op.fn)
		}
		commits += len(ops)
	}
	per := int64(time.Since(start)) / int64(len(ops))
	if old := w.perWrite.Load(); old > 0 {
		per = (3*old + per) / 4
	}
	w.perWrite.Store(per)
	// Writes before commits: a reader between the two never sees more
	// transactions than the writes they carried.
	w.writes.Add(uint64(len(ops)))
	w.commits.Add(uint64(commits))
	if int64(len(ops)) > w.maxGroup.Load() {
		w.maxGroup.Store(int64(len(ops)))
	}
	for i, op := range ops {
		op.done <- errs[i]
	}
}

// tryGroup makes ops in one transaction, each in a savepoint of its
// own: a write that fails is rolled back alone, with its error in errs.
// A storage fault, or a failure of the transaction itself, fails the
// group (err): nothing of it was committed.
func (s *Store) tryGroup(ops []*groupOp) (errs []error, err error) {
	if len(ops) == 1 {
		op := ops[0]
		return []error{s.alone(context.WithoutCancel(op.ctx), op.label, op.fn)}, nil
	}
	ctx := context.Background()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	errs = make([]error, len(ops))
	for i, op := range ops {
		if _, err := tx.ExecContext(ctx, `SAVEPOINT write`); err != nil {
			return nil, fmt.Errorf("savepoint: %w", err)
		}
		if err := op.fn(context.WithoutCancel(op.ctx), tx); err != nil {
			if storageFault(err) {
				return nil, err
			}
			if _, rerr := tx.ExecContext(ctx, `ROLLBACK TO write`); rerr != nil {
				return nil, fmt.Errorf("rollback to savepoint: %w", rerr)
			}
			errs[i] = err
		}
		if _, err := tx.ExecContext(ctx, `RELEASE write`); err != nil {
			return nil, fmt.Errorf("release savepoint: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return errs, nil
}

// alone makes one write in a transaction of its own.
func (s *Store) alone(ctx context.Context, label string, fn txFunc) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", label, err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", label, err)
	}
	return nil
}
