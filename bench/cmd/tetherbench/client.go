package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// closeError is a close frame the server sent.
type closeError struct {
	code   int
	reason string
}

func (e *closeError) Error() string { return fmt.Sprintf("closed %d %q", e.code, e.reason) }

// wsc is the measuring instrument of the rows that compare tether with a
// baseline server (rpc, pty-stream, reattach, idle): the same client on
// both sides, so that client costs cancel out in the ratios — gobwas/ws,
// a buffered reader, masked writes. It knows nothing of tether's
// protocol beyond framing; rows that measure tether alone (storm,
// recovery) and the set-up of the others use package client.
type wsc struct {
	nc  net.Conn
	br  *bufio.Reader
	rd  wsutil.Reader
	wmu sync.Mutex
}

// dial connects to url. readBuf sizes the read buffer (0: 4 KiB).
func dial(ctx context.Context, url string, readBuf int) (*wsc, error) {
	if readBuf == 0 {
		readBuf = 4 << 10
	}
	d := ws.Dialer{ReadBufferSize: 1024}
	nc, hbr, _, err := d.Dial(ctx, url)
	if err != nil {
		return nil, err
	}
	c := &wsc{nc: nc}
	var src io.Reader = nc
	if hbr != nil {
		// Bytes the server sent right after its handshake answer.
		src = io.MultiReader(hbr, nc)
	}
	c.br = bufio.NewReaderSize(src, readBuf)
	c.rd = wsutil.Reader{Source: c.br, State: ws.StateClientSide}
	return c, nil
}

// next returns the header of the next data message, answering pings on the
// way; its payload is then read from c.rd to io.EOF. A close frame is a
// *closeError.
func (c *wsc) next() (ws.Header, error) {
	for {
		h, err := c.rd.NextFrame()
		if err != nil {
			return h, err
		}
		if !h.OpCode.IsControl() {
			return h, nil
		}
		p := make([]byte, h.Length)
		if _, err := io.ReadFull(&c.rd, p); err != nil {
			return h, err
		}
		switch h.OpCode {
		case ws.OpPing:
			c.write(ws.OpPong, p)
		case ws.OpClose:
			code, reason := ws.ParseCloseFrameData(p)
			if code == 0 {
				code = 1005
			}
			c.write(ws.OpClose, ws.NewCloseFrameBody(code, ""))
			return h, &closeError{code: int(code), reason: reason}
		}
	}
}

// readMessage reads the next whole data message.
func (c *wsc) readMessage() (ws.OpCode, []byte, error) {
	h, err := c.next()
	if err != nil {
		return 0, nil, err
	}
	p, err := io.ReadAll(&c.rd)
	return h.OpCode, p, err
}

func (c *wsc) write(op ws.OpCode, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return wsutil.WriteClientMessage(c.nc, op, p)
}

// close sends a close frame and closes the socket without waiting.
func (c *wsc) close() {
	_ = c.write(ws.OpClose, ws.NewCloseFrameBody(ws.StatusNormalClosure, ""))
	_ = c.nc.Close()
}

// drop resets the connection (no TIME_WAIT left behind).
func (c *wsc) drop() {
	if tc, ok := c.nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.nc.Close()
}

// rpcResp is what the client looks at in a JSON-RPC frame (and in the
// echo of its own request).
type rpcResp struct {
	ID     *int64          `json:"id"`
	Method string          `json:"method"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// rpcClient is a JSON-RPC 2.0 client on one wsc, one call at a time.
type rpcClient struct {
	*wsc
	id int64
}

// dialRPC connects to /api/ws (or an echo server) and waits for the first
// text frame (gateway.ready) when ready is set.
func dialRPC(ctx context.Context, url string, ready bool) (*rpcClient, error) {
	c, err := dial(ctx, url, 0)
	if err != nil {
		return nil, err
	}
	if ready {
		_ = c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, _, err := c.readMessage(); err != nil {
			c.drop()
			return nil, fmt.Errorf("waiting for gateway.ready: %w", err)
		}
		_ = c.nc.SetReadDeadline(time.Time{})
	}
	return &rpcClient{wsc: c}, nil
}

// call sends method with params (raw JSON) and waits for the answer with
// the same id, skipping events.
func (c *rpcClient) call(method string, params string) (json.RawMessage, error) {
	c.id++
	id := c.id
	req := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, method, params)
	if err := c.write(ws.OpText, req); err != nil {
		return nil, err
	}
	for {
		_, p, err := c.readMessage()
		if err != nil {
			return nil, err
		}
		var r rpcResp
		if err := json.Unmarshal(p, &r); err != nil {
			return nil, fmt.Errorf("bad frame %q: %w", p, err)
		}
		if r.ID == nil || *r.ID != id {
			continue // an event, or an echo server's other traffic
		}
		if r.Error != nil {
			return nil, fmt.Errorf("%s: rpc error %d: %s", method, r.Error.Code, r.Error.Message)
		}
		if r.Result == nil && r.Method != "" {
			return p, nil // the echo of our own request
		}
		return r.Result, nil
	}
}
