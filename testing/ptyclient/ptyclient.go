// Package ptyclient is a test client for tether's /api/pty endpoint: a
// thin wrapper over package client that dials a URL exactly as given
// (tests send malformed queries and tokens in the query), collects every
// output byte in memory, and can write input, resize, close or drop the
// connection. A socket the host refuses before pty.replay is not an
// error: Dial returns a Client already closed with the code.
package ptyclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// closeWait is how long Close waits for the host's answer.
const closeWait = 2 * time.Second

// ErrClosed: the connection ended.
var ErrClosed = errors.New("connection closed")

// Client is one /api/pty connection.
type Client struct {
	pty  *client.PTY   // nil when the host refused before pty.replay
	done chan struct{} // closed when the connection has ended

	mu     sync.Mutex // guards the fields below
	cond   *sync.Cond
	replay *wire.Replay
	snap   bytes.Buffer // the snapshot's bytes (the first SnapshotBytes), when the replay is one
	out    bytes.Buffer // every output byte counted for the offset: the raw replay, then live
	code   int
	reason string
	texts  [][]byte // text frames after the replay frame (unexpected)
}

// Dial connects to url (ws://host:port/api/pty?...) and reads the
// pty.replay frame.
func Dial(ctx context.Context, url string) (*Client, error) {
	c := &Client{done: make(chan struct{})}
	c.cond = sync.NewCond(&c.mu)
	p, err := client.AttachURL(ctx, url, client.PTYOptions{
		Options: client.Options{DialTimeout: -1, CloseWait: closeWait},
		OnText: func(b []byte) {
			c.mu.Lock()
			c.texts = append(c.texts, b)
			c.mu.Unlock()
		},
	})
	var ce *client.CloseError
	switch {
	case errors.As(err, &ce):
		c.code, c.reason = ce.Code, ce.Reason
		close(c.done)
		return c, nil
	case err != nil:
		return nil, fmt.Errorf("ptyclient: %w", err)
	}
	r := p.Replay()
	c.pty, c.replay = p, &r
	go c.read()
	return c, nil
}

func (c *Client) read() {
	defer close(c.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := c.pty.Read(buf)
		c.mu.Lock()
		b := buf[:n]
		if want := c.replay.SnapshotBytes - int64(c.snap.Len()); want > 0 {
			k := min(int64(len(b)), want)
			c.snap.Write(b[:k])
			b = b[k:]
		}
		c.out.Write(b)
		if err != nil {
			c.code, c.reason = wire.CloseAbnormal, ""
			var ce *client.CloseError
			if errors.As(err, &ce) {
				c.code, c.reason = ce.Code, ce.Reason
			}
		}
		c.cond.Broadcast()
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// Replay returns the pty.replay frame.
func (c *Client) Replay(ctx context.Context) (wire.Replay, error) {
	if c.replay == nil {
		return wire.Replay{}, fmt.Errorf("ptyclient: closed with %d %q before pty.replay", c.code, c.reason)
	}
	return *c.replay, nil
}

// Snapshot returns the snapshot's bytes received so far (none when the
// replay was raw).
func (c *Client) Snapshot() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.snap.Bytes())
}

// Output returns a copy of every output byte received so far that counts
// for the client's offset: the raw replay and live output, not a
// snapshot.
func (c *Client) Output() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.out.Bytes())
}

// Received is the number of output bytes received that count for the
// offset (see Output).
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
			return fmt.Errorf("ptyclient: closed with %d %q (have %d bytes, tail %q): %w", c.code, c.reason, c.out.Len(), tail(c.out.Bytes()), ErrClosed)
		default:
		}
		c.cond.Wait()
	}
}

// WaitSnapshot waits until the whole snapshot has arrived (at once when
// the replay was raw) and returns it.
func (c *Client) WaitSnapshot(ctx context.Context) ([]byte, error) {
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		c.cond.Broadcast()
		c.mu.Unlock()
	})
	defer stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for int64(c.snap.Len()) < c.replay.SnapshotBytes {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("ptyclient: waiting for the snapshot (have %d of %d bytes): %w", c.snap.Len(), c.replay.SnapshotBytes, ctx.Err())
		}
		select {
		case <-c.done:
			return nil, fmt.Errorf("ptyclient: closed with %d %q in the snapshot (have %d of %d bytes): %w", c.code, c.reason, c.snap.Len(), c.replay.SnapshotBytes, ErrClosed)
		default:
		}
		c.cond.Wait()
	}
	return bytes.Clone(c.snap.Bytes()), nil
}

func tail(b []byte) []byte {
	if len(b) > 200 {
		return b[len(b)-200:]
	}
	return b
}

// Write sends input as a binary frame.
func (c *Client) Write(p []byte) error {
	if c.pty == nil {
		return ErrClosed
	}
	_, err := c.pty.Write(p)
	return err
}

// WriteText sends a text frame.
func (c *Client) WriteText(p []byte) error {
	if c.pty == nil {
		return ErrClosed
	}
	return c.pty.WriteText(p)
}

// Resize sends the resize escape (any numbers: the host drops a size out
// of range).
func (c *Client) Resize(cols, rows int) error {
	return c.WriteText(wire.EncodeResize(cols, rows))
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
	if c.pty != nil {
		_ = c.pty.Close()
	}
	<-c.done
}

// Drop ends the TCP connection abruptly (RST), without a close frame.
func (c *Client) Drop() {
	if c.pty != nil {
		c.pty.Abort()
	}
	<-c.done
}
