// Package link is the host's end of one transport plugin process: it
// decides access for each new connection (package access), routes it to
// the endpoint of its path (/api/ws, /api/pty, …), hands the endpoint's
// connections their frames and their close, and queues the host's
// commands back to the plugin in ordered batches, with a bounded queue
// that senders may wait on for room.
package link

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/wire"
)

// RelayTransport is the transport name of connections another host of a
// cluster relays to this one (host/internal/cluster's Relay): a client
// connected there, reaching what only this host has.
const RelayTransport = "relay"

// Sender queues commands for one transport. Send never blocks.
type Sender interface {
	Send(cmd contract.Command)
}

// FlowSender is a Sender whose queue is bounded by waiting: the PTY
// output path waits for room so that backpressure reaches the backend.
type FlowSender interface {
	Sender
	// WaitRoom waits, at most d, until the queue is under its high-water
	// mark; it reports false if d passed first.
	WaitRoom(ctx context.Context, d time.Duration) bool
}

// Conn is a connection an endpoint admitted: the link hands it its data
// frames in order, then its close, once.
type Conn interface {
	OnFrame(data []byte, binary bool)
	OnClosed()
}

// Opening is a new connection an endpoint is asked to admit.
type Opening struct {
	// ID is the connection's transport identity, Transport the name of
	// its transport (RelayTransport for one another host relayed).
	ID        contract.TransportID
	Transport string
	// Event is its opened event: path, query, headers, peer.
	Event *contract.Event
	// Out queues its commands.
	Out FlowSender
	// Who is the identity its credential names: verified by this host's
	// access check, or, for a relayed connection, by the host the
	// client is connected to.
	Who access.Identity
}

// Endpoint serves the connections of one path. Open admits o's
// connection (it sends the admit, or a close, through o.Out itself) and
// returns it, or nil when it refused it.
type Endpoint interface {
	Open(o Opening) Conn
}

// Config configures a Link.
type Config struct {
	// Name is the transport's name ("ws", …); Instance the plugin
	// process's instance id.
	Name, Instance string
	Transport      contract.Transport
	// Endpoints by path; a path with none is refused with 4404.
	Endpoints map[string]Endpoint
	Access    *access.Access
	Metrics   *metrics.Metrics
	Log       zerolog.Logger
}

// Link is the host's end of one transport plugin instance: it turns the
// plugin's connection events into endpoint connections, and queues the
// host's commands back to the plugin in batches.
type Link struct {
	name      string
	instance  string
	tr        contract.Transport
	endpoints map[string]Endpoint
	access    *access.Access
	metrics   *metrics.Metrics
	log       zerolog.Logger
	notify    chan struct{}  // wakes the sender
	pages     sync.WaitGroup // page sign-ins in flight
	// handling is set while the event handler runs: it flushes what is
	// queued when it ends, so a Send meanwhile need not wake the sender
	// (a request's answer then wakes no other goroutine).
	handling atomic.Bool

	mu          sync.Mutex // guards the fields below
	conns       map[uint64]Conn
	who         map[uint64]string // conn → the credential it was opened with, while valid
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

var _ FlowSender = (*Link)(nil)

// New returns a link for the transport cfg describes.
func New(cfg Config) *Link {
	m := cfg.Metrics
	if m == nil {
		m = metrics.New()
	}
	return &Link{
		name:      cfg.Name,
		instance:  cfg.Instance,
		tr:        cfg.Transport,
		endpoints: cfg.Endpoints,
		access:    cfg.Access,
		metrics:   m,
		log:       cfg.Log.With().Str("plugin", cfg.Name).Str("instance", cfg.Instance).Logger(),
		notify:    make(chan struct{}, 1),
		conns:     make(map[uint64]Conn),
		who:       make(map[uint64]string),
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
	if l.access != nil && l.access.Book != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.sweep(ctx)
		}()
	}
	err := l.tr.Link(ctx, l.handle)
	cancel()
	wg.Wait()
	l.pages.Wait()

	l.mu.Lock()
	l.ended = true
	conns := l.conns
	l.conns = make(map[uint64]Conn)
	clear(l.who)
	l.out, l.outBytes = nil, 0
	l.releaseLocked(l.queued)
	l.checkDrainedLocked()
	l.mu.Unlock()
	for _, c := range conns {
		c.OnClosed()
	}
	l.metrics.Connections.Sub(float64(len(conns)))
	return err
}

// Send implements Sender: queue cmd for the plugin, never blocking.
// A frame over contract.MaxFrameData closes its connection with 1013
// instead: it cannot cross to the plugin.
func (l *Link) Send(cmd contract.Command) {
	if cmd.Kind == contract.CommandSend && len(cmd.Data) > contract.MaxFrameData {
		l.log.Warn().Uint64("conn", cmd.Conn).Int("bytes", len(cmd.Data)).Msg("frame too large for the transport; closing its connection")
		cmd = contract.Command{Kind: contract.CommandClose, Conn: cmd.Conn, Code: wire.CloseTryAgainLater, Reason: "message too large"}
	}
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return
	}
	l.out = append(l.out, cmd)
	l.outBytes += len(cmd.Data)
	l.queued += cmdSize(cmd)
	l.mu.Unlock()
	if !l.handling.Load() { // otherwise queued before the handler flushes
		l.wake()
	}
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
// before WaitRoom waits: a few batches, enough to keep the plugin busy.
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

// WaitRoom implements FlowSender: it waits while more than linkHighWater
// bytes are queued for the transport, at most d. It reports false when d
// passed first; ctx done or the link ending count as room.
func (l *Link) WaitRoom(ctx context.Context, d time.Duration) bool {
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
	l.handling.Store(true)
	defer func() {
		// Cleared before the flush: a Send that saw it set had queued
		// its command already, so this flush (or sendLoop) sends it.
		l.handling.Store(false)
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
				c.OnFrame(ev.Data, ev.Binary)
			}
		case contract.EventClosed:
			l.mu.Lock()
			c := l.conns[ev.Conn]
			delete(l.conns, ev.Conn)
			delete(l.who, ev.Conn)
			l.checkDrainedLocked()
			l.mu.Unlock()
			if c != nil {
				l.metrics.Connections.Dec()
				l.log.Debug().Uint64("conn", ev.Conn).Int("code", ev.Code).Msg("connection closed")
				c.OnClosed()
			}
		}
	}
	return nil
}

// opened decides access and routes a new connection to its endpoint.
func (l *Link) opened(ev *contract.Event) {
	if ev.Page {
		l.page(ev)
		return
	}
	tid := contract.TransportID{Instance: l.instance, Conn: ev.Conn}
	d := l.access.Decide(*ev)
	ep := l.endpoints[ev.Path]
	if d.Code == 0 && ep == nil {
		d.Code, d.Reason = wire.CloseNotFound, refuseReason(wire.CloseNotFound)
	}
	if d.Code != 0 {
		l.metrics.Refused.WithLabelValues(strconv.Itoa(d.Code)).Inc()
		l.log.Debug().Str("transport_id", tid.String()).Str("path", ev.Path).Str("remote", ev.Remote).Int("code", d.Code).Msg("connection refused")
		l.Send(contract.Command{Kind: contract.CommandClose, Conn: ev.Conn, Code: d.Code, Reason: d.Reason})
		return
	}
	l.mu.Lock()
	draining, dcode, dreason := l.draining, l.drainCode, l.drainReason
	l.mu.Unlock()
	if draining {
		l.Send(contract.Command{Kind: contract.CommandClose, Conn: ev.Conn, Code: dcode, Reason: dreason})
		return
	}
	var out FlowSender = l
	if d.Via == access.ViaProxy {
		out = &proxyBound{FlowSender: l, conn: ev.Conn, header: l.access.Proxy.Binding()}
	}
	c := ep.Open(Opening{ID: tid, Transport: l.name, Event: ev, Out: out, Who: d.Who})
	if c == nil {
		return // the endpoint refused it (and said why)
	}
	l.mu.Lock()
	l.conns[ev.Conn] = c
	if d.Who.Credential != "" {
		l.who[ev.Conn] = d.Who.Credential
	}
	l.mu.Unlock()
	l.metrics.Connections.Inc()
}

// proxyBound is the Out of a connection a reverse proxy's user header
// admitted: its Admit carries the proxy's binding (access.Proxy.Binding),
// so that a transport whose connection spans several requests holds
// each later one to that user, not only to its credential (none).
type proxyBound struct {
	FlowSender
	conn   uint64
	header map[string][]string
}

// Send implements Sender.
func (b *proxyBound) Send(cmd contract.Command) {
	if cmd.Kind == contract.CommandAdmit && cmd.Conn == b.conn && cmd.Header == nil {
		cmd.Header = b.header
	}
	b.FlowSender.Send(cmd)
}

// sweep closes, within a second of a revocation or an expiry, every
// connection opened with a credential that is no longer valid: 4401
// with the reason. It wakes at each change of the book and at its next
// expiry.
func (l *Link) sweep(ctx context.Context) {
	book := l.access.Book
	for {
		changed := book.Changed()
		var expiry <-chan time.Time
		var t *time.Timer
		if next := book.NextExpiry(); !next.IsZero() {
			t = time.NewTimer(time.Until(next) + 10*time.Millisecond)
			expiry = t.C
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-expiry:
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		l.cut(book)
	}
}

// cut closes the connections whose credential book no longer accepts.
func (l *Link) cut(book *access.Book) {
	type gone struct {
		conn   uint64
		reason string
	}
	var cut []gone
	l.mu.Lock()
	for conn, id := range l.who {
		err := book.Check(id)
		if err == nil {
			continue
		}
		reason := access.ReasonRevoked
		if errors.Is(err, access.ErrCredentialExpired) {
			reason = access.ReasonExpired
		}
		cut = append(cut, gone{conn, reason})
		delete(l.who, conn) // closed once; the transport reports it closed
	}
	l.mu.Unlock()
	for _, g := range cut {
		l.log.Info().Uint64("conn", g.conn).Str("reason", g.reason).Msg("closing a connection whose credential is no longer valid")
		l.Send(contract.Command{Kind: contract.CommandClose, Conn: g.conn, Code: wire.CloseUnauthorized, Reason: g.reason})
	}
}

// pageSignInTimeout bounds storing a page sign-in.
const pageSignInTimeout = 5 * time.Second

// page answers a request for the transport's web page: the same access
// check as an upgrade's decides it, and a browser that signed in with
// ?token= (or still has the old cookie) gets the listener's page cookie,
// made off the event loop since it is a store write.
func (l *Link) page(ev *contract.Event) {
	d := l.access.Decide(*ev)
	if d.Code != 0 {
		l.metrics.Refused.WithLabelValues(strconv.Itoa(d.Code)).Inc()
		reason := d.Reason
		if d.Code == wire.CloseUnauthorized && !d.Given {
			reason = access.ReasonNoCredential
		}
		l.log.Debug().Str("remote", ev.Remote).Int("code", d.Code).Str("reason", reason).Msg("page refused")
		l.Send(contract.Command{Kind: contract.CommandClose, Conn: ev.Conn, Code: d.Code, Reason: reason})
		return
	}
	if !l.access.NeedsCookie(*ev, d) {
		l.Send(contract.Command{Kind: contract.CommandAdmit, Conn: ev.Conn})
		return
	}
	conn := ev.Conn
	evCopy := *ev
	l.pages.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), pageSignInTimeout)
		defer cancel()
		hdr, err := l.access.PageCookies(ctx, evCopy, d)
		if err != nil {
			l.log.Warn().Err(err).Msg("a page sign-in could not be stored; the page is refused (503)")
			l.Send(contract.Command{Kind: contract.CommandClose, Conn: conn, Code: wire.CloseTryAgainLater, Reason: "sign-in unavailable"})
			return
		}
		l.Send(contract.Command{Kind: contract.CommandAdmit, Conn: conn, Header: hdr})
	})
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
		l.Send(contract.Command{Kind: contract.CommandClose, Conn: id, Code: code, Reason: reason})
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
	case wire.CloseUnauthorized:
		return "unauthorized"
	case wire.CloseForbidden:
		return "forbidden host or origin"
	case wire.CloseNotLoopback:
		return "loopback only"
	case wire.CloseNotFound:
		return "endpoint switched off"
	}
	return ""
}

// ConnCount is the number of connections the link has admitted and not
// yet seen closed.
func (l *Link) ConnCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}
