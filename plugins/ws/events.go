package ws

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/tether-agent/tether/contract"
)

// eventOverhead is what one queued event counts against the event buffer
// besides its payload.
const eventOverhead = int64(unsafe.Sizeof(contract.Event{}))

// keepBatchCap is the largest batch slice kept for reuse between deliveries.
const keepBatchCap = 1024

// Link implements contract.Transport: it delivers queued events to sink,
// in order, everything pending in one call, until ctx is done or Stop has
// finished (then it returns nil after delivering what Stop produced), or
// sink fails (then it returns that error and keeps the failed batch for the
// next link). Only one link runs at a time: contract.ErrAlreadyLinked.
func (s *Server) Link(ctx context.Context, sink contract.EventSink) error {
	s.evMu.Lock()
	if s.linkDone != nil {
		s.evMu.Unlock()
		return fmt.Errorf("link: %w", contract.ErrAlreadyLinked)
	}
	done := make(chan struct{})
	s.linkDone = done
	s.evMu.Unlock()
	defer func() {
		s.evMu.Lock()
		s.linkDone = nil
		s.evMu.Unlock()
		close(done)
	}()

	var spare []contract.Event
	for {
		s.evMu.Lock()
		batch := s.evs
		s.evs = spare[:0]
		stop := s.evStop
		s.evMu.Unlock()

		if len(batch) == 0 {
			spare = batch
			if stop {
				return nil
			}
			select {
			case <-s.evWake:
				continue
			case <-ctx.Done():
				return nil
			}
		}

		err := sink(ctx, batch)

		s.evMu.Lock()
		if err != nil {
			s.evs = append(batch, s.evs...)
			s.evMu.Unlock()
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("link: sink: %w", err)
		}
		for i := range batch {
			s.evBytes -= eventSize(&batch[i])
		}
		s.wakeReadersLocked()
		s.evMu.Unlock()

		clear(batch)
		if cap(batch) <= keepBatchCap {
			spare = batch[:0]
		} else {
			spare = nil
		}
	}
}

func eventSize(e *contract.Event) int64 { return eventOverhead + int64(len(e.Data)) }

// pushEvent queues e without waiting. The caller holds s.mu, which keeps
// Opened and Closed in order with the connection table.
func (s *Server) pushEvent(e contract.Event) {
	s.evMu.Lock()
	s.evs = append(s.evs, e)
	s.evBytes += eventSize(&e)
	s.evMu.Unlock()
	s.wakeLink()
}

// pushFrame queues a frame event of c, waiting while the event buffer is
// full. It drops the frame if c is not admitted or is closing: the host
// asked for no more of it.
func (s *Server) pushFrame(c *conn, binary bool, data []byte) {
	e := contract.Event{Kind: contract.EventFrame, Conn: c.id, Binary: binary, Data: data}
	size := eventSize(&e)
	for {
		if !c.wantsFrames() {
			return
		}
		s.evMu.Lock()
		if s.evBytes == 0 || s.evBytes+size <= s.evLimit {
			s.evs = append(s.evs, e)
			s.evBytes += size
			s.evMu.Unlock()
			s.wakeLink()
			return
		}
		space := s.evSpace
		s.evMu.Unlock()
		if !c.wantsFrames() {
			return
		}
		<-space // a close of c wakes it too
	}
}

// wakeLink makes a waiting link look at the queue.
func (s *Server) wakeLink() {
	select {
	case s.evWake <- struct{}{}:
	default:
	}
}

// wakeReaders makes readers waiting for event buffer space look again.
func (s *Server) wakeReaders() {
	s.evMu.Lock()
	s.wakeReadersLocked()
	s.evMu.Unlock()
}

func (s *Server) wakeReadersLocked() {
	close(s.evSpace)
	s.evSpace = make(chan struct{})
}
