package ptyroute

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/wire"
)

// ptyConn is one /api/pty socket.
type ptyConn struct {
	id     contract.TransportID
	out    link.Sender
	r      *Router
	token  string
	q      PTYQuery
	legacy bool
	who    access.Identity // who the socket's credential names
	// create: the socket's credential may create a PTY but does not
	// reach this token: it is refused (4403) if the PTY exists, and
	// granted the token when its attach creates it.
	create bool
	log    zerolog.Logger
	opened time.Time // admitted

	mu      sync.Mutex // guards the fields below
	ops     []func()   // attach, input, resize, teardown: applied in order by one worker
	working bool
	closed  bool // no more ops are taken; those queued before still run

	// Guarded by the router's mu.
	pending  bool // attach in flight: output is buffered
	buffered []contract.Output
	from     int64  // deliver output at offsets >= from
	epoch    string // the PTY instance it is attached to
	attached bool
	cut      bool // closed with 1013 by the router: no more output
}

var _ link.Endpoint = (*Router)(nil)

// Open implements link.Endpoint: it admits a new /api/pty socket and
// starts attaching it (a malformed query is refused with 4400).
func (r *Router) Open(o link.Opening) link.Conn {
	id, out := o.ID, o.Out
	q, err := ParsePTYQuery(o.Event.Query)
	if err != nil {
		out.Send(contract.Command{Kind: contract.CommandClose, Conn: id.Conn, Code: wire.CloseBadRequest, Reason: "bad attach token or offset"})
		return nil
	}
	q.boundSize(r.maxCols, r.maxRows)
	if q.BadSize {
		// Dropped like a bad resize escape: the PTY keeps its size.
		r.metrics.BadResizes.Inc()
		r.log.Debug().Str("transport_id", id.String()).Msg("attach size dropped")
	}
	create, ok := r.authorize(o.Who, q)
	if !ok {
		r.log.Debug().Str("transport_id", id.String()).Str("credential", o.Who.Name).Msg("pty socket outside the credential's scope")
		out.Send(contract.Command{Kind: contract.CommandClose, Conn: id.Conn, Code: wire.CloseForbidden, Reason: access.ErrForbidden.Error()})
		return nil
	}
	r.mu.Lock()
	remote := r.remote
	r.mu.Unlock()
	if remote != nil && q.Attach != "" && o.Transport != link.RelayTransport {
		// The host that has the PTY checks a creation again (it knows
		// whether the PTY exists).
		return r.openClustered(remote, id, o.Who, create, q, out)
	}
	c := r.newConn(id, q, out)
	c.who = o.Who
	c.create = create
	c.start()
	return c
}

// authorize decides whether who may open the socket q asks for
// (docs/PROTOCOL.md, "Credentials and scopes"): admin, or pty:TOKEN
// (pty:TOKEN:view for view=1); a credential that may create ("new") may
// also attach a token it does not reach yet when that makes a new PTY
// (create: checked at the attach) and open a socket with no token.
func (r *Router) authorize(who access.Identity, q PTYQuery) (create, ok bool) {
	scopes := access.ScopesOf(r.book, who)
	switch {
	case access.IsAdmin(scopes):
		return false, true
	case q.Attach == "":
		return false, access.CanCreate(scopes)
	case access.Can(scopes, access.ScopePTY, q.Attach, !q.View):
		return false, true
	case !q.View && access.CanCreate(scopes):
		return true, true
	}
	return false, false
}

// newConn makes the socket of a PTY of this host; start admits it.
func (r *Router) newConn(id contract.TransportID, q PTYQuery, out link.Sender) *ptyConn {
	c := &ptyConn{id: id, out: out, r: r, q: q, token: q.Attach, log: r.log.With().Str("transport_id", id.String()).Logger(), opened: time.Now()}
	if c.token == "" {
		c.token = "legacy-" + contract.RandomHex(12)
		c.legacy = true
		c.q.View = false
	}
	return c
}

// start admits the socket and starts attaching it.
func (c *ptyConn) start() {
	c.out.Send(contract.Command{Kind: contract.CommandAdmit, Conn: c.id.Conn})
	c.enqueue(c.attach)
}

func (c *ptyConn) closeWith(code int, reason string) {
	c.out.Send(contract.Command{Kind: contract.CommandClose, Conn: c.id.Conn, Code: code, Reason: reason})
}

func (c *ptyConn) sendBinary(data []byte) {
	c.r.metrics.BytesOut.Add(float64(len(data)))
	c.out.Send(contract.Command{Kind: contract.CommandSend, Conn: c.id.Conn, Binary: true, Data: data})
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
		if len(c.ops) == 0 {
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
		c.closeWith(wire.CloseInternalError, "pty backend unavailable")
		return
	}
	r.mu.Unlock()
	if c.create {
		// Only a new PTY: another's is not joined (nor its writer
		// superseded) by a credential that does not reach it.
		ctx, cancel := rpcCtx()
		ptys, err := backend.List(ctx)
		cancel()
		if err != nil {
			c.log.Warn().Err(err).Msg("pty list failed")
			c.closeWith(wire.CloseInternalError, "pty attach failed")
			return
		}
		for _, p := range ptys {
			if p.Token == c.token {
				c.closeWith(wire.CloseForbidden, access.ErrForbidden.Error())
				return
			}
		}
	}
	r.mu.Lock()
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
		Cols:      c.q.Cols,
		Rows:      c.q.Rows,
		OnHeader: func(resp contract.AttachResponse) {
			headerSent = true
			c.sendReplayHeader(resp)
		},
		OnReplay: func(p []byte) {
			c.sendReplay(p)
			// A big replay is taken from the plugin no faster than the
			// transport takes it.
			if l, ok := c.out.(link.FlowSender); ok {
				l.WaitRoom(ctx, ptyStallTimeout)
			}
		},
	})
	cancel()
	if err != nil {
		r.mu.Lock()
		r.dropLocked(c)
		r.mu.Unlock()
		switch {
		case errors.Is(err, contract.ErrNoSuchTerminal):
			c.closeWith(wire.CloseNoSuchTerminal, "no such terminal")
		case errors.Is(err, contract.ErrRegistryFull):
			c.closeWith(wire.CloseInternalError, "registry full")
		case errors.Is(err, contract.ErrInvalidArgument):
			c.closeWith(wire.CloseBadRequest, "bad attach token")
		default:
			c.log.Warn().Err(err).Msg("pty attach failed")
			c.closeWith(wire.CloseInternalError, "pty attach failed")
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
		superseded.closeWith(wire.CloseSuperseded, "opened elsewhere")
	}
	if c.create && r.book != nil && c.who.Credential != "" {
		gctx, cancel := rpcCtx()
		if err := r.book.Grant(gctx, c.who.Credential, access.PTYScope(c.token, false)); err != nil {
			c.log.Warn().Err(err).Msg("the PTY this credential created is reachable on this socket only")
		}
		cancel()
	}
	r.metrics.PTYAttach.Observe(time.Since(c.opened).Seconds())
	c.log.Debug().Str("token_reason", resp.Reason).Bool("reset", resp.Reset).Int64("replay_end", resp.ReplayEnd).Msg("pty attached")
}

// sendReplayHeader sends the pty.replay text frame of resp.
func (c *ptyConn) sendReplayHeader(resp contract.AttachResponse) {
	hdr, _ := json.Marshal(wire.Replay{
		Type:            wire.ReplayType,
		Epoch:           resp.Epoch,
		StartOffset:     resp.StartOffset,
		ReplayEndOffset: resp.ReplayEnd,
		Reset:           resp.Reset,
		Reason:          resp.Reason,
		Snapshot:        resp.Snapshot,
		SnapshotBytes:   resp.SnapshotBytes,
		Cols:            resp.Cols,
		Rows:            resp.Rows,
	})
	c.out.Send(contract.Command{Kind: contract.CommandSend, Conn: c.id.Conn, Data: hdr})
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
			c.closeWith(wire.CloseTryAgainLater, "output gap")
			c.from, c.cut = end, true
			return false
		}
		c.sendBinary(o.Data[c.from-o.Offset:])
		c.from = end
		sent = true
	}
	if o.Exited {
		c.closeWith(wire.CloseProcessExited, "process exited")
	}
	return sent
}
