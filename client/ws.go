package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/tether-agent/tether/wire"
)

// wsConn is the client end of one WebSocket: masked whole-frame writes
// under a mutex, and a frame reader that answers pings and close frames.
// Reading is the owner's (one goroutine at a time).
type wsConn struct {
	nc           net.Conn
	rd           wsutil.Reader
	writeTimeout time.Duration // 0: none

	wmu       sync.Mutex // serialises frames; guards the field below
	closeSent bool       // a close frame went out: send no other frame
}

// closeReceived ends a read when the host's close frame arrived.
type closeReceived struct {
	code   int
	reason string
}

func (e *closeReceived) Error() string { return "close frame received" }

// dialWS connects and upgrades to u with o. A failure is a *DialError.
// It returns the deadline of the host's first frame too: DialTimeout
// from now (zero: none).
func dialWS(ctx context.Context, u *url.URL, o Options, readBuf int) (*wsConn, time.Time, error) {
	var first time.Time
	if t := o.dialTimeout(); t > 0 {
		first = time.Now().Add(t)
	}
	hdr := o.Header.Clone()
	if hdr == nil {
		hdr = http.Header{}
	}
	if o.Token != "" && hdr.Get("Authorization") == "" {
		hdr.Set("Authorization", "Bearer "+o.Token)
	}
	if o.Origin != "" {
		hdr.Set("Origin", o.Origin)
	}
	host := o.Host
	if h := hdr.Get("Host"); h != "" && host == "" {
		host = h
	}
	hdr.Del("Host")
	status := 0
	d := ws.Dialer{
		Timeout:        o.dialTimeout(),
		Host:           host,
		TLSConfig:      o.TLSConfig,
		ReadBufferSize: readBuf,
		OnStatusError:  func(s int, _ []byte, _ io.Reader) { status = s },
	}
	if d.TLSConfig == nil {
		d.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if len(hdr) > 0 {
		d.Header = ws.HandshakeHeaderHTTP(hdr)
	}
	nc, br, _, err := d.Dial(ctx, u.String())
	if err != nil {
		return nil, first, &DialError{URL: redact(u), Status: status, Err: err}
	}
	if br == nil {
		br = bufio.NewReaderSize(nc, readBuf)
	}
	c := &wsConn{nc: nc, writeTimeout: o.writeTimeout()}
	c.rd = wsutil.Reader{Source: br, State: ws.StateClientSide, OnIntermediate: c.control}
	return c, first, nil
}

// deadline returns the write deadline for a frame: ctx's, or now +
// writeTimeout when that is sooner.
func (c *wsConn) deadline(ctx context.Context) time.Time {
	var dl time.Time
	if c.writeTimeout > 0 {
		dl = time.Now().Add(c.writeTimeout)
	}
	if d, ok := ctx.Deadline(); ok && (dl.IsZero() || d.Before(dl)) {
		dl = d
	}
	return dl
}

// write sends one frame unless a close frame went out already.
func (c *wsConn) write(ctx context.Context, op ws.OpCode, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closeSent {
		return ErrClosed
	}
	return c.writeLocked(c.deadline(ctx), op, p)
}

func (c *wsConn) writeLocked(deadline time.Time, op ws.OpCode, p []byte) error {
	_ = c.nc.SetWriteDeadline(deadline)
	if err := wsutil.WriteClientMessage(c.nc, op, p); err != nil {
		// A frame may be half written: the stream is unusable. Closing
		// the connection ends its reader too.
		_ = c.nc.Close()
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// sendClose sends a close frame with code and reason, once; it reports
// whether it did.
func (c *wsConn) sendClose(code int, reason string, wait time.Duration) bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closeSent {
		return false
	}
	c.closeSent = true
	_ = c.writeLocked(time.Now().Add(wait), ws.OpClose, ws.NewCloseFrameBody(ws.StatusCode(code), reason))
	return true
}

// control answers a control frame: a pong for a ping; for a close, a
// close reply with the same code (unless one went out already) and a
// *closeReceived.
func (c *wsConn) control(h ws.Header, r io.Reader) error {
	p, err := io.ReadAll(io.LimitReader(r, ws.MaxControlFramePayloadSize))
	if err != nil {
		return err
	}
	switch h.OpCode {
	case ws.OpPing:
		c.wmu.Lock()
		defer c.wmu.Unlock()
		if c.closeSent {
			return nil
		}
		return c.writeLocked(time.Now().Add(max(c.writeTimeout, time.Second)), ws.OpPong, p)
	case ws.OpClose:
		code, reason := ws.ParseCloseFrameData(p)
		cr := &closeReceived{code: int(code), reason: reason}
		if len(p) < 2 {
			cr.code = wire.CloseNoStatus
		}
		c.wmu.Lock()
		if !c.closeSent {
			c.closeSent = true
			var body []byte
			if cr.code != wire.CloseNoStatus {
				body = ws.NewCloseFrameBody(code, "")
			}
			_ = c.writeLocked(time.Now().Add(time.Second), ws.OpClose, body)
		}
		c.wmu.Unlock()
		return cr
	}
	return nil
}

// next returns the header of the next data frame, handling control
// frames on the way.
func (c *wsConn) next() (ws.Header, error) {
	for {
		h, err := c.rd.NextFrame()
		if err != nil {
			return h, err
		}
		if !h.OpCode.IsControl() {
			return h, nil
		}
		if err := c.control(h, &c.rd); err != nil {
			return h, err
		}
	}
}

// readMessage reads the next whole data message of at most limit bytes
// (0: no limit).
func (c *wsConn) readMessage(limit int64) ([]byte, ws.OpCode, error) {
	h, err := c.next()
	if err != nil {
		return nil, 0, err
	}
	var r io.Reader = &c.rd
	if limit > 0 {
		r = io.LimitReader(&c.rd, limit+1)
	}
	p, err := io.ReadAll(r)
	if err != nil {
		return nil, 0, err
	}
	if limit > 0 && int64(len(p)) > limit {
		return nil, 0, fmt.Errorf("%w: a message over %d bytes", ErrProtocol, limit)
	}
	return p, h.OpCode, nil
}

// endErr turns the error that ended reading into a *CloseError.
func endErr(err error) *CloseError {
	var cr *closeReceived
	if errors.As(err, &cr) {
		return &CloseError{Code: cr.code, Reason: cr.reason}
	}
	var ce *CloseError
	if errors.As(err, &ce) {
		return ce
	}
	return &CloseError{Code: wire.CloseAbnormal, Err: err}
}

// abort ends the connection at once: with SO_LINGER 0 the host sees a
// reset, and nothing lingers in TIME_WAIT.
func (c *wsConn) abort() {
	nc := c.nc
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.nc.Close()
}

// readFirst reads the host's first data message before deadline (zero:
// none) or the end of ctx: a text frame of at most limit bytes.
func (c *wsConn) readFirst(ctx context.Context, deadline time.Time, limit int64) ([]byte, error) {
	_ = c.nc.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetReadDeadline(time.Unix(1, 0)) })
	msg, op, err := c.readMessage(limit)
	if !stop() {
		return nil, fmt.Errorf("waiting for the first frame: %w", ctx.Err())
	}
	_ = c.nc.SetReadDeadline(time.Time{})
	if err != nil {
		if errors.Is(err, ErrProtocol) {
			return nil, err
		}
		return nil, endErr(err)
	}
	if op != ws.OpText {
		return nil, fmt.Errorf("%w: a binary frame first", ErrProtocol)
	}
	return msg, nil
}
