package transporttest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gobwas/ws"

	"github.com/tether-agent/tether/wire"
)

// Message is one data message, as a client sends or receives it.
type Message struct {
	Binary bool
	Data   []byte
}

func (m Message) String() string {
	kind := "text"
	if m.Binary {
		kind = "binary"
	}
	if len(m.Data) > 40 {
		return fmt.Sprintf("%s %q… (%d bytes)", kind, m.Data[:40], len(m.Data))
	}
	return fmt.Sprintf("%s %q", kind, m.Data)
}

// CloseError is what ClientConn.Receive returns once the transport has
// ended the connection: the close code and reason the client received, or
// Code 1006 (wire.CloseAbnormal) when the connection ended
// without one.
type CloseError struct {
	Code   int
	Reason string
}

func (e *CloseError) Error() string {
	return "connection closed with " + strconv.Itoa(e.Code) + " " + strconv.Quote(e.Reason)
}

// ClientConn is the client end of one connection to the transport under
// test. The kit never calls Send and Receive of one ClientConn
// concurrently; Drop may be called at any time, also while another
// goroutine is in Receive, and more than once.
type ClientConn interface {
	// Send sends one data message. A transport without the Binary or
	// MultilineText capability is only sent text messages without line
	// breaks.
	Send(ctx context.Context, m Message) error
	// Receive returns the next data message, answering the transport's
	// liveness probes (pings) while it waits. Once the transport has
	// closed the connection it returns a *CloseError, and keeps returning
	// it. It returns ctx.Err() when ctx ends first; the connection stays
	// usable then. A client that is not in Receive answers nothing: that
	// is how the kit makes a peer that stops responding.
	Receive(ctx context.Context) (Message, error)
	// Close closes the connection from the client side with code and
	// reason (a close handshake where the protocol has one), waits until
	// the transport has ended the connection or ctx is done, and releases
	// it.
	Close(ctx context.Context, code int, reason string) error
	// Drop ends the connection abruptly, without any close message, and
	// releases it.
	Drop() error
}

// Dialer connects clients to a started transport.
type Dialer interface {
	// Dial connects to addr, the address the transport's Start returned,
	// asking for path (always "/api/ws") with the raw query string query.
	// The transport must report the connection's Opened event with that
	// Path and Query.
	Dial(ctx context.Context, addr, path, query string) (ClientConn, error)
}

// DialerFunc adapts a function to a Dialer.
type DialerFunc func(ctx context.Context, addr, path, query string) (ClientConn, error)

// Dial calls f.
func (f DialerFunc) Dial(ctx context.Context, addr, path, query string) (ClientConn, error) {
	return f(ctx, addr, path, query)
}

// WebSocketDialer dials ws://addr/path?query with github.com/gobwas/ws. Its
// clients answer pings while in Receive, echo the server's close frame, and
// put the close code of a client Close in a close frame. It is the default
// Dialer of Run.
//
// It is a frame-level client of its own, not package client: the kit
// checks a transport plugin below the protocol, with the kit itself in the
// host's place, so its clients send and receive arbitrary data messages
// (text or binary, with or without line breaks), not JSON-RPC calls; they
// answer pings only while in Receive (a client that stops reading is how
// the kit makes a peer that stops responding, which client's own reader
// would hide); they close with any code, and can drop a connection
// without a close frame.
var WebSocketDialer Dialer = DialerFunc(dialWebSocket)

// maxClientMessage bounds a message the WebSocket client accepts.
const maxClientMessage = 64 << 20

func dialWebSocket(ctx context.Context, addr, path, query string) (ClientConn, error) {
	u := "ws://" + addr + path
	if query != "" {
		u += "?" + query
	}
	nc, br, _, err := ws.Dialer{}.Dial(ctx, u)
	if err != nil {
		return nil, err
	}
	c := &wsConn{nc: nc, r: nc}
	if br != nil {
		c.r = br // frames the server sent along with the handshake
	}
	return c, nil
}

// wsConn is the WebSocketDialer's ClientConn.
type wsConn struct {
	nc net.Conn
	r  io.Reader

	wmu sync.Mutex // serialises frame writes (Send, pongs, close)

	mu     sync.Mutex // guards the fields below
	closed *CloseError
	broken error  // a read failed mid-frame: the stream cannot be parsed
	rgen   uint64 // numbers Receive calls, so a late cancel hits only its own
}

func (c *wsConn) writeFrame(ctx context.Context, op ws.OpCode, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Time{}
	}
	_ = c.nc.SetWriteDeadline(d)
	return ws.WriteFrame(c.nc, ws.MaskFrameInPlace(ws.NewFrame(op, true, bytes.Clone(p))))
}

func (c *wsConn) Send(ctx context.Context, m Message) error {
	op := ws.OpText
	if m.Binary {
		op = ws.OpBinary
	}
	return c.writeFrame(ctx, op, m.Data)
}

func (c *wsConn) Receive(ctx context.Context) (Message, error) {
	c.mu.Lock()
	closed, broken := c.closed, c.broken
	c.mu.Unlock()
	if closed != nil {
		return Message{}, closed
	}
	if broken != nil {
		return Message{}, broken
	}
	c.mu.Lock()
	c.rgen++
	gen := c.rgen
	d, _ := ctx.Deadline()
	_ = c.nc.SetReadDeadline(d)
	c.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.rgen == gen {
			_ = c.nc.SetReadDeadline(time.Unix(1, 0))
		}
	})
	defer stop()

	var msg []byte
	var msgOp ws.OpCode
	for {
		h, err := ws.ReadHeader(c.r)
		if err != nil {
			return Message{}, c.readErr(ctx, err, len(msg) > 0)
		}
		if h.Masked || h.Length > maxClientMessage {
			return Message{}, c.fail(fmt.Errorf("bad frame from the server: masked=%v length=%d", h.Masked, h.Length))
		}
		p := make([]byte, h.Length)
		if _, err := io.ReadFull(c.r, p); err != nil {
			return Message{}, c.readErr(ctx, err, true)
		}
		switch h.OpCode {
		case ws.OpPing:
			if err := c.writeFrame(context.Background(), ws.OpPong, p); err != nil {
				return Message{}, c.readErr(ctx, err, false)
			}
			continue
		case ws.OpPong:
			continue
		case ws.OpClose:
			ce := &CloseError{Code: wire.CloseNoStatus}
			if len(p) >= 2 {
				ce.Code, ce.Reason = int(binary.BigEndian.Uint16(p)), string(p[2:])
			}
			_ = c.writeFrame(context.Background(), ws.OpClose, p) // the echo
			c.mu.Lock()
			c.closed = ce
			c.mu.Unlock()
			return Message{}, ce
		case ws.OpContinuation:
			msg = append(msg, p...)
		default:
			msgOp, msg = h.OpCode, p
		}
		if len(msg) > maxClientMessage {
			return Message{}, c.fail(fmt.Errorf("message over %d bytes", maxClientMessage))
		}
		if h.Fin {
			return Message{Binary: msgOp == ws.OpBinary, Data: msg}, nil
		}
	}
}

// readErr turns a read error into what Receive returns.
func (c *wsConn) readErr(ctx context.Context, err error, midFrame bool) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// Every read deadline comes from ctx; its timer may fire a hair
		// after the poller's.
		<-ctx.Done()
		if midFrame {
			return c.fail(fmt.Errorf("timed out in the middle of a frame: %w", ctx.Err()))
		}
		return ctx.Err()
	}
	if isConnEnd(err) {
		ce := &CloseError{Code: wire.CloseAbnormal}
		c.mu.Lock()
		c.closed = ce
		c.mu.Unlock()
		return ce
	}
	return c.fail(err)
}

func (c *wsConn) fail(err error) error {
	c.mu.Lock()
	c.broken = err
	c.mu.Unlock()
	return err
}

func (c *wsConn) Close(ctx context.Context, code int, reason string) error {
	defer c.nc.Close()
	if err := c.writeFrame(ctx, ws.OpClose, ws.NewCloseFrameBody(ws.StatusCode(code), reason)); err != nil {
		return err
	}
	// Wait for the echo, or for the server to end the connection.
	d, _ := ctx.Deadline()
	_ = c.nc.SetReadDeadline(d)
	br := bufio.NewReader(c.r)
	for {
		h, err := ws.ReadHeader(br)
		if err != nil {
			return nil
		}
		if _, err := io.CopyN(io.Discard, br, h.Length); err != nil || h.OpCode == ws.OpClose {
			return nil
		}
	}
}

func (c *wsConn) Drop() error {
	_ = c.nc.Close()
	return nil
}

// isConnEnd reports whether err means the peer ended the connection.
func isConnEnd(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
