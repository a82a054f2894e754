package ws

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gobwas/ws"

	"github.com/tether-agent/tether/contract"
)

// A WebSocket upgrade of /api/ws, /api/pty or /acp is the one request
// most connections make, and the one a reconnect storm is made of. It is
// upgraded on the raw connection, by gobwas/ws's own parser, without
// net/http's request, response writer and hijack; every other request
// (the page, /healthz, a malformed or unusual upgrade) goes to net/http
// as before, with the bytes already read.

// headMax is the most of a request head read to tell an upgrade: a head
// longer than this (many cookies, say) is left to net/http.
const headMax = 8 << 10

// rawPaths are the paths upgraded on the raw connection.
var rawPaths = map[string]bool{"/api/ws": true, "/api/pty": true, "/acp": true}

// splitListener is the listener net/http serves: its own accept loop
// takes each connection from the inner listener, upgrades what is a
// WebSocket upgrade of rawPaths, and hands the rest to Accept.
type splitListener struct {
	net.Listener // the inner listener (Addr, Close)
	s            *Server
	cfg          *config
	conns        chan net.Conn
	done         chan struct{} // closed when the accept loop ended
	err          error         // why it ended; read after done

	mu       sync.Mutex // guards the fields below
	sniffing map[net.Conn]struct{}
	dropped  bool // dropSniffing ran: no head is read any more
}

// newSplitListener starts the accept loop on inner.
func newSplitListener(s *Server, cfg *config, inner net.Listener) *splitListener {
	l := &splitListener{Listener: inner, s: s, cfg: cfg, conns: make(chan net.Conn), done: make(chan struct{}),
		sniffing: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go l.loop()
	return l
}

// Accept returns the next connection for net/http.
func (l *splitListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, l.err
	}
}

// dropSniffing closes the connections whose head is still being read
// (Stop, once the accept loop ended and the close grace passed).
func (l *splitListener) dropSniffing() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropped = true
	for nc := range l.sniffing {
		_ = nc.Close()
	}
}

// loop accepts until the inner listener is closed, retrying a
// temporary error (out of descriptors) after a pause that doubles up to
// a second, as net/http does.
func (l *splitListener) loop() {
	defer l.s.wg.Done()
	var pause time.Duration
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				l.s.log.Debug().Err(err).Dur("pause", pause).Msg("accept")
				select {
				case <-time.After(pause):
					continue
				case <-l.s.stopCh:
				}
			}
			l.err = err
			close(l.done)
			return
		}
		pause = 0
		l.s.connState(nc, http.StateNew) // busy until upgraded or handed over
		l.mu.Lock()
		l.sniffing[nc] = struct{}{}
		l.mu.Unlock()
		l.s.wg.Add(1)
		go l.sniff(nc)
	}
}

// sniff reads nc's request head and upgrades it, or hands it to
// net/http with what was read.
func (l *splitListener) sniff(nc net.Conn) {
	defer l.s.wg.Done()
	cfg := l.cfg
	if _, ok := nc.(*tls.Conn); ok {
		// net/http serves TLS whole: the handshake under its header
		// timeout, r.TLS, the 400 to a plain request on the TLS port.
		l.mu.Lock()
		delete(l.sniffing, nc)
		l.mu.Unlock()
		l.handOver(nc)
		return
	}
	_ = nc.SetReadDeadline(time.Now().Add(cfg.headerTO))
	br := bufio.NewReaderSize(nc, headMax)
	head, err := readHead(br)
	l.mu.Lock()
	delete(l.sniffing, nc)
	if l.dropped {
		err = net.ErrClosed
	}
	l.mu.Unlock()
	switch {
	case err != nil && (br.Buffered() == 0 || errors.Is(err, net.ErrClosed)):
		// Closed or timed out before a byte
		// (net/http would drop it unanswered too), or stopping.
		l.s.connState(nc, http.StateClosed)
		_ = nc.Close()
		return
	case err == nil && isRawUpgrade(head):
		_ = nc.SetReadDeadline(time.Time{})
		l.s.upgradeRaw(cfg, nc, br, head)
		l.s.connState(nc, http.StateHijacked)
		return
	}
	_ = nc.SetReadDeadline(time.Time{})
	l.handOver(bufferedConn(nc, br))
	// net/http tracks it from here (its ConnState: StateNew).
	l.s.connState(nc, http.StateHijacked)
}

// handOver gives nc to net/http's Accept.
func (l *splitListener) handOver(nc net.Conn) {
	select {
	case l.conns <- nc:
	case <-l.done:
		_ = nc.Close()
	}
}

// readHead peeks at br until it holds a whole request head (up to the
// blank line) and returns it, still unread; an error when the head does
// not arrive, or does not fit in headMax.
func readHead(br *bufio.Reader) ([]byte, error) {
	n := 1
	for {
		_, err := br.Peek(n) // waits for the n-th byte
		p, _ := br.Peek(br.Buffered())
		if i := bytes.Index(p, []byte("\r\n\r\n")); i >= 0 {
			return p[:i+4], nil
		}
		if err != nil {
			return nil, err
		}
		if n = len(p) + 1; n > headMax {
			return nil, bufio.ErrBufferFull
		}
	}
}

// isRawUpgrade reports whether head is an HTTP/1.1 GET of one of
// rawPaths (as sent, not percent-encoded) asking for a WebSocket
// upgrade: what upgradeRaw serves. The checks of the handshake itself
// are gobwas/ws's.
func isRawUpgrade(head []byte) bool {
	line, rest, _ := bytes.Cut(head, []byte("\r\n"))
	method, line, _ := bytes.Cut(line, []byte(" "))
	uri, proto, _ := bytes.Cut(line, []byte(" "))
	path, _, _ := bytes.Cut(uri, []byte("?"))
	if string(method) != http.MethodGet || string(proto) != "HTTP/1.1" || !rawPaths[string(path)] {
		return false
	}
	for len(rest) > 0 {
		var h []byte
		h, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		k, v, ok := bytes.Cut(h, []byte(":"))
		if ok && strings.EqualFold(string(k), "Upgrade") && strings.EqualFold(strings.TrimSpace(string(v)), "websocket") {
			return true
		}
	}
	return false
}

// upgradeRaw upgrades nc, whose request head is head (still unread in
// br), and reports it opened, with the same event net/http's upgrade
// gives: the path and query as sent, every header (Host apart), the
// peer's address.
func (s *Server) upgradeRaw(cfg *config, nc net.Conn, br *bufio.Reader, head []byte) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		_ = nc.SetWriteDeadline(time.Now().Add(cfg.closeGrace))
		_, _ = io.WriteString(nc, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 14\r\n\r\nshutting down\n")
		_ = nc.Close()
		return
	}
	s.hwg.Add(1)
	s.mu.Unlock()
	defer s.hwg.Done()

	ev := contract.Event{Kind: contract.EventOpened, Header: headHeader(head), Remote: nc.RemoteAddr().String()}
	hosts := 0
	u := ws.Upgrader{
		OnRequest: func(uri []byte) error {
			path, query, _ := strings.Cut(string(uri), "?")
			ev.Path, ev.Query = path, query
			return nil
		},
		OnHost: func(host []byte) error {
			if hosts++; hosts > 1 {
				return ws.RejectConnectionError(ws.RejectionStatus(http.StatusBadRequest), ws.RejectionReason("more than one Host header"))
			}
			ev.Host = string(host)
			return nil
		},
		OnBeforeUpgrade: func() (ws.HandshakeHeader, error) {
			if ev.Path != "/acp" {
				return nil, nil
			}
			return ws.HandshakeHeaderHTTP(http.Header{headerConnectionID: {newConnKey()}}), nil
		},
	}
	_ = nc.SetDeadline(time.Now().Add(cfg.peerTimeout))
	_, err := u.Upgrade(struct {
		io.Reader
		io.Writer
	}{bytes.NewReader(head), nc})
	_ = nc.SetDeadline(time.Time{})
	if err != nil {
		s.log.Debug().Err(err).Str("remote", ev.Remote).Msg("upgrade failed")
		_ = nc.Close()
		return
	}
	s.rawUpgrades.Add(1)
	_, _ = br.Discard(len(head))
	var prefix []byte
	if n := br.Buffered(); n > 0 {
		p, _ := br.Peek(n)
		prefix = bytes.Clone(p)
	}
	s.opened(cfg, nc, prefix, ev)
}

// headHeader is every header of a request head but Host, as net/http's
// Request.Header has them (gobwas/ws checks them; it hands on only those
// it does not check itself).
func headHeader(head []byte) http.Header {
	h := http.Header{}
	_, rest, _ := bytes.Cut(head, []byte("\r\n"))
	for len(rest) > 0 {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		key := http.CanonicalHeaderKey(string(k))
		if key == "Host" {
			continue
		}
		h[key] = append(h[key], strings.TrimSpace(string(v)))
	}
	return h
}

// bufferedConn is nc reading through br first: what sniff read of it.
// An upgrade through net/http unwraps it (opened): the connection then
// reads nc itself, after what br still held.
func bufferedConn(nc net.Conn, br *bufio.Reader) net.Conn { return &readConn{Conn: nc, br: br} }

type readConn struct {
	net.Conn
	br *bufio.Reader
}

func (c *readConn) Read(p []byte) (int, error) { return c.br.Read(p) }

// unwrap returns the connection under c and what br holds of it, unread.
func (c *readConn) unwrap() (net.Conn, []byte) {
	var rest []byte
	if n := c.br.Buffered(); n > 0 {
		p, _ := c.br.Peek(n)
		rest = bytes.Clone(p)
	}
	return c.Conn, rest
}
