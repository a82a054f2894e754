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
	r   io.Reader
	buf []byte // a partial line

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

// Read implements io.Reader for the SDK, noting each whole line.
func (o *order) Read(p []byte) (int, error) {
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
	if len(p) > readChunk {
		p = p[:readChunk]
	}
	n, err := o.r.Read(p)
	o.buf = append(o.buf, p[:n]...)
	for {
		i := bytes.IndexByte(o.buf, '\n')
		if i < 0 {
			break
		}
		o.note(o.buf[:i])
		o.buf = o.buf[i+1:]
	}
	if err != nil {
		o.mu.Lock()
		o.closed = true
		o.cond.Broadcast()
		o.mu.Unlock()
	}
	return n, err
}

// note counts one line of the agent's output.
func (o *order) note(line []byte) {
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
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case m.Method == "session/update" && len(m.ID) == 0:
		o.read++
	case m.Method == "session/request_permission" && len(m.ID) > 0:
		o.before[permKey(m.Params.SessionID, m.Params.ToolCall.ToolCallID)] = o.read
	}
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
