package acpagent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"sync"
	"time"
)

// The SDK runs an agent's requests each on a goroutine of its own but its
// notifications in order on one, so a permission request can reach tether
// before the session/update the agent sent just before it (the tool call
// it is about). order restores the agent's order: it reads the agent's
// stdout as it passes to the SDK, counting session/update notifications,
// and notes how many came before each permission request; the request's
// handler waits until that many were handled.
type order struct {
	r io.Reader
	// direct, when set, handles a session/update line itself (reporting
	// true; it counts it handled) instead of the library; it is asked
	// only when every update before it was handled, so the agent's
	// order holds.
	direct func(line []byte) bool
	buf    []byte // a partial line
	chunk  []byte // what one read of the agent brings in
	out    []byte // whole lines for the library; out[off:] not read yet
	off    int
	err    error // the agent's read error, returned after out

	mu      sync.Mutex
	cond    *sync.Cond
	read    uint64            // session/update notifications read
	handled uint64            // … and handled (SessionUpdate returned)
	before  map[string]uint64 // permission request key → updates before it
	closed  bool
}

// orderWait bounds how long a permission request waits for the updates
// before it (an agent's update the SDK never hands over must not hold
// the request for ever).
const orderWait = 5 * time.Second

func newOrder(r io.Reader) *order {
	o := &order{r: r, before: make(map[string]uint64)}
	o.cond = sync.NewCond(&o.mu)
	return o
}

// Backpressure: the SDK queues an agent's notifications for their
// handler in a queue of 1,024 and closes the connection when it
// overflows, so an agent streaming faster than tether journals would be
// cut off mid-turn. order stops reading while maxPending updates wait to
// be handled (the pipe then fills and the agent's writes wait, as on a
// socket), and reads at most readChunk bytes at a time, so that what one
// read brings in cannot overflow the queue either.
const (
	maxPending = 256
	readChunk  = 16 << 10
	stuckAfter = 2 * time.Second
)

// Read implements io.Reader for the SDK: the agent's output in whole
// lines, each noted, less those direct handled.
func (o *order) Read(p []byte) (int, error) {
	for o.off == len(o.out) {
		if o.err != nil {
			return 0, o.err
		}
		o.out, o.off = o.out[:0], 0
		o.fill()
	}
	n := copy(p, o.out[o.off:])
	o.off += n
	return n, nil
}

// fill reads once from the agent (when there is room) and queues the
// whole lines it completes for the library.
func (o *order) fill() {
	o.mu.Lock()
	if o.read-o.handled >= maxPending && !o.closed {
		// An update the library could not parse never reaches the
		// handler: one that makes no progress for stuckAfter is taken
		// for lost, and the count forgiven.
		for o.read-o.handled >= maxPending && !o.closed {
			was := o.handled
			t := time.AfterFunc(stuckAfter, func() {
				o.mu.Lock()
				o.cond.Broadcast()
				o.mu.Unlock()
			})
			start := time.Now()
			for o.handled == was && !o.closed && time.Since(start) < stuckAfter {
				o.cond.Wait()
			}
			t.Stop()
			if o.handled == was && !o.closed {
				o.handled = o.read - maxPending/2
			}
		}
	}
	o.mu.Unlock()
	if o.chunk == nil {
		o.chunk = make([]byte, readChunk)
	}
	n, err := o.r.Read(o.chunk)
	o.buf = append(o.buf, o.chunk[:n]...)
	rest := o.buf
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		if !o.note(rest[:i]) {
			o.out = append(o.out, rest[:i+1]...)
		}
		rest = rest[i+1:]
	}
	o.buf = append(o.buf[:0], rest...)
	if len(o.buf) > maxLine {
		// Longer than the library reads: it is handed the line so far
		// (and fails on it, as it would have).
		o.out = append(o.out, o.buf...)
		o.buf = o.buf[:0]
	}
	if err != nil {
		o.out = append(o.out, o.buf...) // a last line without its newline
		o.buf = nil
		o.err = err
		o.mu.Lock()
		o.closed = true
		o.cond.Broadcast()
		o.mu.Unlock()
	}
}

// maxLine is past the longest line the library reads (a bufio.Scanner
// of 10 MiB).
const maxLine = 10<<20 + 1

// note counts one line of the agent's output; it reports whether direct
// handled it.
func (o *order) note(line []byte) bool {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			SessionID string `json:"sessionId"`
			ToolCall  struct {
				ToolCallID string `json:"toolCallId"`
			} `json:"toolCall"`
		} `json:"params"`
	}
	if json.Unmarshal(line, &m) != nil {
		return false
	}
	o.mu.Lock()
	switch {
	case m.Method == "session/update" && len(m.ID) == 0:
		o.read++
		alone := o.read-1 == o.handled
		o.mu.Unlock()
		return alone && o.direct != nil && o.direct(line)
	case m.Method == "session/request_permission" && len(m.ID) > 0:
		o.before[permKey(m.Params.SessionID, m.Params.ToolCall.ToolCallID)] = o.read
	}
	o.mu.Unlock()
	return false
}

// handledOne counts a session/update the SDK handed over.
func (o *order) handledOne() {
	o.mu.Lock()
	o.handled++
	o.cond.Broadcast()
	o.mu.Unlock()
}

// waitBefore waits until the updates the agent sent before the permission
// request of key were handled (or ctx ends, or orderWait passes).
func (o *order) waitBefore(ctx context.Context, key string) {
	ctx, cancel := context.WithTimeout(ctx, orderWait)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		o.mu.Lock()
		o.cond.Broadcast()
		o.mu.Unlock()
	})
	defer stop()
	o.mu.Lock()
	defer o.mu.Unlock()
	target, ok := o.before[key]
	delete(o.before, key)
	for ok && o.handled < target && !o.closed && ctx.Err() == nil {
		o.cond.Wait()
	}
}

func permKey(sessionID, toolCallID string) string { return sessionID + "\x00" + toolCallID }

// close wakes a Read waiting for room (the process is gone).
func (o *order) close() {
	o.mu.Lock()
	o.closed = true
	o.cond.Broadcast()
	o.mu.Unlock()
}
