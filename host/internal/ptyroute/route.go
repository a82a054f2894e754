// Package ptyroute connects /api/pty sockets to the PTY backend: it
// parses and checks each socket's query, attaches it (pty.replay header,
// replay, then live output from the offset the replay ended at), forwards
// input and resizes, fans the backend's one output stream out to every
// attached socket with backpressure on the transport links, and detaches
// sockets with a compare-and-swap on their transport identity (the
// backend's), so a superseded socket's late close never detaches the new
// writer.
package ptyroute

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/wire"
)

// ptyChunk bounds one binary frame of replay output.
const ptyChunk = 64 << 10

// ptyStallTimeout bounds how long the output stream waits for one
// transport link's queue to drain below its high-water mark. After it,
// that link's PTY sockets are closed with 1013 (they can reattach with
// their offsets) so that a stalled transport cannot stop other PTYs'
// output.
const ptyStallTimeout = 5 * time.Second

// Router connects /api/pty sockets to the PTY backend: it attaches and
// detaches them (detach is a compare-and-swap on the socket's transport
// identity, done by the backend), forwards input and resizes, and fans the
// backend's output stream out to the attached sockets from the offset each
// one's replay ended at.
type Router struct {
	log     zerolog.Logger
	metrics *metrics.Metrics
	maxCols int // the largest PTY size a resize may ask for
	maxRows int
	wg      sync.WaitGroup // per-socket workers and detaches
	book    *access.Book   // the host's credentials (SetCredentials); nil: identities as given
	// onExit is told of each PTY's exit (SetOnExit); nil: none.
	onExit func(token string, code int, attended bool)

	mu      sync.Mutex // guards the fields below
	backend contract.Backend
	remote  Remote               // a cluster host's (remote.go); nil alone
	routes  map[string]*ptyRoute // by attach token
	conns   map[contract.TransportID]*ptyConn
}

// ptyRoute is the sockets attached to one PTY.
type ptyRoute struct {
	socks map[contract.TransportID]*ptyConn
}

// New returns a router with no backend yet (sockets are refused
// with 1011 until SetBackend) that drops a resize over maxCols×maxRows
// (--pty-max-size; 0 takes DefaultMaxCols, DefaultMaxRows).
func New(log zerolog.Logger, m *metrics.Metrics, maxCols, maxRows int) *Router {
	return &Router{
		log: log, metrics: m,
		maxCols: cmp.Or(maxCols, DefaultMaxCols), maxRows: cmp.Or(maxRows, DefaultMaxRows),
		routes: make(map[string]*ptyRoute), conns: make(map[contract.TransportID]*ptyConn),
	}
}

// SetCredentials gives the router the host's credential book: a socket
// is checked against its credential's current scopes. Call it before
// the first socket.
func (r *Router) SetCredentials(b *access.Book) { r.book = b }

// SetOnExit makes the router tell f of each PTY whose process exited
// (its token, exit status, and whether a socket was attached to it),
// from the output stream, with no lock held; f must not block. Call it
// before the backend starts.
func (r *Router) SetOnExit(f func(token string, code int, attended bool)) { r.onExit = f }

// SetBackend sets the backend new attaches go to.
func (r *Router) SetBackend(b contract.Backend) {
	r.mu.Lock()
	r.backend = b
	r.mu.Unlock()
}

// Wait waits for the router's workers.
func (r *Router) Wait() { r.wg.Wait() }

// OnOutput is the backend's output sink: it fans each piece out to the
// sockets attached to its PTY, then waits (at most ptyStallTimeout) while
// a transport link it queued output to has too much queued, so that a
// fast child is slowed down to what the transport takes instead of
// outrunning the ring.
func (r *Router) OnOutput(ctx context.Context, outs []contract.Output) error {
	var links []link.FlowSender
	var attended map[string]bool // the exited PTYs that had a socket
	r.mu.Lock()
	if r.onExit != nil {
		for _, o := range outs {
			if route := r.routes[o.Token]; o.Exited && route != nil && len(route.socks) > 0 {
				if attended == nil {
					attended = map[string]bool{}
				}
				attended[o.Token] = true
			}
		}
	}
	r.fanOutLocked(outs, func(c *ptyConn) {
		if l, ok := c.out.(link.FlowSender); ok && !slices.Contains(links, l) {
			links = append(links, l)
		}
	})
	r.mu.Unlock()
	if r.onExit != nil {
		for _, o := range outs {
			if o.Exited {
				r.onExit(o.Token, o.ExitCode, attended[o.Token])
			}
		}
	}
	for _, l := range links {
		if !l.WaitRoom(ctx, ptyStallTimeout) {
			r.cutStalled(l)
		}
	}
	return nil
}

// cutStalled closes every attached socket of the stalled sender out with
// 1013 and stops queueing output to them.
func (r *Router) cutStalled(out link.Sender) {
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
		c.closeWith(wire.CloseTryAgainLater, "output stalled")
	}
	r.log.Warn().Int("sockets", len(cut)).Str("waited", ptyStallTimeout.String()).Msg("transport stalled: pty sockets closed with 1013")
}

// fanOutLocked queues outs to the attached sockets (buffering them for
// sockets still attaching) and calls sent for each socket output was
// queued to. r.mu is held.
func (r *Router) fanOutLocked(outs []contract.Output, sent func(*ptyConn)) {
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
func (r *Router) dropLocked(c *ptyConn) {
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

// OnFrame handles input: the whole-frame resize escape resizes, anything
// else is written. A view socket's frames are dropped.
func (c *ptyConn) OnFrame(data []byte, _ bool) {
	c.r.metrics.FramesIn.Inc()
	c.r.metrics.BytesIn.Add(float64(len(data)))
	if c.q.View {
		return
	}
	if wire.IsResize(data) {
		cols, rows, err := ParseResize(data, c.r.maxCols, c.r.maxRows)
		if err != nil {
			// Never typed into the shell, and never sent to the
			// backend: a malformed resize, or one over the largest
			// size, is dropped.
			c.r.metrics.BadResizes.Inc()
			c.log.Debug().Err(err).Int("bytes", len(data)).Msg("resize dropped")
			return
		}
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

// OnClosed detaches the socket once the input it sent before it closed
// has been written (a line typed and the tab closed at once still reaches
// the shell): the teardown is the last op of the socket's worker. The
// backend's detach is a compare-and-swap on this socket's identity, so a
// superseded socket's late close never detaches the new writer (and its
// input was dropped by the same check). A legacy socket's PTY is closed
// with it.
func (c *ptyConn) OnClosed() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	if c.working {
		c.ops = append(c.ops, c.teardown)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.teardown()
}

// teardown forgets the socket through the one drop path and detaches it
// from its PTY (or closes a legacy PTY) on a goroutine of its own.
func (c *ptyConn) teardown() {
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

// CloseAll closes every PTY socket with code (the backend went away),
// forgetting each through the one drop path.
func (r *Router) CloseAll(code int, reason string) {
	r.mu.Lock()
	conns := make([]*ptyConn, 0, len(r.conns))
	for _, c := range r.conns {
		conns = append(conns, c)
		r.dropLocked(c)
	}
	r.mu.Unlock()
	for _, c := range conns {
		c.closeWith(code, reason)
	}
}

// WaitIdle waits, up to d, until no socket is routed to a PTY (their
// PTYs' exit markers closed them); it polls, since the sockets close on
// the output stream's goroutine.
func (r *Router) WaitIdle(ctx context.Context, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil && r.ConnCount() > 0 {
		time.Sleep(10 * time.Millisecond)
	}
}

// ConnCount is the number of sockets attached (or attaching) to PTYs.
func (r *Router) ConnCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns)
}
