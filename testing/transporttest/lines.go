package transporttest

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
	"strings"
	"sync"
	"time"

	"github.com/tether-agent/tether/wire"
)

// LineDialer connects clients of the line protocol of tether's example
// transports (examples/unixsock in Go, examples/node-transport in
// Node.js), the simplest wire a transport without WebSocket can carry,
// to an address "unix:PATH" (a Unix socket) or "HOST:PORT" (TCP):
//
//   - the client opens with one line, "TETHER " and the raw query:
//     "TETHER token=0123abcd";
//   - then each line ("\n", or "\r\n") is one text message, both ways;
//   - a close is a last line {"close":CODE,"reason":"..."}, then the end
//     of the connection; a connection that ends without one was closed
//     with 1006.
//
// The wire carries neither binary messages nor text with line breaks, and
// has no ping: run a transport of it Without(Binary|MultilineText|HalfOpen).
var LineDialer Dialer = DialerFunc(dialLines)

// dialLines connects to addr and sends the handshake line.
func dialLines(ctx context.Context, addr, path, query string) (ClientConn, error) {
	if path != Path {
		return nil, fmt.Errorf("dial %s%s: the line protocol has no paths; want %s", addr, path, Path)
	}
	network, where := "tcp", addr
	if sock, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, where = "unix", sock
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, where)
	if err != nil {
		return nil, err
	}
	if _, err := io.WriteString(nc, "TETHER "+query+"\n"); err != nil {
		nc.Close()
		return nil, err
	}
	return &lineConn{nc: nc, br: bufio.NewReader(nc)}, nil
}

// lineConn is a ClientConn of the line protocol.
type lineConn struct {
	nc net.Conn
	br *bufio.Reader

	mu     sync.Mutex // guards the fields below
	closed *CloseError
	rgen   uint64 // numbers Receive calls, so a late AfterFunc leaves the next alone
}

func (c *lineConn) Send(ctx context.Context, m Message) error {
	if m.Binary || bytes.IndexByte(m.Data, '\n') >= 0 {
		return errors.New("the line protocol carries text without line breaks")
	}
	d, _ := ctx.Deadline()
	_ = c.nc.SetWriteDeadline(d)
	_, err := c.nc.Write(append(bytes.Clone(m.Data), '\n'))
	return err
}

func (c *lineConn) Receive(ctx context.Context) (Message, error) {
	c.mu.Lock()
	if c.closed != nil {
		defer c.mu.Unlock()
		return Message{}, c.closed
	}
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

	line, err := c.br.ReadBytes('\n')
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			<-ctx.Done() // every read deadline comes from ctx
			if len(line) > 0 {
				return Message{}, fmt.Errorf("timed out in the middle of a line: %w", ctx.Err())
			}
			return Message{}, ctx.Err()
		}
		return Message{}, c.setClosed(&CloseError{Code: wire.CloseAbnormal})
	}
	line = bytes.TrimSuffix(line[:len(line)-1], []byte{'\r'})
	if bytes.HasPrefix(line, []byte(`{"close":`)) {
		var m struct {
			Close  int    `json:"close"`
			Reason string `json:"reason"`
		}
		if err := json.Unmarshal(line, &m); err == nil {
			return Message{}, c.setClosed(&CloseError{Code: m.Close, Reason: m.Reason})
		}
	}
	return Message{Data: line}, nil
}

func (c *lineConn) setClosed(ce *CloseError) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = ce
	return ce
}

func (c *lineConn) Close(ctx context.Context, code int, reason string) error {
	defer c.nc.Close()
	p, _ := json.Marshal(map[string]any{"close": code, "reason": reason})
	d, _ := ctx.Deadline()
	_ = c.nc.SetDeadline(d)
	if _, err := c.nc.Write(append(p, '\n')); err != nil {
		return err
	}
	// Wait for the server to end the connection.
	_, _ = io.Copy(io.Discard, c.br)
	return nil
}

func (c *lineConn) Drop() error {
	_ = c.nc.Close()
	return nil
}
