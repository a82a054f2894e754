package host

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

// ptyChunk bounds one binary frame of replay output.
const ptyChunk = 64 << 10

// ptyStallTimeout bounds how long the output stream waits for one
// transport link's queue to drain below its high-water mark. After it,
// that link's PTY sockets are closed with 1013 (they can reattach with
// their offsets) so that a stalled transport cannot stop other PTYs'
// output.
const ptyStallTimeout = 5 * time.Second

// linkConn is a connection a Link routes frames and its close to.
type linkConn interface {
	onFrame(data []byte, binary bool)
	onClosed()
}

// PTYQuery is a parsed /api/pty query (SPEC §6).
type PTYQuery struct {
	Attach    string // "" in legacy mode
	HasOffset bool
	Offset    int64
	Epoch     string
	View      bool
}

// ParsePTYQuery parses and validates the query of an /api/pty upgrade. A
// malformed attach token or offset is an error (close 4400).
func ParsePTYQuery(raw string) (PTYQuery, error) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return PTYQuery{}, fmt.Errorf("query: %v: %w", err, contract.ErrInvalidArgument)
	}
	var p PTYQuery
	if vs, ok := q["attach"]; ok {
		if len(vs) != 1 || !ValidAttachToken(vs[0]) {
			return PTYQuery{}, fmt.Errorf("attach must be 16-128 of [A-Za-z0-9_-]: %w", contract.ErrInvalidArgument)
		}
		p.Attach = vs[0]
	}
	if vs, ok := q["offset"]; ok {
		if len(vs) != 1 {
			return PTYQuery{}, fmt.Errorf("offset given twice: %w", contract.ErrInvalidArgument)
		}
		n, err := strconv.ParseInt(vs[0], 10, 64)
		if err != nil || n < 0 {
			return PTYQuery{}, fmt.Errorf("offset must be a non-negative integer: %w", contract.ErrInvalidArgument)
		}
		p.HasOffset, p.Offset = true, n
	}
	p.Epoch = q.Get("epoch")
	p.View = q.Get("view") == "1"
	return p, nil
}

// ValidAttachToken reports whether t is 16–128 characters of
// [A-Za-z0-9_-].
func ValidAttachToken(t string) bool {
	if len(t) < 16 || len(t) > 128 {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ParseResize reports whether frame is exactly the resize escape
// ESC [ R E S I Z E : cols ; rows ] and returns the size.
func ParseResize(frame []byte) (cols, rows int, ok bool) {
	const prefix = "\x1b[RESIZE:"
	if len(frame) < len(prefix)+4 || len(frame) > 64 || string(frame[:len(prefix)]) != prefix || frame[len(frame)-1] != ']' {
		return 0, 0, false
	}
	body := string(frame[len(prefix) : len(frame)-1])
	c, r, found := cutByte(body, ';')
	if !found {
		return 0, 0, false
	}
	cols, err1 := strconv.Atoi(c)
	rows, err2 := strconv.Atoi(r)
	if err1 != nil || err2 != nil || cols <= 0 || rows <= 0 || cols > 10000 || rows > 10000 || c[0] == '+' || r[0] == '+' {
		return 0, 0, false
	}
	return cols, rows, true
}

func cutByte(s string, b byte) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == b {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// PTYRouter connects /api/pty sockets to the PTY backend: it attaches and
// detaches them (detach is a compare-and-swap on the socket's transport
// identity, done by the backend), forwards input and resizes, and fans the
// backend's output stream out to the attached sockets from the offset each
// one's replay ended at.
type PTYRouter struct {
	log     zerolog.Logger
	metrics *Metrics
	wg      sync.WaitGroup // per-socket workers and detaches

	mu      sync.Mutex // guards the fields below
	backend contract.Backend
	routes  map[string]*ptyRoute // by attach token
	conns   map[contract.TransportID]*ptyConn
}

// ptyRoute is the sockets attached to one PTY.
type ptyRoute struct {
	socks map[contract.TransportID]*ptyConn
}

// NewPTYRouter returns a router with no backend yet (sockets are refused
// with 1011 until SetBackend).
func NewPTYRouter(log zerolog.Logger, m *Metrics) *PTYRouter {
	return &PTYRouter{log: log, metrics: m, routes: make(map[string]*ptyRoute), conns: make(map[contract.TransportID]*ptyConn)}
}

// SetBackend sets the backend new attaches go to.
func (r *PTYRouter) SetBackend(b contract.Backend) {
	r.mu.Lock()
	r.backend = b
	r.mu.Unlock()
}

// Wait waits for the router's workers.
func (r *PTYRouter) Wait() { r.wg.Wait() }

// ptyConn is one /api/pty socket.
type ptyConn struct {
	id     contract.TransportID
	out    sender
	r      *PTYRouter
	token  string
	q      PTYQuery
	legacy bool
	log    zerolog.Logger

	mu      sync.Mutex // guards the fields below
	ops     []func()   // attach, input, resize: applied in order by one worker
	working bool
	closed  bool

	// Guarded by the router's mu.
	pending  bool // attach in flight: output is buffered
	buffered []contract.Output
	from     int64  // deliver output at offsets >= from
	epoch    string // the PTY instance it is attached to
	attached bool
	cut      bool // closed with 1013 by the router: no more output
}

// open admits a new /api/pty socket and starts attaching it.
func (r *PTYRouter) open(id contract.TransportID, ev *contract.Event, out sender) linkConn {
	q, err := ParsePTYQuery(ev.Query)
	if err != nil {
		out.send(contract.Command{Kind: contract.CommandClose, Conn: id.Conn, Code: contract.CloseBadRequest, Reason: "bad attach token or offset"})
		return nil
	}
	c := &ptyConn{id: id, out: out, r: r, q: q, token: q.Attach, log: r.log.With().Str("transport_id", id.String()).Logger()}
	if c.token == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		c.token = "legacy-" + hex.EncodeToString(b[:])
		c.legacy = true
		c.q.View = false
	}
	out.send(contract.Command{Kind: contract.CommandAdmit, Conn: id.Conn})
	c.enqueue(c.attach)
	return c
}

func (c *ptyConn) closeWith(code int, reason string) {
	c.out.send(contract.Command{Kind: contract.CommandClose, Conn: c.id.Conn, Code: code, Reason: reason})
}

func (c *ptyConn) sendBinary(data []byte) {
	c.r.metrics.BytesOut.Add(float64(len(data)))
	c.out.send(contract.Command{Kind: contract.CommandSend, Conn: c.id.Conn, Binary: true, Data: data})
}

// enqueue runs op on the socket's worker, after every op before it.
func (c *ptyConn) enqueue(op func()) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.ops = append(c.ops, op)
	start := !c.working
	c.working = true
	c.mu.Unlock()
	if start {
		c.r.wg.Add(1)
		go c.work()
	}
}

func (c *ptyConn) work() {
	defer c.r.wg.Done()
	for {
		c.mu.Lock()
		if len(c.ops) == 0 || c.closed {
			c.ops = nil
			c.working = false
			c.mu.Unlock()
			return
		}
		op := c.ops[0]
		c.ops = c.ops[1:]
		c.mu.Unlock()
		op()
	}
}

func rpcCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// attach registers the socket as pending (so output arriving meanwhile is
// buffered), attaches it in the backend, then sends pty.replay, the
// replay and the buffered output past the replay's end.
func (c *ptyConn) attach() {
	r := c.r
	r.mu.Lock()
	backend := r.backend
	if backend == nil {
		r.mu.Unlock()
		c.closeWith(contract.CloseInternalError, "pty backend unavailable")
		return
	}
	c.pending = true
	r.conns[c.id] = c
	route := r.routes[c.token]
	if route == nil {
		route = &ptyRoute{socks: make(map[contract.TransportID]*ptyConn)}
		r.routes[c.token] = route
	}
	route.socks[c.id] = c
	r.mu.Unlock()

	// The backend may stream the replay: pty.replay goes out as soon as
	// the cursor is decided and each piece as it arrives, so the hops
	// overlap. Live output stays buffered (pending) until the attach
	// returns. Commands for a socket that closed meanwhile are ignored by
	// the transport.
	headerSent := false
	ctx, cancel := rpcCtx()
	resp, err := backend.Attach(ctx, contract.AttachRequest{
		Token:     c.token,
		Viewer:    c.id,
		View:      c.q.View,
		HasCursor: c.q.HasOffset,
		Offset:    c.q.Offset,
		Epoch:     c.q.Epoch,
		OnHeader: func(resp contract.AttachResponse) {
			headerSent = true
			c.sendReplayHeader(resp)
		},
		OnReplay: func(p []byte) {
			c.sendReplay(p)
			// A big replay is taken from the plugin no faster than the
			// transport takes it.
			if l, ok := c.out.(flowSender); ok {
				l.waitRoom(ctx, ptyStallTimeout)
			}
		},
	})
	cancel()
	if err != nil {
		r.mu.Lock()
		r.dropLocked(c)
		r.mu.Unlock()
		switch {
		case errors.Is(err, contract.ErrRegistryFull):
			c.closeWith(contract.CloseInternalError, "registry full")
		case errors.Is(err, contract.ErrInvalidArgument):
			c.closeWith(contract.CloseBadRequest, "bad attach token")
		default:
			c.log.Warn().Err(err).Msg("pty attach failed")
			c.closeWith(contract.CloseInternalError, "pty attach failed")
		}
		return
	}

	var superseded *ptyConn
	r.mu.Lock()
	if _, still := r.conns[c.id]; !still {
		// The socket closed while attaching: undo, outside the lock.
		r.mu.Unlock()
		c.detach(backend)
		return
	}
	if !headerSent {
		c.sendReplayHeader(resp)
		c.sendReplay(resp.Replay)
	}
	c.pending, c.attached, c.from, c.epoch = false, true, resp.ReplayEnd, resp.Epoch
	buffered := c.buffered
	c.buffered = nil
	exited := false
	for _, o := range buffered {
		if o.Epoch != resp.Epoch {
			continue
		}
		c.deliverLocked(o)
		if o.Exited {
			exited = true
		}
	}
	if exited {
		r.dropLocked(c)
	}
	if !resp.Superseded.IsZero() {
		if old := r.conns[resp.Superseded]; old != nil && old.token == c.token {
			superseded = old
		}
	}
	r.mu.Unlock()
	if superseded != nil {
		r.metrics.Supersedes.Inc()
		superseded.closeWith(contract.CloseSuperseded, "opened elsewhere")
	}
	c.log.Debug().Str("token_reason", resp.Reason).Bool("reset", resp.Reset).Int64("replay_end", resp.ReplayEnd).Msg("pty attached")
}

// sendReplayHeader sends the pty.replay text frame of resp.
func (c *ptyConn) sendReplayHeader(resp contract.AttachResponse) {
	hdr, _ := json.Marshal(map[string]any{
		"type":              "pty.replay",
		"epoch":             resp.Epoch,
		"start_offset":      resp.StartOffset,
		"replay_end_offset": resp.ReplayEnd,
		"reset":             resp.Reset,
		"reason":            resp.Reason,
	})
	c.out.send(contract.Command{Kind: contract.CommandSend, Conn: c.id.Conn, Data: hdr})
}

// sendReplay sends replay bytes in binary frames of at most ptyChunk.
func (c *ptyConn) sendReplay(p []byte) {
	for len(p) > 0 {
		n := min(len(p), ptyChunk)
		c.sendBinary(p[:n])
		p = p[n:]
	}
}

// deliverLocked sends the part of o at offsets >= c.from, and the 4410
// close after the last byte when the process exited. It reports whether
// it queued output. r.mu is held.
func (c *ptyConn) deliverLocked(o contract.Output) (sent bool) {
	if c.cut {
		return false
	}
	end := o.Offset + int64(len(o.Data))
	if len(o.Data) > 0 && end > c.from {
		if o.Offset > c.from {
			// Bytes between c.from and o.Offset never reached this
			// socket (the stream fell behind the ring): drop it so it
			// reattaches with its offset.
			c.closeWith(contract.CloseTryAgainLater, "output gap")
			c.from, c.cut = end, true
			return false
		}
		c.sendBinary(o.Data[c.from-o.Offset:])
		c.from = end
		sent = true
	}
	if o.Exited {
		c.closeWith(contract.CloseProcessExited, "process exited")
	}
	return sent
}

// onOutput is the backend's output sink: it fans each piece out to the
// sockets attached to its PTY, then waits (at most ptyStallTimeout) while
// a transport link it queued output to has too much queued, so that a
// fast child is slowed down to what the transport takes instead of
// outrunning the ring.
func (r *PTYRouter) onOutput(ctx context.Context, outs []contract.Output) error {
	var links []flowSender
	r.mu.Lock()
	r.fanOutLocked(outs, func(c *ptyConn) {
		if l, ok := c.out.(flowSender); ok && !slices.Contains(links, l) {
			links = append(links, l)
		}
	})
	r.mu.Unlock()
	for _, l := range links {
		if !l.waitRoom(ctx, ptyStallTimeout) {
			r.cutStalled(l)
		}
	}
	return nil
}

// cutStalled closes every attached socket of the stalled sender out with
// 1013 and stops queueing output to them.
func (r *PTYRouter) cutStalled(out sender) {
	var cut []*ptyConn
	r.mu.Lock()
	for _, c := range r.conns {
		if c.out == out && c.attached && !c.cut {
			c.cut = true
			cut = append(cut, c)
		}
	}
	r.mu.Unlock()
	for _, c := range cut {
		c.closeWith(contract.CloseTryAgainLater, "output stalled")
	}
	r.log.Warn().Int("sockets", len(cut)).Dur("waited", ptyStallTimeout).Msg("transport stalled: pty sockets closed with 1013")
}

// fanOutLocked queues outs to the attached sockets (buffering them for
// sockets still attaching) and calls sent for each socket output was
// queued to. r.mu is held.
func (r *PTYRouter) fanOutLocked(outs []contract.Output, sent func(*ptyConn)) {
	for _, o := range outs {
		route := r.routes[o.Token]
		if route == nil {
			continue
		}
		for _, c := range route.socks {
			if c.pending {
				c.buffered = append(c.buffered, o)
				continue
			}
			if c.epoch != o.Epoch {
				continue
			}
			if c.deliverLocked(o) {
				sent(c)
			}
		}
		if o.Exited {
			for _, c := range route.socks {
				if !c.pending && c.epoch == o.Epoch {
					r.dropLocked(c)
				}
			}
		}
	}
}

// dropLocked forgets c in the router's maps.
func (r *PTYRouter) dropLocked(c *ptyConn) {
	if r.conns[c.id] == c {
		delete(r.conns, c.id)
	}
	if route := r.routes[c.token]; route != nil {
		delete(route.socks, c.id)
		if len(route.socks) == 0 {
			delete(r.routes, c.token)
		}
	}
}

// onFrame handles input: the whole-frame resize escape resizes, anything
// else is written. A view socket's frames are dropped.
func (c *ptyConn) onFrame(data []byte, _ bool) {
	c.r.metrics.FramesIn.Inc()
	c.r.metrics.BytesIn.Add(float64(len(data)))
	if c.q.View {
		return
	}
	if cols, rows, ok := ParseResize(data); ok {
		c.enqueue(func() {
			c.do(func(ctx context.Context, b contract.Backend) error { return b.Resize(ctx, c.token, c.id, cols, rows) })
		})
		return
	}
	c.enqueue(func() {
		c.do(func(ctx context.Context, b contract.Backend) error { return b.Write(ctx, c.token, c.id, data) })
	})
}

// do runs one backend call for an attached socket; a superseded writer's
// input is dropped (ErrStaleTransport) by the backend's compare-and-swap.
func (c *ptyConn) do(f func(context.Context, contract.Backend) error) {
	c.r.mu.Lock()
	backend, ok := c.r.backend, c.attached && c.r.conns[c.id] == c
	c.r.mu.Unlock()
	if !ok || backend == nil {
		return
	}
	ctx, cancel := rpcCtx()
	defer cancel()
	if err := f(ctx, backend); err != nil && !errors.Is(err, contract.ErrStaleTransport) && !errors.Is(err, contract.ErrNotFound) {
		c.log.Debug().Err(err).Msg("pty input")
	}
}

// onClosed detaches the socket: the backend's detach is a compare-and-swap
// on this socket's identity, so a superseded socket's late close never
// detaches the new writer. A legacy socket's PTY is closed with it.
func (c *ptyConn) onClosed() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	r := c.r
	r.mu.Lock()
	attached := c.attached && r.conns[c.id] == c
	r.dropLocked(c)
	backend := r.backend
	r.mu.Unlock()
	if !attached || backend == nil {
		if c.legacy && backend != nil {
			r.wg.Add(1)
			go func() { defer r.wg.Done(); c.closeLegacy(backend) }()
		}
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		c.detach(backend)
	}()
}

func (c *ptyConn) detach(backend contract.Backend) {
	if c.legacy {
		c.closeLegacy(backend)
		return
	}
	ctx, cancel := rpcCtx()
	defer cancel()
	err := backend.Detach(ctx, c.token, c.id)
	switch {
	case errors.Is(err, contract.ErrStaleTransport):
		c.r.metrics.CASConflicts.Inc()
		c.log.Debug().Msg("stale pty detach ignored")
	case err != nil && !errors.Is(err, contract.ErrNotFound):
		c.log.Debug().Err(err).Msg("pty detach")
	}
}

func (c *ptyConn) closeLegacy(backend contract.Backend) {
	ctx, cancel := rpcCtx()
	defer cancel()
	if err := backend.Close(ctx, c.token); err != nil && !errors.Is(err, contract.ErrNotFound) {
		c.log.Debug().Err(err).Msg("closing legacy pty")
	}
}

// closeAll closes every PTY socket with code (the backend went away).
func (r *PTYRouter) closeAll(code int, reason string) {
	r.mu.Lock()
	conns := make([]*ptyConn, 0, len(r.conns))
	for _, c := range r.conns {
		conns = append(conns, c)
	}
	r.conns = make(map[contract.TransportID]*ptyConn)
	r.routes = make(map[string]*ptyRoute)
	r.mu.Unlock()
	for _, c := range conns {
		c.closeWith(code, reason)
	}
}
