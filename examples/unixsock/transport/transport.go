// Package transport is an example third-party tether transport: the
// host's session protocol over a Unix socket, one message per line, so
// that terminal clients can speak JSON-RPC to a tether host without
// WebSocket. It implements contract.Transport; its plugin binary is
// examples/unixsock.
//
// # Listening
//
// StartRequest.Listen "unix:PATH" listens on the socket PATH; any other
// value (the host passes its --listen, "127.0.0.1:7717" by default) listens
// on DefaultPath(). A socket file left behind by a transport that is gone
// is removed; one that still answers fails Start. The socket is made mode
// 0600, so only its owner can connect (the host's token check still
// applies). Start returns the address "unix:PATH"; Stop removes the file.
//
// # Protocol
//
// The client opens with one handshake line, "TETHER" and the raw query
// string the host reads its access token from:
//
//	TETHER token=0123abcd
//
// The connection is then reported Opened with Path "/api/ws", that Query,
// Remote "unix", Host the address Start returned (the host compares it
// with that address) and no headers. Nothing after the handshake is read
// before the host admits the connection.
//
// After that, each line is one text message, both ways (a trailing "\r"
// is dropped, a line may be empty): a line from the client is a Frame, a
// host Send is written as a line. A line over MaxMessage closes the
// connection with 1009, one that is not UTF-8 with 1007. Binary messages
// and text containing a line break cannot be sent: a host Send of one
// closes the connection with 1003.
//
// A close is a last line {"close":CODE,"reason":"..."} (a line that starts
// with {"close": and has no other fields than close and reason), then the
// end of the connection. The server writes it after every queued line
// when the host closes the connection, when its send queue overflows
// (1013) or when the transport stops; a client may send one too, and its
// code is reported. A connection that ends without a close line is
// reported with 1006.
//
// # Limits
//
// A connection neither admitted nor closed within PeerTimeout is closed
// with 1013 ("admit timeout"); so is one whose handshake line takes longer
// (without an event: it was never opened). Exec never blocks: a
// connection whose queued lines exceed SendQueue bytes is closed with
// 1013. Each write gets PeerTimeout to complete. There is no ping: the
// kernel reports a peer process that is gone, so PingInterval is not
// used.
package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

// Version is the version of this transport, reported by Start.
const Version = "0.1.0-example"

// Defaults for zero StartRequest fields.
const (
	DefaultPeerTimeout = 60 * time.Second
	DefaultMaxMessage  = 1 << 20
	DefaultSendQueue   = 8 << 20
)

const (
	// eventBuffer bounds the bytes of frames queued for the link; a
	// reader that would exceed it waits.
	eventBuffer = 16 << 20
	// closeGrace bounds the close of every connection at Stop.
	closeGrace = time.Second
	// maxHandshake bounds the handshake line.
	maxHandshake = 8 << 10
	// Path is the path every connection is reported with.
	Path = "/api/ws"
)

// DefaultPath is the socket path used when StartRequest.Listen does not
// start with "unix:": tether-UID.sock in os.TempDir().
func DefaultPath() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("tether-%d.sock", os.Getuid()))
}

// Server is the Unix socket transport. The zero value is not usable; call
// New.
type Server struct {
	log    zerolog.Logger
	evWake chan struct{} // wakes the link; capacity 1
	wg     sync.WaitGroup

	mu          sync.Mutex // guards the fields below
	started     bool
	stopped     bool
	stopDone    chan struct{} // closed when the first Stop returns
	addr        string
	ln          *net.UnixListener
	peerTimeout time.Duration
	maxMessage  int64
	sendQueue   int64
	conns       map[uint64]*conn
	handshaking map[net.Conn]struct{}
	lastID      uint64

	evMu     sync.Mutex // guards the fields below
	evs      []contract.Event
	evBytes  int64
	evSpace  chan struct{} // closed and replaced when the link took events
	linkDone chan struct{} // non-nil while a link runs
	evStop   bool          // Stop finished: the link drains and returns
}

var _ contract.Transport = (*Server)(nil)

// New returns an unstarted Server that logs to log.
func New(log zerolog.Logger) *Server {
	return &Server{
		log:         log,
		evWake:      make(chan struct{}, 1),
		conns:       make(map[uint64]*conn),
		handshaking: make(map[net.Conn]struct{}),
		evSpace:     make(chan struct{}),
	}
}

// Start implements contract.Transport: it listens on the socket of
// req.Listen (see the package doc).
func (s *Server) Start(_ context.Context, req contract.StartRequest) (contract.StartResponse, error) {
	switch {
	case req.PeerTimeout < 0, req.MaxMessage < 0, req.SendQueue < 0:
		return contract.StartResponse{}, fmt.Errorf("start: negative setting: %w", contract.ErrInvalidArgument)
	}
	path, ok := strings.CutPrefix(req.Listen, "unix:")
	if !ok {
		path = DefaultPath()
	}
	if path == "" {
		return contract.StartResponse{}, fmt.Errorf("start: empty socket path: %w", contract.ErrInvalidArgument)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped:
		return contract.StartResponse{}, fmt.Errorf("start: %w", contract.ErrStopped)
	case s.started:
		return contract.StartResponse{}, fmt.Errorf("start: already started: %w", contract.ErrInvalidArgument)
	}
	if err := removeStale(path); err != nil {
		return contract.StartResponse{}, fmt.Errorf("start: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return contract.StartResponse{}, fmt.Errorf("start: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return contract.StartResponse{}, fmt.Errorf("start: %w", err)
	}
	if req.Instance != "" {
		s.log = s.log.With().Str("instance", req.Instance).Logger()
	}
	s.started = true
	s.ln = ln
	s.addr = "unix:" + path
	s.peerTimeout = orDefault(req.PeerTimeout, DefaultPeerTimeout)
	s.maxMessage = orDefault(req.MaxMessage, DefaultMaxMessage)
	s.sendQueue = orDefault(req.SendQueue, DefaultSendQueue)
	s.wg.Add(1)
	go s.accept(ln)
	s.log.Info().Str("addr", s.addr).Msg("unix socket transport listening")
	return contract.StartResponse{Addr: s.addr, Version: Version}, nil
}

func orDefault[T time.Duration | int64](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// removeStale removes a socket file at path that nobody answers on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	if nc, err := net.DialTimeout("unix", path, time.Second); err == nil {
		nc.Close()
		return fmt.Errorf("%s is in use by another process", path)
	}
	return os.Remove(path)
}

// accept accepts connections until the listener is closed.
func (s *Server) accept(ln *net.UnixListener) {
	defer s.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error().Err(err).Msg("accept")
			}
			return
		}
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			nc.Close()
			continue
		}
		s.handshaking[nc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(nc)
	}
}

// serve reads the handshake, reports the connection and runs it.
func (s *Server) serve(nc net.Conn) {
	defer s.wg.Done()
	s.mu.Lock()
	timeout := s.peerTimeout
	s.mu.Unlock()
	_ = nc.SetReadDeadline(time.Now().Add(timeout))
	br := bufio.NewReaderSize(nc, 64<<10)
	line, err := readLine(br, maxHandshake)
	query, ok := parseHandshake(line)
	if err == nil && !ok {
		_ = nc.SetWriteDeadline(time.Now().Add(closeGrace))
		_, _ = nc.Write(closeLine(contract.CloseProtocolError, `want "TETHER <query>"`))
	}
	_ = nc.SetReadDeadline(time.Time{})

	s.mu.Lock()
	delete(s.handshaking, nc)
	if err != nil || !ok || s.stopped {
		s.mu.Unlock()
		s.log.Debug().AnErr("err", err).Bool("handshake_ok", ok).Msg("connection dropped before it opened")
		nc.Close()
		return
	}
	s.lastID++
	c := &conn{
		s:          s,
		id:         s.lastID,
		nc:         nc,
		timeout:    s.peerTimeout,
		maxMessage: s.maxMessage,
		sendQueue:  s.sendQueue,
		admitCh:    make(chan struct{}),
		closingCh:  make(chan struct{}),
		wake:       make(chan struct{}, 1),
		writerDone: make(chan struct{}),
	}
	s.conns[c.id] = c
	s.pushEventLocked(contract.Event{Kind: contract.EventOpened, Conn: c.id, Path: Path, Query: query, Remote: "unix", Host: s.addr})
	s.wg.Add(1) // the writer
	s.mu.Unlock()
	s.log.Debug().Uint64("conn", c.id).Msg("opened")

	go c.writeLoop()
	c.run(br)
}

// parseHandshake returns the query of a handshake line "TETHER <query>".
func parseHandshake(line []byte) (string, bool) {
	rest, ok := bytes.CutPrefix(line, []byte("TETHER"))
	if !ok || len(rest) > 0 && rest[0] != ' ' {
		return "", false
	}
	return string(bytes.TrimSpace(rest)), true
}

// Exec implements contract.Transport. It never blocks on a peer; commands
// for unknown or closed connections are ignored.
func (s *Server) Exec(_ context.Context, cmds []contract.Command) error {
	for _, cmd := range cmds {
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
			if cmd.Binary || bytes.IndexByte(cmd.Data, '\n') >= 0 {
				s.log.Warn().Uint64("conn", cmd.Conn).Bool("binary", cmd.Binary).Msg("message cannot be sent as one line")
				c.close(1003, "message cannot be sent as one line", false, time.Now().Add(closeGrace))
				continue
			}
			c.send(bytes.Clone(cmd.Data))
		case contract.CommandClose:
			code := cmd.Code
			if code == 0 {
				code = contract.CloseNormal
			}
			c.close(code, cmd.Reason, true, time.Time{})
		default:
			s.log.Warn().Uint64("conn", cmd.Conn).Stringer("kind", cmd.Kind).Msg("unknown command ignored")
		}
	}
	return nil
}

// Stop implements contract.Transport: it closes the listener (removing
// the socket file), then every connection with req.Code (default 1001)
// after its queued lines, each within a second, and returns once every
// Closed event is delivered to a running link. Later calls wait for the
// first.
func (s *Server) Stop(ctx context.Context, req contract.StopRequest) error {
	s.mu.Lock()
	if s.stopDone != nil {
		done := s.stopDone
		s.mu.Unlock()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.stopDone = make(chan struct{})
	defer close(s.stopDone)
	s.stopped = true
	ln := s.ln
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	for nc := range s.handshaking {
		nc.Close()
	}
	s.mu.Unlock()

	if ln != nil {
		ln.Close()
	}
	code := req.Code
	if code == 0 {
		code = contract.CloseGoingAway
	}
	by := time.Now().Add(closeGrace)
	if d, ok := ctx.Deadline(); ok && d.Before(by) {
		by = d
	}
	for _, c := range conns {
		c.close(code, req.Reason, true, by)
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

	s.evMu.Lock()
	s.evStop = true
	link := s.linkDone
	s.evMu.Unlock()
	s.wakeLink()
	if link != nil {
		select {
		case <-link:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.log.Info().Int("conns", len(conns)).Msg("unix socket transport stopped")
	return nil
}

// Link implements contract.Transport: it hands sink everything queued,
// in order, until ctx is done or Stop has finished (then it returns nil
// after the last Closed). A batch the sink rejects is kept for the next
// link.
func (s *Server) Link(ctx context.Context, sink contract.EventSink) error {
	s.evMu.Lock()
	if s.linkDone != nil {
		s.evMu.Unlock()
		return fmt.Errorf("link: %w", contract.ErrAlreadyLinked)
	}
	done := make(chan struct{})
	s.linkDone = done
	s.evMu.Unlock()
	defer func() {
		s.evMu.Lock()
		s.linkDone = nil
		s.evMu.Unlock()
		close(done)
	}()
	for {
		s.evMu.Lock()
		batch, stop := s.evs, s.evStop
		s.evs = nil
		s.evMu.Unlock()
		if len(batch) == 0 {
			if stop {
				return nil
			}
			select {
			case <-s.evWake:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		if err := sink(ctx, batch); err != nil {
			s.evMu.Lock()
			s.evs = append(batch, s.evs...)
			s.evMu.Unlock()
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("link: sink: %w", err)
		}
		s.evMu.Lock()
		for i := range batch {
			s.evBytes -= int64(len(batch[i].Data))
		}
		close(s.evSpace)
		s.evSpace = make(chan struct{})
		s.evMu.Unlock()
	}
}

// pushEventLocked queues e; the caller holds s.mu, which keeps Opened and
// Closed in order with the connection table.
func (s *Server) pushEventLocked(e contract.Event) {
	s.evMu.Lock()
	s.evs = append(s.evs, e)
	s.evMu.Unlock()
	s.wakeLink()
}

// pushFrame queues a Frame of c, waiting while the event buffer is full;
// it drops the frame once c is closing.
func (s *Server) pushFrame(c *conn, data []byte) {
	e := contract.Event{Kind: contract.EventFrame, Conn: c.id, Data: data}
	for {
		select {
		case <-c.closingCh:
			return
		default:
		}
		s.evMu.Lock()
		if s.evBytes == 0 || s.evBytes+int64(len(data)) <= eventBuffer {
			s.evs = append(s.evs, e)
			s.evBytes += int64(len(data))
			s.evMu.Unlock()
			s.wakeLink()
			return
		}
		space := s.evSpace
		s.evMu.Unlock()
		select {
		case <-space:
		case <-c.closingCh:
			return
		}
	}
}

func (s *Server) wakeLink() {
	select {
	case s.evWake <- struct{}{}:
	default:
	}
}

// closed removes c and reports its end; called once per connection.
func (s *Server) closed(c *conn, code int, reason string) {
	s.mu.Lock()
	delete(s.conns, c.id)
	s.pushEventLocked(contract.Event{Kind: contract.EventClosed, Conn: c.id, Code: code, Reason: reason})
	s.mu.Unlock()
	s.log.Debug().Uint64("conn", c.id).Int("code", code).Str("reason", reason).Msg("closed")
}

// conn is one connection. Its run goroutine waits for admission, reads
// lines and reports Closed; its writer goroutine writes queued lines and
// the close line, and closes the socket when it is done.
type conn struct {
	s          *Server
	id         uint64
	nc         net.Conn
	timeout    time.Duration
	maxMessage int64
	sendQueue  int64
	admitCh    chan struct{} // closed on admission
	closingCh  chan struct{} // closed once closing
	wake       chan struct{} // wakes the writer; capacity 1
	writerDone chan struct{} // closed when the writer has closed the socket

	mu        sync.Mutex // guards the fields below
	admitted  bool
	closing   bool
	sendClose bool // write a close line once the queue is written
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

// send queues a line, or closes c with 1013 when the queue is full.
func (c *conn) send(p []byte) {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	if c.queued+int64(len(p))+1 > c.sendQueue {
		c.mu.Unlock()
		c.s.log.Debug().Uint64("conn", c.id).Msg("send queue full")
		c.close(contract.CloseTryAgainLater, "send queue full", false, time.Now().Add(closeGrace))
		return
	}
	c.queue = append(c.queue, p)
	c.queued += int64(len(p)) + 1
	c.mu.Unlock()
	c.wakeWriter()
}

// close starts closing c with code and reason, the first close winning:
// after the queued lines when flush, else instead of them; with a close
// line when line; by the deadline by unless it is zero.
func (c *conn) close(code int, reason string, flush bool, by time.Time) {
	c.closeWith(code, reason, flush, true, by)
}

func (c *conn) closeWith(code int, reason string, flush, line bool, by time.Time) {
	c.mu.Lock()
	if !by.IsZero() && (c.closeBy.IsZero() || by.Before(c.closeBy)) {
		c.closeBy = by
		_ = c.nc.SetDeadline(by)
	}
	if c.closing {
		c.mu.Unlock()
		return
	}
	c.closing, c.sendClose = true, line
	c.code, c.reason = code, reason
	if !flush {
		c.queue = nil
	}
	close(c.closingCh)
	c.mu.Unlock()
	c.wakeWriter()
}

func (c *conn) wakeWriter() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run waits for admission, then reads lines until the connection ends,
// waits for the writer and reports Closed.
func (c *conn) run(br *bufio.Reader) {
	timer := time.NewTimer(c.timeout)
	select {
	case <-c.admitCh:
		timer.Stop()
		c.read(br)
	case <-c.closingCh:
		timer.Stop()
	case <-timer.C:
		c.close(contract.CloseTryAgainLater, "admit timeout", false, time.Now().Add(closeGrace))
	}
	<-c.writerDone
	c.mu.Lock()
	code, reason := c.code, c.reason
	c.mu.Unlock()
	c.s.closed(c, code, reason)
}

// read turns lines into Frames until the connection ends or closes.
func (c *conn) read(br *bufio.Reader) {
	for {
		line, err := readLine(br, c.maxMessage)
		switch {
		case errors.Is(err, errTooBig):
			c.close(contract.CloseTooBig, "message too big", false, time.Now().Add(closeGrace))
			return
		case err != nil:
			// The peer is gone (or the writer closed the socket).
			c.closeWith(contract.CloseAbnormalNoFrame, "", false, false, time.Time{})
			return
		}
		if code, reason, ok := parseCloseLine(line); ok {
			c.closeWith(code, reason, false, false, time.Time{})
			return
		}
		if !utf8.Valid(line) {
			c.close(contract.CloseInvalidPayload, "invalid UTF-8", false, time.Now().Add(closeGrace))
			return
		}
		c.s.pushFrame(c, line)
	}
}

// writeLoop writes queued lines, then the close line, and closes the
// socket.
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
		closing, line := c.closing, c.sendClose
		code, reason := c.code, c.reason
		c.mu.Unlock()

		if len(batch) > 0 {
			bufs = bufs[:0]
			for _, p := range batch {
				bufs = append(bufs, p, newline)
			}
			err := c.write(&bufs)
			c.mu.Lock()
			for _, p := range batch {
				c.queued -= int64(len(p)) + 1
			}
			c.mu.Unlock()
			if err != nil {
				c.s.log.Debug().Uint64("conn", c.id).Err(err).Msg("write failed")
				c.closeWith(contract.CloseAbnormalNoFrame, "", false, false, time.Time{})
				return
			}
			continue
		}
		if closing {
			if line {
				b := net.Buffers{closeLine(code, reason)}
				_ = c.write(&b)
			}
			return
		}
	}
}

var newline = []byte{'\n'}

// write writes bufs within the peer timeout, or by the close deadline if
// that is earlier.
func (c *conn) write(bufs *net.Buffers) error {
	d := time.Now().Add(c.timeout)
	c.mu.Lock()
	if !c.closeBy.IsZero() && c.closeBy.Before(d) {
		d = c.closeBy
	}
	_ = c.nc.SetWriteDeadline(d)
	c.mu.Unlock()
	_, err := bufs.WriteTo(c.nc)
	return err
}

// errTooBig: a line longer than the limit.
var errTooBig = errors.New("line too long")

// readLine reads one line of at most max bytes, without its "\n" or
// "\r\n". A last line without "\n" is io.ErrUnexpectedEOF.
func readLine(br *bufio.Reader, max int64) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if int64(len(line)+len(frag)) > max+2 {
			return nil, errTooBig
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			line = bytes.TrimSuffix(line[:len(line)-1], []byte{'\r'})
			if int64(len(line)) > max {
				return nil, errTooBig
			}
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}

// closeMsg is a close line.
type closeMsg struct {
	Close  *int   `json:"close"`
	Reason string `json:"reason"`
}

// closeLine encodes a close line, with its "\n".
func closeLine(code int, reason string) []byte {
	p, _ := json.Marshal(closeMsg{Close: &code, Reason: reason})
	return append(p, '\n')
}

// parseCloseLine reports whether line is a close line, and its code.
func parseCloseLine(line []byte) (int, string, bool) {
	if !bytes.HasPrefix(line, []byte(`{"close":`)) {
		return 0, "", false
	}
	var m closeMsg
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil || m.Close == nil || dec.More() {
		return 0, "", false
	}
	return *m.Close, m.Reason, true
}
