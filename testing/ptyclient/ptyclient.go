// Package ptyclient is a test client for tether's /api/pty endpoint: it
// reads the pty.replay control frame, collects the output bytes and counts
// the offset, and can write input, resize, close or drop the connection.
package ptyclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// Replay is the pty.replay control frame.
type Replay struct {
	Type            string `json:"type"`
	Epoch           string `json:"epoch"`
	StartOffset     int64  `json:"start_offset"`
	ReplayEndOffset int64  `json:"replay_end_offset"`
	Reset           bool   `json:"reset"`
	Reason          string `json:"reason"`
}

// Client is one /api/pty connection.
type Client struct {
	conn net.Conn
	done chan struct{} // closed when the reader returns
	hdr  chan struct{} // closed when the replay frame arrived (or the conn ended)

	wmu sync.Mutex // serialises writes

	mu     sync.Mutex // guards the fields below
	cond   *sync.Cond
	replay *Replay
	out    bytes.Buffer // every output byte received (replay, then live)
	code   int
	reason string
	texts  [][]byte // text frames after the replay frame (unexpected)
}

// Dial connects to url (ws://host:port/api/pty?...).
func Dial(ctx context.Context, url string) (*Client, error) {
	conn, br, _, err := ws.Dial(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("ptyclient: dial: %w", err)
	}
	c := &Client{conn: conn, done: make(chan struct{}), hdr: make(chan struct{})}
	c.cond = sync.NewCond(&c.mu)
	var r io.Reader = conn
	if br != nil {
		r = io.MultiReader(br, conn)
	}
	go c.read(r)
	return c, nil
}

func (c *Client) read(r io.Reader) {
	defer close(c.done)
	hdrOnce := sync.OnceFunc(func() { close(c.hdr) })
	defer hdrOnce()
	code, reason := 1006, ""
	defer func() {
		c.mu.Lock()
		c.code, c.reason = code, reason
		c.cond.Broadcast()
		c.mu.Unlock()
	}()
	rd := wsutil.Reader{Source: r, State: ws.StateClientSide, CheckUTF8: false}
	for {
		h, err := rd.NextFrame()
		if err != nil {
			return
		}
		if h.OpCode.IsControl() {
			payload := make([]byte, h.Length)
			if _, err := io.ReadFull(&rd, payload); err != nil {
				return
			}
			switch h.OpCode {
			case ws.OpClose:
				cc, rs := ws.ParseCloseFrameData(payload)
				code, reason = int(cc), rs
				if code == 0 {
					code = 1005
				}
				c.wmu.Lock()
				_ = wsutil.WriteClientMessage(c.conn, ws.OpClose, ws.NewCloseFrameBody(cc, ""))
				c.wmu.Unlock()
				return
			case ws.OpPing:
				c.wmu.Lock()
				_ = wsutil.WriteClientMessage(c.conn, ws.OpPong, payload)
				c.wmu.Unlock()
			}
			continue
		}
		payload, err := io.ReadAll(&rd)
		if err != nil {
			return
		}
		c.mu.Lock()
		switch {
		case h.OpCode == ws.OpText && c.replay == nil:
			var rp Replay
			if json.Unmarshal(payload, &rp) == nil && rp.Type == "pty.replay" {
				c.replay = &rp
				hdrOnce()
			} else {
				c.texts = append(c.texts, payload)
			}
		case h.OpCode == ws.OpText:
			c.texts = append(c.texts, payload)
		default:
			c.out.Write(payload)
		}
		c.cond.Broadcast()
		c.mu.Unlock()
	}
}

// Replay waits for the pty.replay frame.
func (c *Client) Replay(ctx context.Context) (Replay, error) {
	select {
	case <-c.hdr:
	case <-ctx.Done():
		return Replay{}, ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.replay == nil {
		return Replay{}, fmt.Errorf("ptyclient: closed with %d %q before pty.replay", c.code, c.reason)
	}
	return *c.replay, nil
}

// Output returns a copy of every output byte received so far.
func (c *Client) Output() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.out.Bytes())
}

// Received is the number of output bytes received.
func (c *Client) Received() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(c.out.Len())
}

// Texts returns text frames received after pty.replay (there should be
// none).
func (c *Client) Texts() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.texts...)
}

// WaitOutput waits until the output satisfies ok (or the connection ends,
// or ctx).
func (c *Client) WaitOutput(ctx context.Context, ok func(out []byte) bool) error {
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		c.cond.Broadcast()
		c.mu.Unlock()
	})
	defer stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if ok(c.out.Bytes()) {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("ptyclient: waiting for output (have %d bytes, tail %q): %w", c.out.Len(), tail(c.out.Bytes()), ctx.Err())
		}
		select {
		case <-c.done:
			if c.code != 0 {
				return fmt.Errorf("ptyclient: closed with %d %q (have %d bytes, tail %q): %w", c.code, c.reason, c.out.Len(), tail(c.out.Bytes()), ErrClosed)
			}
		default:
		}
		c.cond.Wait()
	}
}

func tail(b []byte) []byte {
	if len(b) > 200 {
		return b[len(b)-200:]
	}
	return b
}

// ErrClosed: the connection ended.
var ErrClosed = errors.New("connection closed")

// Write sends input as a binary frame.
func (c *Client) Write(p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return wsutil.WriteClientBinary(c.conn, p)
}

// WriteText sends a text frame.
func (c *Client) WriteText(p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return wsutil.WriteClientText(c.conn, p)
}

// Resize sends the resize escape.
func (c *Client) Resize(cols, rows int) error {
	return c.WriteText(fmt.Appendf(nil, "\x1b[RESIZE:%d;%d]", cols, rows))
}

// Closed is closed when the connection has ended.
func (c *Client) Closed() <-chan struct{} { return c.done }

// CloseCode waits for the end of the connection (or ctx) and returns the
// close code the server sent (1006 when there was none).
func (c *Client) CloseCode(ctx context.Context) (int, string, error) {
	select {
	case <-c.done:
	case <-ctx.Done():
		return 0, "", ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.code, c.reason, nil
}

// Close sends a close frame and waits for the connection to end (at most
// 2 s), then closes it.
func (c *Client) Close() {
	c.wmu.Lock()
	_ = wsutil.WriteClientMessage(c.conn, ws.OpClose, ws.NewCloseFrameBody(ws.StatusNormalClosure, ""))
	c.wmu.Unlock()
	select {
	case <-c.done:
	case <-time.After(2 * time.Second):
	}
	_ = c.conn.Close()
	<-c.done
}

// Drop ends the TCP connection abruptly (RST), without a close frame.
func (c *Client) Drop() {
	if tc, ok := c.conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.conn.Close()
	<-c.done
}
