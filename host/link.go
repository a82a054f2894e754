package host

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

// Link is the host's end of one transport plugin instance: it turns the
// plugin's connection events into gateway connections, and queues the
// host's commands back to the plugin in batches.
type Link struct {
	name     string
	instance string
	tr       contract.Transport
	gw       *Gateway
	pty      *PTYRouter // nil: /api/pty is switched off (4404)
	access   *Access
	log      zerolog.Logger
	notify   chan struct{} // wakes the sender

	mu          sync.Mutex // guards the fields below
	conns       map[uint64]linkConn
	out         []contract.Command
	outBytes    int           // payload bytes in out
	queued      int64         // cmdSize of everything in out and in the batch being sent
	roomWait    chan struct{} // non-nil while someone waits for room; closed when queued drops to linkHighWater
	sending     bool          // a goroutine is in Exec: it sends what is queued next
	failed      bool          // an Exec failed: the stream is broken, nothing more is sent
	ended       bool
	draining    bool // stopping: new connections are closed with drainCode
	drainCode   int
	drainReason string
	drained     chan struct{} // closed when draining and no connection is left
}

var _ flowSender = (*Link)(nil)

// NewLink returns a link for transport tr, which the host started as
// plugin instance instance under name.
func NewLink(name, instance string, tr contract.Transport, gw *Gateway, pty *PTYRouter, access *Access, log zerolog.Logger) *Link {
	return &Link{
		name:     name,
		instance: instance,
		tr:       tr,
		gw:       gw,
		pty:      pty,
		access:   access,
		log:      log.With().Str("plugin", name).Str("instance", instance).Logger(),
		notify:   make(chan struct{}, 1),
		conns:    make(map[uint64]linkConn),
	}
}

// Run links the transport and serves its events until the link ends
// (ctx done, transport stopped or dead). Every connection still open then
// is detached, so its sessions are parked, not closed.
func (l *Link) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.sendLoop(ctx)
	}()
	err := l.tr.Link(ctx, l.handle)
	cancel()
	wg.Wait()

	l.mu.Lock()
	l.ended = true
	conns := l.conns
	l.conns = make(map[uint64]linkConn)
	l.out, l.outBytes = nil, 0
	l.releaseLocked(l.queued)
	l.checkDrainedLocked()
	l.mu.Unlock()
	for _, c := range conns {
		c.onClosed()
	}
	l.gw.metrics.Connections.Sub(float64(len(conns)))
	return err
}

// send implements sender: queue cmd for the plugin, never blocking.
func (l *Link) send(cmd contract.Command) {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return
	}
	l.out = append(l.out, cmd)
	l.outBytes += len(cmd.Data)
	l.queued += cmdSize(cmd)
	l.mu.Unlock()
	l.wake()
}

// wake makes sendLoop look at the queue.
func (l *Link) wake() {
	select {
	case l.notify <- struct{}{}:
	default:
	}
}

// sendLoop sends everything queued as one batch per wake-up, unless
// another goroutine is sending already (see flush).
func (l *Link) sendLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.notify:
		}
		for l.flush(ctx, 0) {
		}
	}
}

// flush sends what is queued, from the calling goroutine, unless another
// one is sending (it then sends this too, in order) or, with a non-zero
// limit, more than limit payload bytes are queued. It reports whether
// something is left queued. The event handler calls it after each batch
// of events with a small limit, so the answer to a request needs no
// hand-off to sendLoop while bulk output still cannot hold up the events;
// sendLoop calls it for everything else (workers, PTY output, timers).
func (l *Link) flush(ctx context.Context, limit int) bool {
	l.mu.Lock()
	if l.sending || l.failed || len(l.out) == 0 {
		l.mu.Unlock()
		return false
	}
	if limit > 0 && l.outBytes > limit {
		l.mu.Unlock()
		return true
	}
	l.sending = true
	batch := l.out
	l.out, l.outBytes = nil, 0
	l.mu.Unlock()
	err := l.exec(ctx, batch)
	l.mu.Lock()
	l.sending = false
	if err != nil {
		l.failed = true
		l.out, l.outBytes = nil, 0
		l.releaseLocked(l.queued)
	}
	more := len(l.out) > 0
	l.mu.Unlock()
	return more
}

// exec sends batch to the transport in pieces of at most maxBatchBytes.
func (l *Link) exec(ctx context.Context, batch []contract.Command) error {
	for len(batch) > 0 {
		n := batchCut(batch, maxBatchBytes)
		if err := l.tr.Exec(ctx, batch[:n]); err != nil {
			if ctx.Err() == nil {
				l.log.Warn().Err(err).Int("commands", n).Msg("sending commands to transport")
			}
			return err
		}
		var sent int64
		for i := range batch[:n] {
			sent += cmdSize(batch[i])
		}
		l.mu.Lock()
		l.releaseLocked(sent)
		l.mu.Unlock()
		batch = batch[n:]
	}
	return nil
}

// inlineFlushBytes is the most queued payload the event handler sends
// itself; more is left to sendLoop.
const inlineFlushBytes = 64 << 10

// maxBatchBytes bounds the payload of one Exec batch, well under the
// plugins' gRPC message limit (contract.MaxMessageSize): a big replay or
// a burst is sent as several batches, in order.
const maxBatchBytes = 1 << 20

// linkHighWater is how many payload bytes may be queued for a transport
// before waitRoom waits: a few batches, enough to keep the plugin busy.
const linkHighWater = 4 << 20

// cmdSize is what one command counts against a batch's budget and the
// link's queue.
func cmdSize(c contract.Command) int64 { return int64(len(c.Data) + len(c.Reason) + 16) }

// batchCut returns how many commands from the start of cmds fit in budget
// payload bytes (at least one, so a single larger command still goes).
func batchCut(cmds []contract.Command, budget int) int {
	var size int64
	for i, c := range cmds {
		size += cmdSize(c)
		if size > int64(budget) && i > 0 {
			return i
		}
	}
	return len(cmds)
}

// releaseLocked counts n queued bytes as sent and wakes those waiting for
// room once the queue is at or under linkHighWater (or the link ended).
func (l *Link) releaseLocked(n int64) {
	l.queued -= n
	if l.roomWait != nil && (l.queued <= linkHighWater || l.ended) {
		close(l.roomWait)
		l.roomWait = nil
	}
}

// waitRoom implements flowSender: it waits while more than linkHighWater
// bytes are queued for the transport, at most d. It reports false when d
// passed first; ctx done or the link ending count as room.
func (l *Link) waitRoom(ctx context.Context, d time.Duration) bool {
	var timeout <-chan time.Time
	for {
		l.mu.Lock()
		if l.ended || l.queued <= linkHighWater {
			l.mu.Unlock()
			return true
		}
		if l.roomWait == nil {
			l.roomWait = make(chan struct{})
		}
		ch := l.roomWait
		l.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(d)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return true
		case <-timeout:
			return false
		}
	}
}

// handle is the link's event sink. What its events made the host send
// (admits, answers of inline requests) goes out before it returns.
func (l *Link) handle(ctx context.Context, events []contract.Event) error {
	defer func() {
		if l.flush(ctx, inlineFlushBytes) {
			l.wake() // left for sendLoop
		}
	}()
	for i := range events {
		ev := &events[i]
		switch ev.Kind {
		case contract.EventOpened:
			l.opened(ev)
		case contract.EventFrame:
			l.mu.Lock()
			c := l.conns[ev.Conn]
			l.mu.Unlock()
			if c != nil {
				c.onFrame(ev.Data, ev.Binary)
			}
		case contract.EventClosed:
			l.mu.Lock()
			c := l.conns[ev.Conn]
			delete(l.conns, ev.Conn)
			l.checkDrainedLocked()
			l.mu.Unlock()
			if c != nil {
				l.gw.metrics.Connections.Dec()
				l.log.Debug().Uint64("conn", ev.Conn).Int("code", ev.Code).Msg("connection closed")
				c.onClosed()
			}
		}
	}
	return nil
}

// opened decides access and routes a new connection.
func (l *Link) opened(ev *contract.Event) {
	tid := contract.TransportID{Instance: l.instance, Conn: ev.Conn}
	code := l.access.Check(*ev)
	if code == 0 && ev.Path != "/api/ws" && (ev.Path != "/api/pty" || l.pty == nil) {
		code = contract.CloseNotFound
	}
	if code != 0 {
		l.gw.metrics.Refused.WithLabelValues(strconv.Itoa(code)).Inc()
		l.log.Debug().Str("transport_id", tid.String()).Str("path", ev.Path).Str("remote", ev.Remote).Int("code", code).Msg("connection refused")
		l.send(contract.Command{Kind: contract.CommandClose, Conn: ev.Conn, Code: code, Reason: refuseReason(code)})
		return
	}
	l.mu.Lock()
	draining, dcode, dreason := l.draining, l.drainCode, l.drainReason
	l.mu.Unlock()
	if draining {
		l.send(contract.Command{Kind: contract.CommandClose, Conn: ev.Conn, Code: dcode, Reason: dreason})
		return
	}
	var c linkConn
	if ev.Path == "/api/pty" {
		pc := l.pty.open(tid, ev, l)
		if pc == nil {
			return // refused with 4400
		}
		c = pc
	} else {
		gc := l.gw.newConn(tid, l.name, l)
		l.send(contract.Command{Kind: contract.CommandAdmit, Conn: ev.Conn})
		gc.ready()
		c = gc
	}
	l.mu.Lock()
	l.conns[ev.Conn] = c
	l.mu.Unlock()
	l.gw.metrics.Connections.Inc()
}

// Drain stops admitting connections: new ones are closed with code (1001
// when the host shuts down, 1012 when the transport is unloaded).
func (l *Link) Drain(code int, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.draining {
		l.draining = true
		l.drainCode, l.drainReason = code, reason
		l.drained = make(chan struct{})
		l.checkDrainedLocked()
	}
}

// CloseAll closes every admitted connection with code, after everything
// already queued to it (the close travels on the same ordered link), and
// returns a channel closed once the transport has reported all of them
// closed. Call Drain first.
func (l *Link) CloseAll(code int, reason string) <-chan struct{} {
	l.mu.Lock()
	ids := make([]uint64, 0, len(l.conns))
	for id := range l.conns {
		ids = append(ids, id)
	}
	drained := l.drained
	l.mu.Unlock()
	for _, id := range ids {
		l.send(contract.Command{Kind: contract.CommandClose, Conn: id, Code: code, Reason: reason})
	}
	return drained
}

// checkDrainedLocked closes drained when draining and no connection is
// left.
func (l *Link) checkDrainedLocked() {
	if l.draining && (len(l.conns) == 0 || l.ended) && l.drained != nil {
		select {
		case <-l.drained:
		default:
			close(l.drained)
		}
	}
}

func refuseReason(code int) string {
	switch code {
	case contract.CloseUnauthorized:
		return "unauthorized"
	case contract.CloseForbidden:
		return "forbidden host or origin"
	case contract.CloseNotLoopback:
		return "loopback only"
	case contract.CloseNotFound:
		return "endpoint switched off"
	}
	return ""
}
