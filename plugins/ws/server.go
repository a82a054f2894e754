package ws

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gobwas/ws"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/contract/transportkit"
	"github.com/tether-agent/tether/wire"
)

// Version is the version of this transport, reported by Start.
const Version = "0.1.0"

// Defaults for zero StartRequest fields (see the protocol's limits).
const (
	DefaultPingInterval   = 20 * time.Second
	DefaultPeerTimeout    = 60 * time.Second
	DefaultMaxMessage     = 1 << 20
	DefaultSendQueue      = 8 << 20
	DefaultEventBuffer    = transportkit.DefaultEventBuffer
	DefaultMaxConnections = 20000
	DefaultHeaderTimeout  = 10 * time.Second
	// DefaultACPMaxMessage is the largest message an /acp socket takes:
	// a prompt may carry 16 MiB of content blocks (an image, a file), so
	// the host answers one over that with -32602 rather than the socket
	// closing with 1009; the extra MiB is the JSON around the blocks.
	DefaultACPMaxMessage = 17 << 20
)

// maxCloseGrace bounds how long a close handshake may take once started.
const maxCloseGrace = time.Second

// maxSlowCloseGrace bounds the close handshake of a connection cut for
// being too slow (1013): its close frame waits behind what the kernel
// already holds for it (megabytes), which a slow reader takes longer than
// maxCloseGrace to read. A shutdown still ends it within closeGrace.
const maxSlowCloseGrace = 10 * time.Second

// maxLingerIdle bounds how long a connection's reader goroutine waits for
// the peer's next message before a smaller waiter goroutine takes over.
const maxLingerIdle = time.Second

// config is the settings of a started Server; constant after Start.
type config struct {
	pingInterval  time.Duration
	peerTimeout   time.Duration
	closeGrace    time.Duration
	slowGrace     time.Duration // the close handshake of a 1013 "send queue full"
	lingerIdle    time.Duration // how long a reader waits for the next message before a waiter takes over
	maxMessage    int64
	acpMaxMessage int64 // /acp's maxMessage (Server.ACPMaxMessage)
	sendQueue     int64
	maxConns      int64 // as asked; the listener applies it lowered to the fd limit
	headerTO      time.Duration
	refuseGrace   time.Duration
	certFile      string // with keyFile: serve TLS
	keyFile       string
	pageAuth      bool // the host decides page requests
}

// Server is the WebSocket transport. The zero value is not usable; call New.
type Server struct {
	// Static, if set before Start, serves every path other than /healthz,
	// /api/ws, /api/pty and /acp. When nil those paths answer 404.
	Static http.Handler
	// EventBuffer, if set before Start, bounds the bytes of message payload
	// queued for the link; see the package doc. Zero means 16 MiB.
	EventBuffer int64
	// ACPMaxMessage, if set before Start, is the largest message an /acp
	// socket takes (zero: DefaultACPMaxMessage; never below the
	// StartRequest's MaxMessage). Its send queue holds one such message
	// beyond the StartRequest's SendQueue.
	ACPMaxMessage int64
	// PageAnswerTimeout, if set before Start, bounds the wait for the
	// host's answer to a page request (PageAuth); past it the page gets
	// HTTP 503. Zero means 10 s.
	PageAnswerTimeout time.Duration
	// SSEKeepAlive, if set before Start, is how often an idle SSE stream
	// of /acp over HTTP gets a comment. Zero means 15 s.
	SSEKeepAlive time.Duration

	certCheckEvery time.Duration // how often a handshake looks for a renewed certificate

	log    zerolog.Logger
	events *transportkit.Queue // Link, and the end of Stop
	wg     sync.WaitGroup
	hwg    sync.WaitGroup // upgrade handlers in flight

	rawUpgrades atomic.Int64 // upgrades made on the raw connection (tests)

	mu       sync.Mutex // guards the fields below
	cfg      *config
	started  bool
	stopped  bool
	stopCh   chan struct{} // closed by Stop: ends the ticker
	hs       *http.Server
	ln       net.Listener
	split    *splitListener // what hs serves: ln, with the upgrades of /api/* and /acp taken out
	served   chan struct{}  // closed when the HTTP server's accept loop returned
	conns    map[uint64]*conn
	pages    map[uint64]chan contract.Command // page requests waiting for the host's answer
	lastID   uint64
	stopCode int // the code of a Stop under way, for upgrades that lose the race
	stopMsg  string
	lim      *limitListener
	acp      acpHTTP // /acp over Streamable HTTP

	csMu  sync.Mutex            // guards the fields below
	busy  map[net.Conn]struct{} // HTTP connections between accept and their response or upgrade
	quiet chan struct{}         // non-nil while Stop waits for busy to empty
}

var (
	_ contract.Transport     = (*Server)(nil)
	_ contract.OwnedExecer   = (*Server)(nil)
	_ contract.StatsReporter = (*Server)(nil)
)

// New returns an unstarted Server that logs to log.
func New(log zerolog.Logger) *Server {
	return &Server{
		log:    log,
		events: transportkit.NewQueue(DefaultEventBuffer),
		conns:  make(map[uint64]*conn),
		pages:  make(map[uint64]chan contract.Command),
		stopCh: make(chan struct{}),
		busy:   make(map[net.Conn]struct{}),

		certCheckEvery: certCheckEvery,
	}
}

// Start implements contract.Transport: it binds req.Listen and serves HTTP
// on it. Zero fields of req take the package defaults.
func (s *Server) Start(ctx context.Context, req contract.StartRequest) (contract.StartResponse, error) {
	cfg, err := newConfig(req)
	if err != nil {
		return contract.StartResponse{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg.acpMaxMessage = max(orDefault(s.ACPMaxMessage, DefaultACPMaxMessage), cfg.maxMessage)
	switch {
	case s.stopped:
		return contract.StartResponse{}, fmt.Errorf("start: %w", contract.ErrStopped)
	case s.started:
		return contract.StartResponse{}, fmt.Errorf("start: already started: %w", contract.ErrInvalidArgument)
	}
	if req.Instance != "" {
		s.log = s.log.With().Str("instance", req.Instance).Logger()
	}
	var certs *certSource
	if cfg.certFile != "" {
		if certs, err = newCertSource(cfg.certFile, cfg.keyFile, s.certCheckEvery, s.log); err != nil {
			return contract.StartResponse{}, err
		}
	}
	inner, err := listen(ctx, req.Listen)
	if err != nil {
		return contract.StartResponse{}, fmt.Errorf("start: %w", err)
	}
	maxConns, fdLimit := connLimit(cfg.maxConns)
	if maxConns < cfg.maxConns {
		s.log.Debug().Int64("asked", cfg.maxConns).Int64("applied", maxConns).Uint64("fd_limit", fdLimit).
			Msgf("open connections are bounded at %d, not the %d asked, to stay under this process's limit of %d open files (raise it with ulimit -n, or LimitNOFILE= under systemd)", maxConns, cfg.maxConns, fdLimit)
	}
	var tlsCfg *tls.Config
	if certs != nil {
		tlsCfg = certs.tlsConfig()
	}
	lim := newLimitListener(s, inner, maxConns, fdLimit, tlsCfg, cfg.refuseGrace)
	var ln net.Listener = lim
	if tlsCfg != nil {
		ln = tls.NewListener(lim, tlsCfg)
	}
	if s.EventBuffer > 0 {
		s.events.SetLimit(s.EventBuffer)
	}
	s.cfg = cfg
	s.started = true
	s.ln = ln
	s.lim = lim
	s.served = make(chan struct{})
	s.hs = &http.Server{
		Handler:   http.HandlerFunc(s.serveHTTP),
		ConnState: s.connState,
		// Also bounds the TLS handshake.
		ReadHeaderTimeout: cfg.headerTO,
		IdleTimeout:       cfg.peerTimeout,
		ErrorLog:          log.New(debugWriter{s.log}, "", 0),
	}
	split := newSplitListener(s, cfg, ln)
	s.split = split
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		defer close(s.served)
		defer lim.closeSpare() // after the last Accept
		err := s.hs.Serve(split)
		_ = split.Close()
		<-split.done // the accept loop made its last Accept
		if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			s.log.Error().Err(err).Msg("http serve")
		}
	}()
	go s.tick(cfg)
	addr := ln.Addr().String()
	s.log.Debug().Str("addr", addr).Int64("max_connections", maxConns).Bool("tls", tlsCfg != nil).
		Bool("page_auth", cfg.pageAuth).Msg("websocket transport listening")
	return contract.StartResponse{Addr: addr, Version: Version, MaxConnections: int(maxConns)}, nil
}

// Stats implements contract.StatsReporter: the connections open now and
// those refused since Start.
func (s *Server) Stats(context.Context) (contract.TransportStats, error) {
	s.mu.Lock()
	lim := s.lim
	s.mu.Unlock()
	if lim == nil {
		return contract.TransportStats{}, fmt.Errorf("stats: %w", contract.ErrNotStarted)
	}
	return contract.TransportStats{Connections: lim.open.Load(), Refused503: lim.refused.Load()}, nil
}

// listen binds addr, or, for "fd:N", serves the listening socket the
// process inherited as file descriptor N (the host keeps the public
// listener and lends it to every transport process it starts).
func listen(ctx context.Context, addr string) (net.Listener, error) {
	fdText, inherited := strings.CutPrefix(addr, "fd:")
	if !inherited {
		var lc net.ListenConfig
		return lc.Listen(ctx, "tcp", addr)
	}
	fd, err := strconv.Atoi(fdText)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("listen %q: want fd:N with N >= 3: %w", addr, contract.ErrInvalidArgument)
	}
	f := os.NewFile(uintptr(fd), "inherited-listener")
	if f == nil {
		return nil, fmt.Errorf("listen %q: bad file descriptor: %w", addr, contract.ErrInvalidArgument)
	}
	defer f.Close() // FileListener holds a duplicate
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("listen %q: %w", addr, err)
	}
	return ln, nil
}

func newConfig(req contract.StartRequest) (*config, error) {
	cfg := &config{
		pingInterval: orDefault(req.PingInterval, DefaultPingInterval),
		peerTimeout:  orDefault(req.PeerTimeout, DefaultPeerTimeout),
		maxMessage:   orDefault(req.MaxMessage, DefaultMaxMessage),
		sendQueue:    orDefault(req.SendQueue, DefaultSendQueue),
		maxConns:     orDefault(int64(req.MaxConnections), DefaultMaxConnections),
		headerTO:     orDefault(req.HeaderTimeout, DefaultHeaderTimeout),
		certFile:     req.TLSCertFile,
		keyFile:      req.TLSKeyFile,
		pageAuth:     req.PageAuth,
	}
	switch {
	case req.Listen == "":
		return nil, fmt.Errorf("start: empty listen address: %w", contract.ErrInvalidArgument)
	case cfg.pingInterval < 0, cfg.peerTimeout < 0, cfg.maxMessage < 0, cfg.sendQueue < 0,
		cfg.maxConns < 0, cfg.headerTO < 0:
		return nil, fmt.Errorf("start: negative setting: %w", contract.ErrInvalidArgument)
	case cfg.peerTimeout <= cfg.pingInterval:
		return nil, fmt.Errorf("start: peer timeout %v not above ping interval %v: %w",
			cfg.peerTimeout, cfg.pingInterval, contract.ErrInvalidArgument)
	case (cfg.certFile == "") != (cfg.keyFile == ""):
		return nil, fmt.Errorf("start: a TLS certificate file needs a key file and the other way round: %w", contract.ErrInvalidArgument)
	}
	cfg.closeGrace = min(maxCloseGrace, cfg.peerTimeout)
	cfg.slowGrace = min(maxSlowCloseGrace, cfg.peerTimeout)
	cfg.lingerIdle = min(maxLingerIdle, cfg.peerTimeout/4)
	cfg.refuseGrace = min(maxRefuseGrace, cfg.headerTO)
	return cfg, nil
}

func orDefault[T time.Duration | int64](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// Exec implements contract.Transport. It never blocks on a peer; commands
// for unknown or closed connections are ignored. The data of send
// commands is copied: the caller keeps it.
func (s *Server) Exec(_ context.Context, cmds []contract.Command) error {
	s.exec(cmds, true)
	return nil
}

// ExecOwned implements contract.OwnedExecer: Exec without copying the
// data of send commands, which the queue keeps until it is written.
func (s *Server) ExecOwned(_ context.Context, cmds []contract.Command) error {
	s.exec(cmds, false)
	return nil
}

// exec applies cmds, copying the data of send commands when clone.
func (s *Server) exec(cmds []contract.Command, clone bool) {
	// Sends are queued first and set moving once per connection at the
	// end, so that a burst for one socket goes out in one writev.
	var kick []*conn
	defer func() {
		for _, c := range kick {
			c.kick()
		}
	}()
	for i := range cmds {
		cmd := &cmds[i]
		s.mu.Lock()
		c := s.conns[cmd.Conn]
		hc := s.acp.conns[cmd.Conn]
		if c == nil && hc == nil {
			s.pageAnsweredLocked(cmd)
		}
		s.mu.Unlock()
		if hc != nil {
			hc.exec(cmd, clone)
			continue
		}
		if c == nil {
			continue
		}
		switch cmd.Kind {
		case contract.CommandAdmit:
			c.admit()
		case contract.CommandSend:
			data := cmd.Data
			if clone {
				data = bytes.Clone(data)
			}
			c.send(cmd.Binary, data)
			if len(kick) == 0 || kick[len(kick)-1] != c {
				kick = append(kick, c) // kicking twice is harmless
			}
		case contract.CommandClose:
			c.hostClose(cmd.Code, cmd.Reason)
		default:
			s.log.Warn().Uint64("conn", cmd.Conn).Stringer("kind", cmd.Kind).Msg("unknown command ignored")
		}
	}
}

// Link implements contract.Transport: it delivers the queued events to
// sink (see transportkit.Queue.Link and the package doc, Events).
func (s *Server) Link(ctx context.Context, sink contract.EventSink) error {
	return s.events.Link(ctx, sink)
}

// Stop implements contract.Transport: it closes the listener, then every
// connection with req.Code (default 1001), waits for all of them and, when
// a link is running, for their Closed events to be delivered. It is
// idempotent; later calls wait for the first one.
func (s *Server) Stop(ctx context.Context, req contract.StopRequest) error {
	return s.events.Stop(ctx, func(ctx context.Context) { s.stop(ctx, req) })
}

// stop is the first Stop's own work: when it returns, every connection
// is closed and its Closed event queued.
func (s *Server) stop(ctx context.Context, req contract.StopRequest) {
	s.mu.Lock()
	hs, cfg, ln, served := s.hs, s.cfg, s.ln, s.served
	s.stopCode, s.stopMsg = req.Code, req.Reason
	if s.stopCode == 0 {
		s.stopCode = wire.CloseGoingAway
	}
	stopCode, stopMsg := s.stopCode, s.stopMsg
	s.mu.Unlock()
	s.stopHTTP(stopCode, stopMsg) // their SSE streams would keep the HTTP server busy

	// Hand the listener over first: stop accepting, then let the
	// connections already accepted finish their request (an upgrade
	// opens and is closed below with the stop's code; a plain request
	// is answered), instead of dropping them unanswered. A host that
	// swaps this process for another on the same inherited listening
	// socket then refuses no connection.
	if ln != nil {
		_ = ln.Close()
		<-served // every connection it accepted is tracked by connState now
		s.waitQuiet(ctx, cfg.closeGrace)
		s.split.dropSniffing() // a head that did not come in the grace
	}
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()

	if hs != nil {
		// Plain HTTP requests get the close grace to finish; upgraded
		// connections are not the http.Server's any more.
		sctx, cancel := context.WithTimeout(ctx, cfg.closeGrace)
		if err := hs.Shutdown(sctx); err != nil {
			_ = hs.Close()
		}
		cancel()
	}
	s.hwg.Wait() // upgrades in flight see stopped and give up
	close(s.stopCh)

	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()

	code, reason := req.Code, req.Reason
	if code == 0 {
		code = wire.CloseGoingAway
	}
	if cfg != nil {
		by := time.Now().Add(cfg.closeGrace)
		if d, ok := ctx.Deadline(); ok && d.Before(by) {
			by = d
		}
		for _, c := range conns {
			c.stop(code, reason, by)
		}
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
	s.log.Info().Int("conns", len(conns)).Msg("websocket transport stopped")
}

// serveHTTP routes the public listener.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/healthz":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte("ok"))
	case "/acp":
		if !isUpgrade(r) {
			s.serveACPHTTP(w, r)
			return
		}
		s.upgrade(w, r)
	case "/api/ws", "/api/pty":
		s.upgrade(w, r)
	default:
		if s.Static != nil {
			s.mu.Lock()
			cfg := s.cfg
			s.mu.Unlock()
			s.serveStatic(w, r, cfg)
			return
		}
		http.NotFound(w, r)
	}
}

// upgrade upgrades r, registers the connection and reports it opened.
func (s *Server) upgrade(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	s.hwg.Add(1)
	cfg := s.cfg
	s.mu.Unlock()
	defer s.hwg.Done()

	u := ws.HTTPUpgrader{Timeout: cfg.peerTimeout, Header: acpUpgradeHeader(r)}
	nc, rw, _, err := u.Upgrade(r, w)
	if err != nil {
		s.log.Debug().Err(err).Str("remote", r.RemoteAddr).Msg("upgrade failed")
		if nc != nil {
			nc.Close()
		}
		return
	}
	var prefix []byte
	if n := rw.Reader.Buffered(); n > 0 {
		p, _ := rw.Reader.Peek(n)
		prefix = bytes.Clone(p)
	}
	s.opened(cfg, nc, prefix, contract.Event{
		Kind:   contract.EventOpened,
		Path:   r.URL.Path,
		Query:  r.URL.RawQuery,
		Header: r.Header.Clone(),
		Remote: r.RemoteAddr,
		Host:   r.Host,
	})
}

// opened registers nc, upgraded (prefix: what the peer sent past the
// handshake), and reports it opened with ev.
func (s *Server) opened(cfg *config, nc net.Conn, prefix []byte, ev contract.Event) {
	if rc, ok := nc.(*readConn); ok {
		// Upgraded by net/http after sniff read its head: read the
		// connection itself from here, after what was read ahead.
		var rest []byte
		nc, rest = rc.unwrap()
		prefix = append(prefix, rest...)
	}
	c := &conn{s: s, cfg: cfg, nc: nc, openedAt: time.Now(), maxIn: cfg.maxMessage, maxOut: cfg.sendQueue, prefix: prefix}
	if ev.Path == "/acp" {
		c.maxIn, c.maxOut = cfg.acpMaxMessage, cfg.sendQueue+cfg.acpMaxMessage
	}
	if sc, ok := nc.(syscall.Conn); ok {
		c.raw, _ = sc.SyscallConn()
	}
	s.mu.Lock()
	if s.stopped {
		code, reason := s.stopCode, s.stopMsg
		s.mu.Unlock()
		// Upgraded as Stop closed the others: close it the same way.
		_ = nc.SetWriteDeadline(time.Now().Add(cfg.closeGrace))
		_ = ws.WriteFrame(nc, ws.NewCloseFrame(ws.NewCloseFrameBody(ws.StatusCode(code), reason)))
		nc.Close()
		return
	}
	s.lastID++
	c.id, ev.Conn = s.lastID, s.lastID
	s.conns[c.id] = c
	s.events.Push(ev) // under s.mu: in order with the connection table
	s.mu.Unlock()
	s.log.Debug().Uint64("conn", c.id).Str("path", ev.Path).Str("remote", ev.Remote).Msg("opened")
}

// connState tracks the HTTP connections that are between their accept
// and their response or upgrade.
func (s *Server) connState(c net.Conn, st http.ConnState) {
	s.csMu.Lock()
	defer s.csMu.Unlock()
	if st == http.StateNew || st == http.StateActive {
		s.busy[c] = struct{}{}
		return
	}
	delete(s.busy, c) // idle, hijacked (upgraded) or closed
	if len(s.busy) == 0 && s.quiet != nil {
		close(s.quiet)
		s.quiet = nil
	}
}

// waitQuiet waits, up to d, until no HTTP connection is between its
// accept and its response or upgrade.
func (s *Server) waitQuiet(ctx context.Context, d time.Duration) {
	s.csMu.Lock()
	if len(s.busy) == 0 {
		s.csMu.Unlock()
		return
	}
	quiet := make(chan struct{})
	s.quiet = quiet
	s.csMu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-quiet:
	case <-t.C:
	case <-ctx.Done():
	}
}

// tick pings admitted connections and times out unadmitted ones.
func (s *Server) tick(cfg *config) {
	defer s.wg.Done()
	t := time.NewTicker(cfg.pingInterval)
	defer t.Stop()
	var cs []*conn
	for {
		var now time.Time
		select {
		case <-s.stopCh:
			return
		case now = <-t.C:
		}
		s.mu.Lock()
		for _, c := range s.conns {
			cs = append(cs, c)
		}
		s.mu.Unlock()
		for _, c := range cs {
			c.tick(now)
		}
		s.tickHTTP(now, cfg)
		clear(cs)
		cs = cs[:0]
	}
}

// closed removes c and reports its end. It is called once per connection,
// by its reader goroutine, after the socket is closed.
func (s *Server) closed(c *conn, code int, reason string) {
	s.mu.Lock()
	delete(s.conns, c.id)
	s.events.Push(contract.Event{Kind: contract.EventClosed, Conn: c.id, Code: code, Reason: reason})
	s.mu.Unlock()
	s.log.Debug().Uint64("conn", c.id).Int("code", code).Str("reason", reason).Msg("closed")
}

// debugWriter sends net/http's error log lines to zerolog at debug level.
type debugWriter struct{ log zerolog.Logger }

func (w debugWriter) Write(p []byte) (int, error) {
	w.log.Debug().Str("component", "http").Msg(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}
