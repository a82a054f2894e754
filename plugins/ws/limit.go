package ws

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// maxRefuseGrace bounds how long a refused connection is kept to hand it
// its 503 (a TLS handshake, the response, the client's close).
const maxRefuseGrace = time.Second

// shedGrace bounds the same for a connection refused for lack of file
// descriptors, which the accept loop refuses itself, one at a time.
const shedGrace = 250 * time.Millisecond

// refuseLogEvery rate-limits the warning about refused connections.
const refuseLogEvery = 10 * time.Second

// fdReserve is how many file descriptors the connection bound keeps free
// under the process's limit, for the plugin's own needs (gRPC, the
// listener, the refusals in flight): 1/32 of the limit, at least 64.
func fdReserve(fdLimit uint64) uint64 { return max(64, fdLimit/32) }

// refusing is how many refused connections are handled at once: a quarter
// of the reserve, 16 to 256. Past it a refused connection gets its 503
// without waiting for the client to read it (so the client may see a
// reset instead).
func refusing(fdLimit uint64) int {
	if fdLimit == 0 {
		return 256
	}
	return int(min(256, max(16, fdReserve(fdLimit)/4)))
}

// connLimit returns the bound on open connections: want, lowered to stay
// fdReserve below the soft RLIMIT_NOFILE (which the Go runtime raises to
// the hard limit at start), and that limit (0 when unknown or unlimited).
// Past the bound a connection is refused with a 503 while there are
// still descriptors to accept it with; at the descriptor limit, accept
// itself would fail and connections would wait in the kernel's backlog.
func connLimit(want int64) (limit int64, fdLimit uint64) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == ^uint64(0) || rl.Cur > 1<<40 {
		return want, 0
	}
	reserve := fdReserve(rl.Cur)
	if rl.Cur <= reserve {
		return 1, rl.Cur
	}
	return min(want, int64(rl.Cur-reserve)), rl.Cur
}

// limitListener counts the connections its Accept returns until they are
// closed and refuses the ones past max with an HTTP 503. It also keeps a
// spare file descriptor: when accept fails for lack of descriptors, it
// gives the spare up for a moment to accept the waiting connection and
// close it, instead of leaving clients hanging in the kernel's backlog
// (and instead of retrying the failing accept in a loop).
//
// Accept is called from one goroutine (the http.Server's accept loop),
// which alone uses spare.
type limitListener struct {
	net.Listener
	s      *Server
	max    int64
	tls    *tls.Config // nil: plain HTTP
	resp   []byte      // the 503 response
	grace  time.Duration
	slots  chan struct{} // one value per refusal in flight
	spare  *os.File      // reserved descriptor; nil when it could not be had
	emfile bool          // accept failed for lack of descriptors; logged once until it works again

	open    atomic.Int64  // connections returned by Accept and not closed
	refused atomic.Uint64 // connections refused: over max, or out of descriptors
	logged  atomic.Int64  // unix nanos of the last refusal warning
}

func newLimitListener(s *Server, ln net.Listener, max int64, fdLimit uint64, tlsCfg *tls.Config, grace time.Duration) *limitListener {
	body := fmt.Sprintf("tether: too many open connections (this server takes %d at most); try again later\n", max)
	resp := "HTTP/1.1 503 Service Unavailable\r\n" +
		"Content-Type: text/plain; charset=utf-8\r\n" +
		fmt.Sprintf("Content-Length: %d\r\n", len(body)) +
		"Cache-Control: no-store\r\n" +
		"Retry-After: 1\r\n" +
		"Connection: close\r\n" +
		"\r\n" + body
	l := &limitListener{
		Listener: ln,
		s:        s,
		max:      max,
		tls:      tlsCfg,
		resp:     []byte(resp),
		grace:    grace,
		slots:    make(chan struct{}, refusing(fdLimit)),
	}
	l.spare, _ = os.Open(os.DevNull) // without it, accept failures back off in http.Server
	return l
}

// Accept returns the next connection that is within the bound.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil && isOutOfFDs(err) {
			nc, err = l.shed(err)
			if errors.Is(err, errShed) {
				continue
			}
		}
		if err != nil {
			// http.Server retries a temporary error (EMFILE is one)
			// after a pause that doubles up to a second.
			return nil, err
		}
		if l.emfile {
			l.emfile = false
			l.s.log.Info().Msg("file descriptors available again")
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refuse(nc)
			continue
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			return &trackedTCPConn{TCPConn: tc, l: l}, nil
		}
		return &trackedConn{Conn: nc, l: l}, nil
	}
}

// errShed is shed's "one connection was refused: accept the next".
var errShed = errors.New("connection shed")

// isOutOfFDs reports whether err is accept failing for lack of file
// descriptors, in the process or the system.
func isOutOfFDs(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// shed handles an accept that failed with cause for lack of descriptors
// (it fails at once then, whether or not a connection waits). It gives
// up the spare descriptor and accepts again, which waits for the next
// connection. If it can then take a spare again, descriptors were freed:
// it returns the connection to be served. Otherwise it refuses the
// connection as refuse does (for up to shedGrace: the clients waiting are
// answered one after the other), takes the spare back and returns
// errShed. Without a spare it returns cause, for http.Server's paced
// retries.
func (l *limitListener) shed(cause error) (net.Conn, error) {
	if !l.emfile {
		l.emfile = true
		l.s.log.Warn().Err(cause).Int64("open", l.open.Load()).
			Msg("out of file descriptors: refusing new connections until some are closed")
	}
	if l.spare == nil {
		l.spare, _ = os.Open(os.DevNull)
		if l.spare == nil {
			return nil, cause
		}
	}
	_ = l.spare.Close()
	nc, err := l.Listener.Accept()
	l.spare, _ = os.Open(os.DevNull)
	switch {
	case err != nil:
		return nil, err // closed, or the descriptor was taken by another
	case l.spare != nil:
		return nc, nil
	}
	l.refused.Add(1)
	l.refuseGracefully(nc, min(l.grace, shedGrace))
	l.spare, _ = os.Open(os.DevNull) // nil if another took the slot: retried next time
	return nil, errShed
}

// refuse answers a connection past the bound with a 503 and closes it. A
// refusal that can have a slot waits (in its own goroutine, up to grace)
// for the client to read the response and close, so that closing does
// not reset the connection before the response was read; the others get
// the response and are closed at once.
func (l *limitListener) refuse(nc net.Conn) {
	n := l.refused.Add(1)
	if now := time.Now().UnixNano(); now-l.logged.Load() >= int64(refuseLogEvery) {
		l.logged.Store(now)
		l.s.log.Warn().Int64("max_connections", l.max).Uint64("refused_total", n).
			Msg("connection limit reached: refusing new connections with 503")
	}
	select {
	case l.slots <- struct{}{}:
	default:
		l.refuseNow(nc)
		return
	}
	l.s.wg.Add(1)
	go func() {
		defer l.s.wg.Done()
		defer func() { <-l.slots }()
		l.refuseGracefully(nc, l.grace)
	}()
}

// refuseNow writes the 503 if that needs no handshake and closes nc.
func (l *limitListener) refuseNow(nc net.Conn) {
	if l.tls == nil {
		_ = nc.SetWriteDeadline(time.Now().Add(l.grace))
		_, _ = nc.Write(l.resp) // a new socket's buffer takes it at once
	}
	_ = nc.Close()
}

// refuseGracefully writes the 503 (after a TLS handshake under TLS), ends
// the sending side and reads what the client sends until it closes or
// grace ends, then closes nc.
func (l *limitListener) refuseGracefully(nc net.Conn, grace time.Duration) {
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(grace))
	var w net.Conn = nc
	if l.tls != nil {
		tc := tls.Server(nc, l.tls)
		if err := tc.Handshake(); err != nil {
			return
		}
		w = tc
	}
	if _, err := w.Write(l.resp); err != nil {
		return
	}
	if tc, ok := w.(*tls.Conn); ok {
		_ = tc.CloseWrite() // close_notify
	}
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(nc, 64<<10))
}

// release is called once per tracked connection, when it is closed.
func (l *limitListener) release() { l.open.Add(-1) }

// closeSpare gives the spare descriptor back, once the accept loop ended.
func (l *limitListener) closeSpare() {
	if l.spare != nil {
		_ = l.spare.Close()
		l.spare = nil
	}
}

// trackedTCPConn is a counted TCP connection. It embeds *net.TCPConn, so
// it keeps every method of it (SyscallConn for the non-blocking writes,
// CloseWrite, and the vectored writes of net.Buffers); Close also
// releases its place under the bound, once.
type trackedTCPConn struct {
	*net.TCPConn
	l      *limitListener
	closed atomic.Bool
}

// Close closes the connection and releases its place.
func (c *trackedTCPConn) Close() error {
	err := c.TCPConn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.l.release()
	}
	return err
}

// trackedConn is a counted connection of a listener that is not TCP.
type trackedConn struct {
	net.Conn
	l      *limitListener
	closed atomic.Bool
}

// Close closes the connection and releases its place.
func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.l.release()
	}
	return err
}
