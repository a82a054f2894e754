package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gobwas/ws"

	"github.com/tether-agent/tether/wire"
)

// MessageConn is a WebSocket to an endpoint of the host that carries one
// message per WebSocket text message and whose host sends nothing first,
// such as /acp (ACP's JSON-RPC, wire.PathACP). It has no reader
// goroutine: ReadMessage reads on its caller's goroutine (one at a time),
// and WriteMessage may run beside it.
type MessageConn struct {
	ws        *wsConn
	max       int64
	closeWait time.Duration
	ended     chan struct{} // closed when a read met the end
	endOnce   sync.Once
	once      sync.Once
}

// DialMessages connects to the endpoint path of the host at baseURL (as
// tether serve prints it; a ?token= there is used when o.Token is empty).
// A failure is a *DialError; an access token the host refuses shows as
// the first ReadMessage's *CloseError (4401).
func DialMessages(ctx context.Context, baseURL, path string, o Options) (*MessageConn, error) {
	u, token, err := Endpoint(baseURL, path)
	if err != nil {
		return nil, err
	}
	if o.Token == "" {
		o.Token = token
	}
	wc, _, err := dialWS(ctx, u, o, o.readBuffer(32<<10))
	if err != nil {
		return nil, err
	}
	return &MessageConn{ws: wc, max: o.maxMessage(), closeWait: o.closeWait(), ended: make(chan struct{})}, nil
}

// ReadMessage returns the next text message. When the connection ends it
// returns a *CloseError (the host's close code, or wire.CloseAbnormal);
// a binary message or one over Options.MaxMessage ends it with an error
// wrapping ErrProtocol.
func (m *MessageConn) ReadMessage() ([]byte, error) {
	p, op, err := m.ws.readMessage(m.max)
	switch {
	case err == nil && op == ws.OpText:
		return p, nil
	case err == nil:
		err = fmt.Errorf("%w: a binary message", ErrProtocol)
	}
	m.endOnce.Do(func() { close(m.ended) })
	if errors.Is(err, ErrProtocol) {
		m.ws.abort()
		return nil, err
	}
	return nil, endErr(err)
}

// WriteMessage sends p as one text message (ErrClosed after Close).
func (m *MessageConn) WriteMessage(ctx context.Context, p []byte) error {
	return m.ws.write(ctx, ws.OpText, p)
}

// Close sends a close frame (1000) and waits, at most Options.CloseWait,
// for a ReadMessage in progress to take the host's answer; then it closes
// the connection. Calling it again does nothing.
func (m *MessageConn) Close() error {
	m.once.Do(func() {
		if m.ws.sendClose(wire.CloseNormal, "", m.closeWait) {
			t := time.NewTimer(m.closeWait)
			select {
			case <-m.ended:
			case <-t.C:
			}
			t.Stop()
		}
		_ = m.ws.nc.Close()
	})
	return nil
}
