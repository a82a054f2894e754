package transportkit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// Defaults of a Stream for zero StartRequest fields.
const (
	DefaultPeerTimeout = 60 * time.Second
	DefaultMaxMessage  = 1 << 20
	DefaultSendQueue   = 8 << 20
)

// closeGrace bounds a close the Stream starts itself (a limit, a refused
// handshake) and every close at Stop.
const closeGrace = time.Second

// readBuffer is the size of each connection's read buffer.
const readBuffer = 64 << 10

// Message is one data message of a connection.
type Message struct {
	Binary bool
	Data   []byte
}

// CloseError is a close of a connection with a code, as a Protocol
// reports it. Returned by Protocol.Open, Protocol.ReadMessage or
// Protocol.AppendMessage, it makes the Stream close the connection with
// Code and Reason: it drops what is queued for the peer, writes the close
// (Protocol.AppendClose) unless Peer is set, and reports Code in the
// Closed event.
type CloseError struct {
	Code   int
	Reason string
	// Peer marks a close the peer sent (ReadMessage): the Stream reports
	// it and sends no close of its own.
	Peer bool
}

// Error says "close CODE REASON", or "peer close CODE REASON".
func (e *CloseError) Error() string {
	who := "close"
	if e.Peer {
		who = "peer close"
	}
	if e.Reason == "" {
		return who + " " + strconv.Itoa(e.Code)
	}
	return who + " " + strconv.Itoa(e.Code) + " " + e.Reason
}

// Protocol is the wire format of a Stream's connections. The Stream calls
// Listen once, from Start; the other methods are called concurrently for
// different connections, never concurrently for one.
type Protocol interface {
	// Listen binds the listener of req.Listen and returns it with the
	// address Start reports (the host compares it with each connection's
	// Host, and passes it back as Listen to a restarted plugin).
	Listen(ctx context.Context, req contract.StartRequest) (ln net.Listener, addr string, err error)
	// Open reads the opening of a new connection from r (a handshake, if
	// the format has one; within the peer timeout, the read deadline
	// set on nc) and returns its Opened event: Path, Query, Header and,
	// if it knows better than the Stream, Remote and Host. The Stream
	// sets Kind and Conn, Remote to nc's remote address (or its network,
	// "unix", when it has none) and Host to the address Listen returned.
	// An error drops the connection unreported; a *CloseError is written
	// to the peer first.
	Open(nc net.Conn, r *bufio.Reader) (contract.Event, error)
	// ReadMessage reads the next message from r, of at most max bytes
	// of payload. Its Data must be its own (the Stream queues it). It
	// returns a *CloseError to close the connection (1009 for a message
	// over max, 1007 for text that is not UTF-8), one with Peer set for
	// a close the peer sent, and any other error when the connection
	// ended without one (reported as 1006).
	ReadMessage(r *bufio.Reader, max int64) (Message, error)
	// AppendMessage appends the wire form of m to b; it must not keep
	// m.Data. A *CloseError (a message the format cannot carry) closes
	// the connection instead.
	AppendMessage(b []byte, m Message) ([]byte, error)
	// AppendClose appends the wire form of a close with code and reason,
	// the last thing the Stream writes on a connection.
	AppendClose(b []byte, code int, reason string) []byte
}

// StreamConfig configures a Stream.
type StreamConfig struct {
	// Protocol is the wire format; required.
	Protocol Protocol
	// Version is the transport's version, reported by Start.
	Version string
	// Log receives the Stream's lines: connections opened and closed
	// (debug), Start and Stop (info).
	Log zerolog.Logger
	// EventBuffer bounds the events queued for the link (see Queue; 0:
	// DefaultEventBuffer).
	EventBuffer int64
}

// Stream is a contract.Transport for connections over a stream listener
// (a Unix socket, TCP) in a wire format of its own: its Protocol reads
// and writes messages, the Stream does everything else the contract asks
// of a transport.
//
// Every accepted connection is opened (Protocol.Open, within
// PeerTimeout, else dropped unreported) and reported Opened with the
// next connection id (1, 2, …; never reused). Nothing more is read from
// it until the host admits it; one neither admitted nor closed within
// PeerTimeout is closed with 1013 ("admit timeout"). After admission
// every message is a Frame, pushed with back-pressure (see Queue).
//
// Exec never blocks: a message is encoded (Protocol.AppendMessage) into
// the connection's queue, and a connection whose queued bytes would
// exceed SendQueue is closed with 1013 ("send queue full") instead. One
// writer goroutine per connection writes what is queued, each write
// within PeerTimeout. A close by the host is written after everything
// queued before it; a close for a limit replaces what is queued. Exactly
// one Closed ends every opened connection, with the first close code of
// the connection: the one the Stream sent, else the peer's, else 1006.
//
// Stop closes the listener, drops connections not yet opened, and closes
// every connection with StopRequest.Code (1001 if zero) after what is
// queued, all within a second (or ctx, if sooner); then Link delivers the
// last Closed events and returns. There is no ping: PingInterval is not
// used.
type Stream struct {
	proto   Protocol
	version string
	events  *Queue
	wg      sync.WaitGroup // the accept loop and every connection's goroutines
	stopCh  chan struct{}  // closed by Stop: ends the accept loop's pauses

	mu      sync.Mutex // guards the fields below
	log     zerolog.Logger
	started bool
	stopped bool
	ln      net.Listener
	addr    string
	cfg     streamConfig
	conns   map[uint64]*conn
	opening map[net.Conn]struct{} // accepted, not yet opened
	lastID  uint64
}

var (
	_ contract.Transport     = (*Stream)(nil)
	_ contract.StatsReporter = (*Stream)(nil)
)

// streamConfig is a started Stream's settings.
type streamConfig struct {
	peerTimeout time.Duration
	maxMessage  int64
	sendQueue   int64
}

// NewStream returns an unstarted Stream.
func NewStream(cfg StreamConfig) *Stream {
	return &Stream{
		proto:   cfg.Protocol,
		version: cfg.Version,
		events:  NewQueue(cfg.EventBuffer),
		stopCh:  make(chan struct{}),
		log:     cfg.Log,
		conns:   make(map[uint64]*conn),
		opening: make(map[net.Conn]struct{}),
	}
}

// Start implements contract.Transport: it listens (Protocol.Listen) and
// accepts connections. Zero fields of req take the package defaults.
func (s *Stream) Start(ctx context.Context, req contract.StartRequest) (contract.StartResponse, error) {
	if req.PeerTimeout < 0 || req.MaxMessage < 0 || req.SendQueue < 0 {
		return contract.StartResponse{}, fmt.Errorf("start: negative setting: %w", contract.ErrInvalidArgument)
	}
	cfg := streamConfig{
		peerTimeout: orDefault(req.PeerTimeout, DefaultPeerTimeout),
		maxMessage:  orDefault(req.MaxMessage, DefaultMaxMessage),
		sendQueue:   orDefault(req.SendQueue, DefaultSendQueue),
	}
	s.mu.Lock()
	switch {
	case s.stopped:
		s.mu.Unlock()
		return contract.StartResponse{}, fmt.Errorf("start: %w", contract.ErrStopped)
	case s.started:
		s.mu.Unlock()
		return contract.StartResponse{}, fmt.Errorf("start: already started: %w", contract.ErrInvalidArgument)
	}
	s.started = true
	s.mu.Unlock()

	ln, addr, err := s.proto.Listen(ctx, req)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil:
		s.started = false
		return contract.StartResponse{}, fmt.Errorf("start: %w", err)
	case s.stopped:
		ln.Close()
		return contract.StartResponse{}, fmt.Errorf("start: %w", contract.ErrStopped)
	}
	if req.Instance != "" {
		s.log = s.log.With().Str("instance", req.Instance).Logger()
	}
	s.ln, s.addr, s.cfg = ln, addr, cfg
	s.wg.Add(1)
	go s.accept(ln)
	s.log.Info().Str("addr", addr).Msg("transport listening")
	return contract.StartResponse{Addr: addr, Version: s.version}, nil
}

func orDefault[T time.Duration | int64](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// Stats implements contract.StatsReporter: the connections open now,
// from their accept until they are reported Closed (or dropped before
// they opened). A Stream refuses none: Refused503 is 0.
func (s *Stream) Stats(context.Context) (contract.TransportStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return contract.TransportStats{}, fmt.Errorf("stats: %w", contract.ErrNotStarted)
	}
	return contract.TransportStats{Connections: int64(len(s.opening) + len(s.conns))}, nil
}

// Link implements contract.Transport (see Queue.Link).
func (s *Stream) Link(ctx context.Context, sink contract.EventSink) error {
	return s.events.Link(ctx, sink)
}

// Exec implements contract.Transport. It never blocks on a peer;
// commands for unknown or closed connections are ignored.
func (s *Stream) Exec(_ context.Context, cmds []contract.Command) error {
	for i := range cmds {
		cmd := &cmds[i]
		s.mu.Lock()
		c := s.conns[cmd.Conn]
		s.mu.Unlock()
		if c == nil {
			continue
		}
		switch cmd.Kind {
		case contract.CommandAdmit:
			c.admit()
		case contract.CommandSend:
			p, err := s.proto.AppendMessage(nil, Message{Binary: cmd.Binary, Data: cmd.Data})
			if err != nil {
				ce := asClose(err, wire.CloseInternalError)
				c.close(ce.Code, ce.Reason, false, true, time.Now().Add(closeGrace))
				continue
			}
			c.send(p)
		case contract.CommandClose:
			code := cmd.Code
			if code == 0 {
				code = wire.CloseNormal
			}
			c.close(code, cmd.Reason, true, true, time.Time{})
		default:
			c.log.Warn().Stringer("kind", cmd.Kind).Msg("unknown command ignored")
		}
	}
	return nil
}

// asClose returns err's *CloseError, or one with code and err's text.
func asClose(err error, code int) *CloseError {
	var ce *CloseError
	if errors.As(err, &ce) {
		return ce
	}
	return &CloseError{Code: code, Reason: err.Error()}
}

// Stop implements contract.Transport (see Stream and Queue.Stop).
func (s *Stream) Stop(ctx context.Context, req contract.StopRequest) error {
	return s.events.Stop(ctx, func(ctx context.Context) { s.stop(ctx, req) })
}

// stop closes the listener and every connection and waits for their
// goroutines, which have pushed every Closed when they return.
func (s *Stream) stop(ctx context.Context, req contract.StopRequest) {
	s.mu.Lock()
	s.stopped = true
	close(s.stopCh)
	ln, log := s.ln, s.log
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	for nc := range s.opening {
		nc.Close()
	}
	s.mu.Unlock()

	if ln != nil {
		ln.Close()
	}
	code := req.Code
	if code == 0 {
		code = wire.CloseGoingAway
	}
	by := time.Now().Add(closeGrace)
	if d, ok := ctx.Deadline(); ok && d.Before(by) {
		by = d
	}
	for _, c := range conns {
		c.close(code, req.Reason, true, true, by)
	}
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		for _, c := range conns {
			c.nc.Close()
		}
		<-done
	}
	log.Info().Int("conns", len(conns)).Msg("transport stopped")
}

// accept accepts connections until the listener is closed. After any
// other error it tries again, after a pause that doubles from 5 ms up to
// a second, so that it never spins (out of file descriptors, say).
func (s *Stream) accept(ln net.Listener) {
	defer s.wg.Done()
	var pause time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			s.mu.Lock()
			s.log.Warn().Err(err).Dur("retry_in", pause).Msg("accept")
			s.mu.Unlock()
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-s.stopCh:
				t.Stop()
			}
			continue
		}
		pause = 0
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			nc.Close()
			continue
		}
		s.opening[nc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.open(nc)
	}
}

// open reads the opening of nc, reports it and runs it.
func (s *Stream) open(nc net.Conn) {
	defer s.wg.Done()
	s.mu.Lock()
	cfg, addr := s.cfg, s.addr
	s.mu.Unlock()
	_ = nc.SetReadDeadline(time.Now().Add(cfg.peerTimeout))
	br := bufio.NewReaderSize(nc, readBuffer)
	ev, err := s.proto.Open(nc, br)
	var ce *CloseError
	if errors.As(err, &ce) && !ce.Peer {
		_ = nc.SetWriteDeadline(time.Now().Add(closeGrace))
		_, _ = nc.Write(s.proto.AppendClose(nil, ce.Code, ce.Reason))
	}
	_ = nc.SetReadDeadline(time.Time{})

	s.mu.Lock()
	delete(s.opening, nc)
	if err != nil || s.stopped {
		log := s.log
		s.mu.Unlock()
		log.Debug().AnErr("err", err).Msg("connection dropped before it opened")
		nc.Close()
		return
	}
	s.lastID++
	ev.Kind, ev.Conn = contract.EventOpened, s.lastID
	if ev.Remote == "" {
		if ev.Remote = nc.RemoteAddr().String(); ev.Remote == "" || ev.Remote == "@" {
			ev.Remote = nc.RemoteAddr().Network()
		}
	}
	if ev.Host == "" {
		ev.Host = addr
	}
	c := &conn{
		s:          s,
		id:         ev.Conn,
		nc:         nc,
		cfg:        cfg,
		log:        s.log.With().Uint64("conn", ev.Conn).Logger(),
		admitCh:    make(chan struct{}),
		closingCh:  make(chan struct{}),
		wake:       make(chan struct{}, 1),
		writerDone: make(chan struct{}),
	}
	s.conns[c.id] = c
	s.events.Push(ev)
	s.wg.Add(1) // the writer
	s.mu.Unlock()
	c.log.Debug().Str("path", ev.Path).Str("remote", ev.Remote).Msg("opened")

	go c.writeLoop()
	c.run(br)
}

// closed removes c and reports its end; called once per connection.
func (s *Stream) closed(c *conn, code int, reason string) {
	s.mu.Lock()
	delete(s.conns, c.id)
	s.events.Push(contract.Event{Kind: contract.EventClosed, Conn: c.id, Code: code, Reason: reason})
	s.mu.Unlock()
	c.log.Debug().Int("code", code).Str("reason", reason).Msg("closed")
}

// conn is one opened connection. Its run goroutine waits for admission,
// reads messages and reports Closed; its writer goroutine writes what is
// queued and the close, and closes the socket when it is done.
type conn struct {
	s          *Stream
	id         uint64
	nc         net.Conn
	cfg        streamConfig
	log        zerolog.Logger
	admitCh    chan struct{} // closed on admission
	closingCh  chan struct{} // closed once closing
	wake       chan struct{} // wakes the writer; capacity 1
	writerDone chan struct{} // closed when the writer has closed the socket

	mu        sync.Mutex // guards the fields below
	admitted  bool
	closing   bool
	sendClose bool // write a close once the queue is written
	code      int
	reason    string
	closeBy   time.Time // zero, or the deadline of the close
	queue     [][]byte
	queued    int64 // bytes in queue plus the batch being written
}

func (c *conn) admit() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.admitted || c.closing {
		return
	}
	c.admitted = true
	close(c.admitCh)
}

// wantsFrames reports whether messages read now are for the host.
func (c *conn) wantsFrames() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.closing
}

// send queues p, or closes c with 1013 when the queue is full.
func (c *conn) send(p []byte) {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	if c.queued+int64(len(p)) > c.cfg.sendQueue {
		c.mu.Unlock()
		c.log.Debug().Msg("send queue full")
		c.close(wire.CloseTryAgainLater, "send queue full", false, true, time.Now().Add(closeGrace))
		return
	}
	c.queue = append(c.queue, p)
	c.queued += int64(len(p))
	c.mu.Unlock()
	c.wakeWriter()
}

// close starts closing c with code and reason, the first close winning:
// after what is queued when flush, else instead of it; writing a close
// when write; by the deadline by unless it is zero (a later close can
// only make it sooner).
func (c *conn) close(code int, reason string, flush, write bool, by time.Time) {
	c.mu.Lock()
	if !by.IsZero() && (c.closeBy.IsZero() || by.Before(c.closeBy)) {
		c.closeBy = by
		_ = c.nc.SetDeadline(by)
	}
	if c.closing {
		c.mu.Unlock()
		return
	}
	c.closing, c.sendClose = true, write
	c.code, c.reason = code, reason
	if !flush {
		c.queue = nil
	}
	close(c.closingCh)
	c.mu.Unlock()
	c.s.events.Wake() // a reader waiting for room drops its frame
	c.wakeWriter()
}

func (c *conn) wakeWriter() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run waits for admission, then reads messages until the connection
// ends, waits for the writer and reports Closed.
func (c *conn) run(br *bufio.Reader) {
	timer := time.NewTimer(c.cfg.peerTimeout)
	select {
	case <-c.admitCh:
		timer.Stop()
		c.read(br)
	case <-c.closingCh:
		timer.Stop()
	case <-timer.C:
		c.close(wire.CloseTryAgainLater, "admit timeout", false, true, time.Now().Add(closeGrace))
	}
	<-c.writerDone
	c.mu.Lock()
	code, reason := c.code, c.reason
	c.mu.Unlock()
	c.s.closed(c, code, reason)
}

// read turns messages into Frames until the connection ends or closes.
func (c *conn) read(br *bufio.Reader) {
	for {
		m, err := c.s.proto.ReadMessage(br, c.cfg.maxMessage)
		if err != nil {
			var ce *CloseError
			switch {
			case errors.As(err, &ce) && ce.Peer:
				c.close(ce.Code, ce.Reason, false, false, time.Time{})
			case ce != nil:
				c.close(ce.Code, ce.Reason, false, true, time.Now().Add(closeGrace))
			default:
				// The peer is gone (or the writer closed the socket).
				c.close(wire.CloseAbnormal, "", false, false, time.Time{})
			}
			return
		}
		c.s.events.PushFrame(contract.Event{Kind: contract.EventFrame, Conn: c.id, Binary: m.Binary, Data: m.Data}, c.wantsFrames)
	}
}

// writeLoop writes what is queued, then the close, and closes the socket.
func (c *conn) writeLoop() {
	defer c.s.wg.Done()
	defer close(c.writerDone)
	defer c.nc.Close()
	var bufs net.Buffers
	for {
		c.mu.Lock()
		for len(c.queue) == 0 && !c.closing {
			c.mu.Unlock()
			<-c.wake
			c.mu.Lock()
		}
		batch := c.queue
		c.queue = nil
		closing, write := c.closing, c.sendClose
		code, reason := c.code, c.reason
		c.mu.Unlock()

		if len(batch) > 0 {
			bufs = append(bufs[:0], batch...)
			err := c.write(&bufs)
			c.mu.Lock()
			for _, p := range batch {
				c.queued -= int64(len(p))
			}
			c.mu.Unlock()
			if err != nil {
				c.log.Debug().Err(err).Msg("write failed")
				c.close(wire.CloseAbnormal, "", false, false, time.Time{})
				return
			}
			continue
		}
		if closing {
			if write {
				b := net.Buffers{c.s.proto.AppendClose(nil, code, reason)}
				_ = c.write(&b)
			}
			return
		}
	}
}

// write writes bufs within the peer timeout, or by the close deadline if
// that is earlier.
func (c *conn) write(bufs *net.Buffers) error {
	d := time.Now().Add(c.cfg.peerTimeout)
	c.mu.Lock()
	if !c.closeBy.IsZero() && c.closeBy.Before(d) {
		d = c.closeBy
	}
	_ = c.nc.SetWriteDeadline(d)
	c.mu.Unlock()
	_, err := bufs.WriteTo(c.nc)
	return err
}
