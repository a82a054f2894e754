package wsclient

import (
	"context"
	"sync"
)

// queue is an unbounded FIFO. push never blocks, so the reader goroutine is
// never held up by a consumer that does not read.
type queue[T any] struct {
	mu     sync.Mutex // guards the fields below
	items  []T
	closed bool          // no more pushes; pop fails once items is empty
	wake   chan struct{} // closed and replaced on every push and on close
}

func newQueue[T any]() *queue[T] {
	return &queue[T]{wake: make(chan struct{})}
}

// push appends v and wakes every waiter. It drops v after close.
func (q *queue[T]) push(v T) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.items = append(q.items, v)
	close(q.wake)
	q.wake = make(chan struct{})
}

// pushFront puts v before every queued item (for an item that arrived
// first but was handed over last).
func (q *queue[T]) pushFront(v T) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.items = append([]T{v}, q.items...)
	close(q.wake)
	q.wake = make(chan struct{})
}

// close marks the end of the stream: items already queued can still be
// popped, then pop reports errQueueClosed.
func (q *queue[T]) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.closed = true
	close(q.wake)
}

// pop returns the oldest item, waiting for one until ctx is done or stop is
// closed (a nil stop never is). It returns errQueueClosed when the queue is
// closed and empty.
func (q *queue[T]) pop(ctx context.Context, stop <-chan struct{}) (T, error) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			v := q.items[0]
			var zero T
			q.items[0] = zero
			q.items = q.items[1:]
			q.mu.Unlock()
			return v, nil
		}
		closed, wake := q.closed, q.wake
		q.mu.Unlock()
		var zero T
		if closed {
			return zero, errQueueClosed
		}
		select {
		case <-wake:
		case <-stop:
			return zero, errQueueClosed
		case <-ctx.Done():
			return zero, ctx.Err()
		}
	}
}
