package transportkit

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"github.com/tether-agent/tether/contract"
)

// DefaultEventBuffer bounds a Queue whose limit is not set: 16 MiB.
const DefaultEventBuffer = 16 << 20

// eventOverhead is what one queued event counts against the limit
// besides its payload.
const eventOverhead = int64(unsafe.Sizeof(contract.Event{}))

// keepBatchCap is the largest batch slice kept for reuse between
// deliveries.
const keepBatchCap = 1024

// Queue holds a transport's events on their way to the host and runs the
// transport's Link and the end of its Stop.
//
// Events are delivered in the order they were pushed. Link hands the sink
// everything pending at once, so events batch while the sink is busy;
// events pushed while no link runs wait for the next one. A frame pushed
// while the link is idle and nothing else is pending is handed to the
// sink by PushFrame itself, from the pusher's goroutine: a request then
// reaches the host with no goroutine hand-off. The sink is never called
// twice at once, nor after Link has returned. A batch the
// sink rejects is kept and delivered first to the next link (a sink that
// failed half-way sees some events twice).
//
// The queue is bounded by bytes: each event counts its payload plus
// about 200 bytes. Push never waits (use it for Opened and Closed, whose
// number the open connections bound); PushFrame waits while the queue is
// over its limit, so a reader that pushes the frames of its socket stops
// reading it and lets the kernel push back on the peer. There is always
// room for one event, whatever its size.
//
// Stop runs a transport's own stop once, then lets the running link
// deliver what is left and return; later Stops wait for the first.
//
// A Queue's lock is taken last: a transport may hold its own locks while
// it calls Push or Wake, but not while it calls PushFrame (which waits),
// Link or Stop; PushFrame calls keep with no lock of the Queue's held.
// The zero value is not usable; call NewQueue.
type Queue struct {
	wake chan struct{} // wakes the link; capacity 1

	mu   sync.Mutex // guards the fields below
	idle sync.Cond  // on mu: signalled when an inline delivery ends
	evs  []contract.Event
	// The running link's sink and context, for PushFrame's inline
	// deliveries; delivering while one runs; sinkErr is an inline
	// delivery's failure, for the link to return.
	sink       contract.EventSink
	linkCtx    context.Context
	delivering bool
	sinkErr    error
	onPark     func() // tests: called when the link waits with nothing to deliver
	bytes      int64
	limit      int64
	space      chan struct{} // closed and replaced when space frees, and by Wake
	linkDone   chan struct{} // non-nil while a link runs; closed when it returns
	stopDone   chan struct{} // non-nil once Stop began; closed when the first Stop returns
	stopped    bool          // Stop's stop function returned: the link drains and returns
}

// NewQueue returns an empty Queue bounded by limit bytes (0 or less:
// DefaultEventBuffer).
func NewQueue(limit int64) *Queue {
	q := &Queue{wake: make(chan struct{}, 1), space: make(chan struct{})}
	q.idle.L = &q.mu
	q.SetLimit(limit)
	return q
}

// SetLimit changes the bound to limit bytes (0 or less:
// DefaultEventBuffer). A transport whose bound is configured after it
// was made, at Start say, calls it then.
func (q *Queue) SetLimit(limit int64) {
	if limit <= 0 {
		limit = DefaultEventBuffer
	}
	q.mu.Lock()
	q.limit = limit
	q.wakePushersLocked()
	q.mu.Unlock()
}

func eventSize(e *contract.Event) int64 { return eventOverhead + int64(len(e.Data)) }

// Push queues e without waiting. A transport that must keep e in order
// with its connection table (an Opened after the connection is
// registered, a Closed after it is removed) calls Push with that table's
// lock held.
func (q *Queue) Push(e contract.Event) {
	q.mu.Lock()
	q.evs = append(q.evs, e)
	q.bytes += eventSize(&e)
	q.mu.Unlock()
	q.wakeLink()
}

// PushFrame queues e, waiting while the queue is over its limit. It
// calls keep before each try and drops e, returning false, as soon as
// keep returns false: the connection is closing and the host wants no
// more of it. A transport calls Wake when what keep reports may have
// changed, so that a waiting PushFrame looks again. The Queue keeps
// e.Data until it is delivered.
func (q *Queue) PushFrame(e contract.Event, keep func() bool) bool {
	size := eventSize(&e)
	for {
		if !keep() {
			return false
		}
		q.mu.Lock()
		if q.bytes == 0 || q.bytes+size <= q.limit {
			q.evs = append(q.evs, e)
			q.bytes += size
			if len(q.evs) == 1 && q.sink != nil && !q.delivering && !q.stopped && q.sinkErr == nil {
				q.deliverLocked() // unlocks
				return true
			}
			q.mu.Unlock()
			q.wakeLink()
			return true
		}
		space := q.space
		q.mu.Unlock()
		if !keep() {
			return false
		}
		<-space // Wake closes it too
	}
}

// Wake makes every PushFrame waiting for room call its keep function
// again.
func (q *Queue) Wake() {
	q.mu.Lock()
	q.wakePushersLocked()
	q.mu.Unlock()
}

func (q *Queue) wakePushersLocked() {
	close(q.space)
	q.space = make(chan struct{})
}

// deliverLocked hands what is pending to the running link's sink from
// the calling goroutine, while the link's own loop waits. It is called
// with q.mu held and returns with it released.
func (q *Queue) deliverLocked() {
	q.delivering = true
	batch := q.evs
	q.evs = nil
	sink, ctx := q.sink, q.linkCtx
	q.mu.Unlock()

	err := sink(ctx, batch)

	q.mu.Lock()
	q.delivering = false
	if err != nil {
		q.evs = append(batch, q.evs...)
		q.sinkErr = err
	} else {
		for i := range batch {
			q.bytes -= eventSize(&batch[i])
		}
		q.wakePushersLocked()
	}
	q.idle.Broadcast()
	q.mu.Unlock()
	q.wakeLink() // whatever came meanwhile, or the failure, is the link's
}

// wakeLink makes a waiting link look at the queue.
func (q *Queue) wakeLink() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Link implements contract.Transport's Link: it delivers the queued
// events to sink, in order, everything pending in one call, until ctx is
// done (it returns nil), Stop has run (it returns nil once it has
// delivered everything Stop's stop function queued) or sink fails (it
// returns that error, wrapped, and keeps the failed batch for the next
// link; nil if ctx was done meanwhile). Only one link runs at a time:
// another returns contract.ErrAlreadyLinked.
func (q *Queue) Link(ctx context.Context, sink contract.EventSink) error {
	q.mu.Lock()
	if q.linkDone != nil {
		q.mu.Unlock()
		return fmt.Errorf("link: %w", contract.ErrAlreadyLinked)
	}
	done := make(chan struct{})
	q.linkDone = done
	q.sink, q.linkCtx = sink, ctx
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		q.sink, q.linkCtx = nil, nil
		for q.delivering {
			q.idle.Wait() // the sink is not called after Link returns
		}
		q.sinkErr = nil // an inline delivery's failure was this link's (its batch is kept)
		q.linkDone = nil
		q.mu.Unlock()
		close(done)
	}()

	var spare []contract.Event
	for {
		q.mu.Lock()
		if err := q.sinkErr; err != nil {
			q.sinkErr = nil
			q.mu.Unlock()
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("link: sink: %w", err)
		}
		if q.delivering {
			q.mu.Unlock()
			select {
			case <-q.wake: // the inline delivery wakes the link when it ends
				continue
			case <-ctx.Done():
				return nil
			}
		}
		batch := q.evs
		q.evs = spare[:0]
		stopped := q.stopped
		q.delivering = len(batch) > 0
		q.mu.Unlock()

		if len(batch) == 0 {
			spare = batch
			if stopped {
				return nil
			}
			if q.onPark != nil {
				q.onPark()
			}
			select {
			case <-q.wake:
				continue
			case <-ctx.Done():
				return nil
			}
		}

		err := sink(ctx, batch)

		q.mu.Lock()
		q.delivering = false
		if err != nil {
			q.evs = append(batch, q.evs...)
			q.mu.Unlock()
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("link: sink: %w", err)
		}
		for i := range batch {
			q.bytes -= eventSize(&batch[i])
		}
		q.wakePushersLocked()
		q.mu.Unlock()

		clear(batch)
		if cap(batch) <= keepBatchCap {
			spare = batch[:0]
		} else {
			spare = nil
		}
	}
}

// Stop ends the transport once: the first call runs stop(ctx) — the
// transport's own work: close its listener, close every connection and
// wait for their Closed events to be pushed — then waits, bounded by
// ctx, for a running Link to deliver everything queued and return. Every
// later call runs nothing and waits, bounded by ctx, for the first to
// return. A Link that starts after stop has returned delivers what is
// left and returns nil.
func (q *Queue) Stop(ctx context.Context, stop func(ctx context.Context)) error {
	q.mu.Lock()
	if q.stopDone != nil {
		done := q.stopDone
		q.mu.Unlock()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("stop: waiting for the first stop: %w", ctx.Err())
		}
	}
	q.stopDone = make(chan struct{})
	defer close(q.stopDone)
	q.mu.Unlock()

	stop(ctx)

	q.mu.Lock()
	q.stopped = true
	link := q.linkDone
	q.mu.Unlock()
	q.wakeLink()
	if link == nil {
		return nil
	}
	select {
	case <-link:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop: waiting for the link to deliver the last events: %w", ctx.Err())
	}
}
