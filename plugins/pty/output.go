package pty

import (
	"context"
	"fmt"
	"time"

	"github.com/tether-agent/tether/contract"
)

// Output stream limits.
const (
	// MaxOutputData bounds the Data of one Output.
	MaxOutputData = 256 << 10
	// MaxBatchData bounds the Data of all Outputs of one batch.
	MaxBatchData = 1 << 20
)

// Under load — the previous batch went out less than coalesceWait ago — a
// batch of less than coalesceBytes is held until coalesceWait has passed
// since the previous batch, so that the cost of a message (two gRPC hops
// and a WebSocket frame) is paid per tens of KiB, not per tty read.
// Interactive output, which comes after a pause, goes out at once.
const (
	coalesceBytes = 64 << 10
	coalesceWait  = time.Millisecond
)

// Output implements contract.Backend. It streams every PTY's output to
// sink until ctx is done (it then returns nil) or Shutdown has finished
// and every exit marker is delivered (nil), or sink fails (its error).
//
// The stream keeps a cursor per PTY: the PTY's end offset when the stream
// starts, 0 for PTYs spawned later. Whenever output is pending it hands
// sink one batch with, for each PTY with pending bytes, one Output from
// the cursor on (at most MaxOutputData bytes, MaxBatchData in all; the
// rest follows in the next batch), so batches grow while sink is slow;
// under load small batches are held for a moment (coalesceWait). A
// cursor that fell out of its PTY's ring skips to the ring's start. After
// a PTY's last byte comes its exit marker, also when the PTY was already
// removed from the registry.
func (b *Backend) Output(ctx context.Context, sink contract.OutputSink) error {
	b.mu.Lock()
	switch {
	case b.stopped:
		b.mu.Unlock()
		return fmt.Errorf("output: %w", contract.ErrStopped)
	case b.streamDone != nil:
		b.mu.Unlock()
		return fmt.Errorf("output: %w", contract.ErrAlreadyLinked)
	}
	done := make(chan struct{})
	b.streamDone = done
	cursors := make(map[*ptyRec]int64, len(b.all))
	for rec := range b.all {
		rec.mu.Lock()
		cursors[rec] = rec.ring.EndOffset()
		rec.linkLocked(true, cursors[rec])
		rec.mu.Unlock()
	}
	b.mu.Unlock()
	defer b.endStream(done)
	if b.testHookStream != nil {
		b.testHookStream()
	}

	var recs []*ptyRec
	var batch []contract.Output
	next := make(map[*ptyRec]int64)
	var lastSend time.Time
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	defer hold.Stop()
	for {
		b.mu.Lock()
		recs = recs[:0]
		for rec := range b.all {
			recs = append(recs, rec)
		}
		stopped := b.stopped
		b.mu.Unlock()
		if stopped && len(recs) == 0 {
			return nil
		}

		if wait := coalesceWait - time.Since(lastSend); wait > 0 && holdable(recs, cursors) {
			// Not woken by each tty read meanwhile: one wake-up per
			// held batch.
			hold.Reset(wait)
			select {
			case <-hold.C:
			case <-ctx.Done():
				return nil
			}
			continue
		}

		clear(next)
		batch, finished := b.collect(batch[:0], recs, cursors, next)
		if len(batch) == 0 {
			select {
			case <-b.outWake:
			case <-ctx.Done():
				return nil
			}
			continue
		}
		err := sink(ctx, batch)
		lastSend = time.Now()
		clear(batch)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("output: sink: %w", err)
		}
		for rec, cur := range next {
			cursors[rec] = cur
			rec.advance(cur)
		}
		if len(finished) > 0 {
			b.mu.Lock()
			for _, rec := range finished {
				delete(b.all, rec)
				delete(cursors, rec)
			}
			b.mu.Unlock()
		}
	}
}

// holdable reports whether what is pending past the cursors is worth
// holding back for more: some output, less than coalesceBytes in all, no
// exit marker due, and no PTY's drain waiting (or about to wait) for room.
func holdable(recs []*ptyRec, cursors map[*ptyRec]int64) bool {
	total := int64(0)
	for _, rec := range recs {
		rec.mu.Lock()
		start, end, size, done := rec.ring.StartOffset(), rec.ring.EndOffset(), int64(rec.ring.size), rec.done
		rec.mu.Unlock()
		pending := end - min(max(cursors[rec], start), end)
		if done || 2*pending >= size {
			return false
		}
		total += pending
	}
	return total > 0 && total < coalesceBytes
}

// collect appends to batch what is pending for recs past their cursors,
// records the new cursors in next, and returns the PTYs whose exit marker
// is in the batch.
func (b *Backend) collect(batch []contract.Output, recs []*ptyRec, cursors, next map[*ptyRec]int64) ([]contract.Output, []*ptyRec) {
	var finished []*ptyRec
	budget := MaxBatchData
	for _, rec := range recs {
		cur := cursors[rec]
		var data []byte
		rec.mu.Lock()
		start, end := rec.ring.StartOffset(), rec.ring.EndOffset()
		skipped := cur < start
		cur = min(max(cur, start), end)
		if cur < end && budget > 0 {
			data, _, _ = rec.ring.ReadN(cur, min(MaxOutputData, budget))
		}
		done, code := rec.done, rec.exitCode
		rec.mu.Unlock()

		if skipped {
			rec.log.Debug().Int64("from", cursors[rec]).Int64("to", start).Msg("output stream too slow: bytes skipped")
		}
		if len(data) > 0 {
			batch = append(batch, contract.Output{Token: rec.token, Offset: cur, Data: data, Epoch: rec.epoch})
			cur += int64(len(data))
			budget -= len(data)
		}
		if cur == end && done {
			batch = append(batch, contract.Output{Token: rec.token, Offset: end, Exited: true, ExitCode: code, Epoch: rec.epoch})
			finished = append(finished, rec)
		}
		if cur != cursors[rec] || skipped {
			next[rec] = cur
		}
	}
	return batch, finished
}

// endStream unregisters the Output stream and lets the drains run free.
// PTYs that are done give up their rings: the next stream starts at their
// end and only sends their exit markers.
func (b *Backend) endStream(done chan struct{}) {
	b.mu.Lock()
	b.streamDone = nil
	for rec := range b.all {
		rec.mu.Lock()
		rec.linkLocked(false, 0)
		if rec.done {
			rec.ring.Discard()
		}
		rec.mu.Unlock()
	}
	b.mu.Unlock()
	close(done)
}
