package ws

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/gobwas/ws"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// maxBatch is the most queued messages one writev carries.
const maxBatch = 32

// maxWriteNow is the largest payload kick writes from the caller's
// goroutine; a larger message goes to the writer goroutine.
const maxWriteNow = 16 << 10

// frameBufs holds buffers for frames written at once (see kick).
var frameBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, maxHeaderSize+maxWriteNow)
	return &b
}}

// outMsg is a queued data message.
type outMsg struct {
	op   ws.OpCode
	data []byte
}

// conn is one upgraded connection. Its reader goroutine, started on admit
// or on a close before admit, owns the teardown and reports EventClosed; its
// writer goroutine runs only while something is owed to the peer.
type conn struct {
	s        *Server
	cfg      *config
	nc       net.Conn
	raw      syscall.RawConn // nc's descriptor, for kick's non-blocking write; nil: always the writer
	openedAt time.Time
	id       uint64 // set before the conn is published
	prefix   []byte // read side only: bytes read ahead (past the handshake, by wait or readAhead)
	maxIn    int64  // the largest message taken from the peer (/acp's is larger)
	maxOut   int64  // the send queue's bound

	mu          sync.Mutex // guards the fields below
	admitted    bool
	reading     bool // the reader goroutine was started
	writing     bool // the writer goroutine runs
	done        bool // the reader is tearing down: no writer starts again
	closing     bool // a close frame is owed or was sent: no data goes out
	closeSent   bool
	broken      bool // a write failed
	pingDue     bool
	pongDue     bool
	closeCode   int // the connection's close code once closing
	closeReason string
	closeBy     time.Time // zero, or the deadline of the close handshake
	pong        []byte    // payload of the pong owed
	partial     []byte    // the unwritten end of a frame kick began: written first
	queue       []outMsg  // messages owed, from head
	head        int
	queued      int64 // payload bytes in queue[head:]
	inflight    int64 // payload bytes being written
	writerExit  chan struct{}
}

// admit lets the reader start.
func (c *conn) admit() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.admitted || c.closing || c.done {
		return
	}
	c.admitted = true
	c.ensureReaderLocked()
}

// wantsFrames reports whether frames read now are for the host.
func (c *conn) wantsFrames() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.admitted && !c.closing
}

// send queues a message, or closes c with 1013 if it does not fit. data
// must not be modified afterwards. The caller calls kick when it has
// queued what it had.
func (c *conn) send(binary bool, data []byte) {
	op := ws.OpText
	if binary {
		op = ws.OpBinary
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing || c.done || c.broken {
		return
	}
	n := int64(len(data))
	if c.queued+c.inflight+int64(len(c.partial))+n > c.maxOut {
		c.s.log.Debug().Uint64("conn", c.id).Int64("queued", c.queued+c.inflight).Msg("send queue full")
		c.closeLocked(wire.CloseTryAgainLater, "send queue full", false, time.Now().Add(c.cfg.slowGrace))
		return
	}
	c.queue = append(c.queue, outMsg{op: op, data: data})
	c.queued += n
}

// kick gets what send queued moving. When the only thing owed is one
// small message and no writer runs, it writes the frame at once with one
// non-blocking write from the caller's goroutine (a request's answer then
// needs no goroutine); whatever the socket does not take at once, and
// everything else, goes to the writer goroutine.
func (c *conn) kick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.writing || c.done || c.broken || c.closeSent || c.head == len(c.queue) {
		return
	}
	m := c.queue[c.head]
	if c.raw == nil || len(c.queue)-c.head != 1 || len(m.data) > maxWriteNow ||
		c.closing || c.pingDue || c.pongDue || c.partial != nil {
		c.ensureWriterLocked()
		return
	}
	c.queue[c.head] = outMsg{}
	c.queue, c.head = c.queue[:0], 0
	n := int64(len(m.data))
	c.queued -= n
	c.inflight = n
	c.writing = true // no other writer while this one writes
	c.mu.Unlock()

	bp := frameBufs.Get().(*[]byte)
	frame := append(appendHeader((*bp)[:0], m.op, len(m.data)), m.data...)
	written, err := c.writeNow(frame)
	var rest []byte
	if err == nil && written < len(frame) {
		rest = append([]byte(nil), frame[written:]...)
	}
	*bp = frame[:0]
	frameBufs.Put(bp)

	c.mu.Lock()
	c.inflight = 0
	switch {
	case err != nil:
		c.broken = true
		c.exitWriterLocked()
		c.ensureReaderLocked() // a conn never admitted needs its teardown too
		c.s.log.Debug().Uint64("conn", c.id).Err(err).Msg("write failed")
		_ = c.nc.Close()
	case rest != nil || c.pingDue || c.pongDue || c.head < len(c.queue) || (c.closing && !c.closeSent):
		// Owed now: a writer takes over, writing still set (the
		// reader may be waiting for it to send a close frame).
		c.partial = rest
		c.s.wg.Add(1)
		go c.writeLoop()
	default:
		c.exitWriterLocked()
	}
}

// writeNow writes as much of p as the socket takes without waiting.
func (c *conn) writeNow(p []byte) (int, error) {
	var n int
	var werr error
	err := c.raw.Write(func(fd uintptr) bool {
		n, werr = syscall.Write(int(fd), p)
		return true // never wait: the writer goroutine does
	})
	switch {
	case err != nil:
		return 0, nil // closed or past a deadline: the writer finds out
	case werr == syscall.EAGAIN || werr == syscall.EINTR:
		return 0, nil
	case werr != nil:
		return 0, werr
	}
	return max(n, 0), nil
}

// hostClose closes c with the host's code after what is queued.
func (c *conn) hostClose(code int, reason string) {
	if code == 0 {
		code = wire.CloseNormal
	}
	if !sendableCode(code) {
		c.s.log.Warn().Uint64("conn", c.id).Int("code", code).Msg("close code cannot be sent; using 1011")
		code = wire.CloseInternalError
	}
	c.mu.Lock()
	c.closeLocked(code, reason, true, time.Time{})
	c.mu.Unlock()
}

// stop closes c for Stop: after what is queued, all done by the deadline by.
func (c *conn) stop(code int, reason string, by time.Time) {
	c.mu.Lock()
	c.closeLocked(code, reason, true, by)
	c.mu.Unlock()
}

// tick pings an admitted connection, or times out one never admitted.
func (c *conn) tick(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing || c.done || c.broken {
		return
	}
	if !c.admitted {
		if now.Sub(c.openedAt) >= c.cfg.peerTimeout {
			c.closeLocked(wire.CloseTryAgainLater, "admit timeout", true, now.Add(c.cfg.closeGrace))
		}
		return
	}
	c.pingDue = true
	c.ensureWriterLocked()
}

// closeLocked starts closing c with code and reason: a close frame goes out
// after the queued messages if flush, else instead of them. A non-zero by
// bounds the close handshake. The first close wins; later ones can only
// shorten the deadline.
func (c *conn) closeLocked(code int, reason string, flush bool, by time.Time) {
	if !by.IsZero() {
		c.closeByLocked(by)
	}
	if c.closing || c.done {
		return
	}
	c.closing = true
	c.closeCode, c.closeReason = code, reason
	if !flush {
		c.dropQueueLocked()
	}
	c.ensureWriterLocked()
	c.ensureReaderLocked()
	c.s.events.Wake() // a reader waiting for event space drops its frame
}

// closeByLocked sets the close deadline to t unless it is already earlier.
func (c *conn) closeByLocked(t time.Time) {
	if !c.closeBy.IsZero() && !t.Before(c.closeBy) {
		return
	}
	c.closeBy = t
	_ = c.nc.SetDeadline(t)
}

// deadlineLocked is the I/O deadline for a read or write starting now.
func (c *conn) deadlineLocked(now time.Time) time.Time {
	d := now.Add(c.cfg.peerTimeout)
	if !c.closeBy.IsZero() && c.closeBy.Before(d) {
		return c.closeBy
	}
	return d
}

func (c *conn) dropQueueLocked() {
	clear(c.queue)
	c.queue, c.head, c.queued = nil, 0, 0
}

// ensureReaderLocked starts the connection's read side: for an admitted
// connection with nothing read ahead, a waiter (see wait); else readLoop.
func (c *conn) ensureReaderLocked() {
	if c.reading {
		return
	}
	c.reading = true
	c.s.wg.Add(1)
	if c.admitted && !c.closing && !c.broken && len(c.prefix) == 0 {
		_ = c.nc.SetReadDeadline(c.deadlineLocked(time.Now()))
		go c.wait()
		return
	}
	go c.readLoop()
}

func (c *conn) ensureWriterLocked() {
	if c.writing || c.done || c.broken || c.closeSent {
		return
	}
	c.writing = true
	c.s.wg.Add(1)
	go c.writeLoop()
}

// Read reads from the socket for the msgReader: first what the handshake
// read ahead, then the socket, each read with the liveness deadline.
func (c *conn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		if len(c.prefix) == 0 {
			c.prefix = nil
		}
		return n, nil
	}
	c.mu.Lock()
	_ = c.nc.SetReadDeadline(c.deadlineLocked(time.Now()))
	c.mu.Unlock()
	return c.nc.Read(p)
}

// readAheadSize bounds what readAhead reads at once: a small request's
// whole frame, so that the msgReader's reads take no system call.
const readAheadSize = 4 << 10

// readBufs holds readAhead's buffers: a waiting connection holds none.
var readBufs = sync.Pool{New: func() any {
	b := make([]byte, readAheadSize)
	return &b
}}

// awaitActive waits, between messages, until the peer sends something,
// and keeps what it read in prefix for Read. It holds no buffer while it
// waits. After cfg.lingerIdle of silence it returns errIdle, with the read
// deadline set back to the liveness deadline counted from when it began
// to wait; a closing connection waits up to its deadlines as Read does.
func (c *conn) awaitActive() error {
	if len(c.prefix) > 0 {
		return nil
	}
	now := time.Now()
	c.mu.Lock()
	live := c.deadlineLocked(now)
	linger := !c.closing && c.closeBy.IsZero() && now.Add(c.cfg.lingerIdle).Before(live)
	if linger {
		_ = c.nc.SetReadDeadline(now.Add(c.cfg.lingerIdle))
	} else {
		_ = c.nc.SetReadDeadline(live)
	}
	c.mu.Unlock()
	err := c.readAhead()
	if !linger || !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing || !c.closeBy.IsZero() {
		return err // the close's deadline, set meanwhile
	}
	_ = c.nc.SetReadDeadline(live)
	return errIdle
}

// readAhead reads what the peer has sent, up to readAheadSize bytes, into
// prefix, waiting for it under the read deadline set.
func (c *conn) readAhead() error {
	if c.raw == nil {
		var one [1]byte
		n, err := c.nc.Read(one[:])
		if n > 0 {
			c.prefix = append(c.prefix, one[:n]...)
			return nil
		}
		return err
	}
	var (
		got  []byte
		rerr error
	)
	err := c.raw.Read(func(fd uintptr) bool {
		bp := readBufs.Get().(*[]byte)
		defer readBufs.Put(bp)
		for {
			n, err := syscall.Read(int(fd), *bp)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				return false // wait until readable
			case err != nil:
				rerr = err
			case n == 0:
				rerr = io.EOF
			default:
				got = bytes.Clone((*bp)[:n])
			}
			return true
		}
	})
	switch {
	case got != nil:
		c.prefix = got
		return nil
	case err != nil:
		return err
	}
	return rerr
}

// control handles a control frame from the peer.
func (c *conn) control(op ws.OpCode, p []byte) error {
	switch op {
	case ws.OpPing:
		c.mu.Lock()
		if !c.closing {
			c.pong = append(c.pong[:0], p...)
			c.pongDue = true
			c.ensureWriterLocked()
		}
		c.mu.Unlock()
	case ws.OpPong:
		// The read itself renewed the deadline.
	case ws.OpClose:
		code, reason, err := parseClose(p)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.closeLocked(code, reason, false, time.Now().Add(c.cfg.closeGrace))
		c.dropQueueLocked() // the peer reads no more data
		c.mu.Unlock()
		return errPeerClosed
	}
	return nil
}

// readLoop reads messages while the peer is active. When the peer has
// sent nothing for cfg.lingerIdle between messages (1 s, or a quarter of
// a shorter peer timeout), it hands the connection to a new waiter
// goroutine and exits; when the connection ends, it tears it down and
// reports it closed.
func (c *conn) readLoop() {
	defer c.s.wg.Done()
	m := newMsgReader(c, c.maxIn, c.control)
	m.await = c.awaitActive
	var err error
	for {
		var op ws.OpCode
		var data []byte
		if op, data, err = m.next(); err != nil {
			break
		}
		// Waits while the event queue is full; dropped once c is closing
		// (the host asked for no more of it).
		c.s.events.PushFrame(contract.Event{Kind: contract.EventFrame, Conn: c.id, Binary: op == ws.OpBinary, Data: data}, c.wantsFrames)
	}
	if errors.Is(err, errIdle) {
		c.s.wg.Add(1)
		go c.wait()
		return
	}
	c.end(err)
}

// wait is an idle connection's goroutine. It only blocks in a one-byte
// read (with the liveness deadline readLoop or admit set), so its stack
// stays at the runtime's smallest (2 KiB): a goroutine that ran the
// frame reader has grown to 4 KiB, and the runtime never shrinks a stack
// that small. When the peer sends something, it hands the connection to
// a new readLoop and exits.
func (c *conn) wait() {
	defer c.s.wg.Done()
	var one [1]byte
	n, err := c.nc.Read(one[:])
	if n == 0 && err != nil {
		c.end(err)
		return
	}
	c.prefix = append(c.prefix, one[:n]...)
	c.s.wg.Add(1)
	go c.readLoop()
}

// errIdle ends a readLoop whose peer went quiet: a waiter takes over.
var errIdle = errors.New("peer idle")

// end tears the connection down after its read side ended with err, and
// reports it closed.
func (c *conn) end(err error) {
	lost := ""
	code, reason, failed := failCode(err)
	switch {
	case errors.Is(err, errPeerClosed):
		// control queued the echo; waitWriter lets it go out.
	case failed:
		c.mu.Lock()
		c.closeLocked(code, reason, false, time.Now().Add(c.cfg.closeGrace))
		c.mu.Unlock()
		c.drain()
	default:
		if errors.Is(err, os.ErrDeadlineExceeded) {
			lost = "peer timeout"
		}
		_ = c.nc.Close()
	}
	c.waitWriter()
	_ = c.nc.Close()

	c.mu.Lock()
	code, reason = c.closeCode, c.closeReason
	c.mu.Unlock()
	if code == 0 {
		code, reason = wire.CloseAbnormal, lost
	}
	c.s.log.Debug().Uint64("conn", c.id).AnErr("cause", err).Msg("connection ended")
	c.s.closed(c, code, reason)
}

// drain discards input until the peer closes or the close deadline passes,
// so that closing the socket does not reset it before the peer has read
// the close frame.
func (c *conn) drain() {
	var buf [512]byte
	for {
		if _, err := c.Read(buf[:]); err != nil {
			return
		}
	}
}

// waitWriter stops new writers and waits for the running one to finish.
func (c *conn) waitWriter() {
	c.mu.Lock()
	c.done = true
	if !c.writing {
		c.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	c.writerExit = ch
	c.mu.Unlock()
	<-ch
}

// writeLoop writes what is owed to the peer, control frames first, and
// exits when nothing is left.
func (c *conn) writeLoop() {
	defer c.s.wg.Done()
	var (
		hdrs [(maxBatch + 3) * maxHeaderSize]byte
		ctl  [2 * ws.MaxControlFramePayloadSize]byte
		vec  [2 * (maxBatch + 3)][]byte
	)
	for {
		h := hdrs[:0]
		bufs := net.Buffers(vec[:0])
		frame := func(op ws.OpCode, p []byte) {
			start := len(h)
			h = appendHeader(h, op, len(p))
			bufs = append(bufs, h[start:])
			if len(p) > 0 {
				bufs = append(bufs, p)
			}
		}

		c.mu.Lock()
		if c.closeSent || c.broken {
			c.exitWriterLocked()
			c.mu.Unlock()
			return
		}
		var nb, pn int64
		if c.partial != nil {
			// The end of a frame kick began: nothing may come before it.
			bufs = append(bufs, c.partial)
			pn = int64(len(c.partial))
			c.partial = nil
		}
		if c.pongDue {
			n := copy(ctl[:ws.MaxControlFramePayloadSize], c.pong)
			frame(ws.OpPong, ctl[:n])
			c.pongDue = false
		}
		if c.pingDue {
			frame(ws.OpPing, nil)
			c.pingDue = false
		}
		for k := 0; k < maxBatch && c.head < len(c.queue); k++ {
			m := c.queue[c.head]
			c.queue[c.head] = outMsg{}
			c.head++
			frame(m.op, m.data)
			nb += int64(len(m.data))
		}
		if c.head == len(c.queue) {
			c.queue, c.head = c.queue[:0], 0
		}
		c.queued -= nb
		c.inflight = nb + pn
		isClose := c.closing && len(c.queue) == 0
		if isClose {
			frame(ws.OpClose, closeBody(ctl[ws.MaxControlFramePayloadSize:], c.closeCode, c.closeReason))
		}
		if len(bufs) == 0 {
			c.exitWriterLocked()
			c.mu.Unlock()
			return
		}
		_ = c.nc.SetWriteDeadline(c.deadlineLocked(time.Now()))
		c.mu.Unlock()

		_, err := bufs.WriteTo(c.nc)
		clear(vec[:])

		c.mu.Lock()
		c.inflight = 0
		if err != nil {
			c.broken = true
			c.exitWriterLocked()
			c.ensureReaderLocked() // a conn never admitted needs its teardown too
			c.mu.Unlock()
			c.s.log.Debug().Uint64("conn", c.id).Err(err).Msg("write failed")
			_ = c.nc.Close()
			return
		}
		if isClose {
			c.closeSent = true
			c.closeByLocked(time.Now().Add(c.cfg.closeGrace))
		}
		c.mu.Unlock()
		if isClose {
			if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
		}
	}
}

func (c *conn) exitWriterLocked() {
	c.writing = false
	if cap(c.queue) > 16 && len(c.queue) == 0 {
		c.queue = nil // keep idle sockets small
	}
	if c.writerExit != nil {
		close(c.writerExit)
		c.writerExit = nil
	}
}
