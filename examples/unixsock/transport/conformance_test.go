package transport_test

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
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/examples/unixsock/transport"
	"github.com/tether-agent/tether/testing/transporttest"
)

// TestConformance runs the transport conformance kit with a Dialer that
// speaks the line protocol. The transport carries text lines only and
// does not ping.
func TestConformance(t *testing.T) {
	transporttest.Run(t,
		func(t *testing.T) contract.Transport {
			return transport.New(zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel))
		},
		transporttest.WithListen(func(t *testing.T) string { return "unix:" + socketPath(t) }),
		transporttest.WithDialer(transporttest.DialerFunc(dialLines)),
		transporttest.Without(transporttest.Binary|transporttest.MultilineText|transporttest.HalfOpen),
	)
}

// socketPath returns a socket path in a new directory removed at cleanup
// (t.TempDir would be too long for a socket path with subtest names).
func socketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "us")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "s.sock")
}

// dialLines connects to addr ("unix:PATH") and sends the handshake line.
func dialLines(ctx context.Context, addr, path, query string) (transporttest.ClientConn, error) {
	sock, ok := strings.CutPrefix(addr, "unix:")
	if !ok || path != transport.Path {
		return nil, fmt.Errorf("dial %s%s: want unix:PATH and %s", addr, path, transport.Path)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, err
	}
	if _, err := io.WriteString(nc, "TETHER "+query+"\n"); err != nil {
		nc.Close()
		return nil, err
	}
	return &lineConn{nc: nc, br: bufio.NewReader(nc)}, nil
}

// lineConn is a transporttest.ClientConn over the line protocol.
type lineConn struct {
	nc net.Conn
	br *bufio.Reader

	mu     sync.Mutex // guards the fields below
	closed *transporttest.CloseError
	rgen   uint64
}

func (c *lineConn) Send(ctx context.Context, m transporttest.Message) error {
	if m.Binary || bytes.IndexByte(m.Data, '\n') >= 0 {
		return errors.New("the line protocol carries text without line breaks")
	}
	d, _ := ctx.Deadline()
	_ = c.nc.SetWriteDeadline(d)
	_, err := c.nc.Write(append(bytes.Clone(m.Data), '\n'))
	return err
}

func (c *lineConn) Receive(ctx context.Context) (transporttest.Message, error) {
	c.mu.Lock()
	if c.closed != nil {
		defer c.mu.Unlock()
		return transporttest.Message{}, c.closed
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
				return transporttest.Message{}, fmt.Errorf("timed out in the middle of a line: %w", ctx.Err())
			}
			return transporttest.Message{}, ctx.Err()
		}
		return transporttest.Message{}, c.setClosed(&transporttest.CloseError{Code: contract.CloseAbnormalNoFrame})
	}
	line = bytes.TrimSuffix(line[:len(line)-1], []byte{'\r'})
	if bytes.HasPrefix(line, []byte(`{"close":`)) {
		var m struct {
			Close  int    `json:"close"`
			Reason string `json:"reason"`
		}
		if err := json.Unmarshal(line, &m); err == nil {
			return transporttest.Message{}, c.setClosed(&transporttest.CloseError{Code: m.Close, Reason: m.Reason})
		}
	}
	return transporttest.Message{Data: line}, nil
}

func (c *lineConn) setClosed(ce *transporttest.CloseError) error {
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
