package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// sessions lists the live and stored sessions of a running host through
// its JSON-RPC gateway.
func sessions(args []string) int {
	fs := flag.NewFlagSet("tether sessions", flag.ContinueOnError)
	base := fs.String("url", "http://127.0.0.1:7717", "URL of the running host")
	token := fs.String("token", "", "access token of the running host")
	limit := fs.Int("limit", 20, "stored sessions to list at most")
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "tether sessions:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dialGateway(ctx, *base, *token)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether sessions:", err)
		return 1
	}
	defer c.close()

	var active struct {
		Sessions []struct {
			ID           string `json:"id"`
			SessionKey   string `json:"session_key"`
			Title        string `json:"title"`
			Status       string `json:"status"`
			MessageCount int    `json:"message_count"`
			Viewers      int    `json:"viewers"`
		} `json:"sessions"`
	}
	if err := c.call("session.active_list", nil, &active); err != nil {
		fmt.Fprintln(os.Stderr, "tether sessions:", err)
		return 1
	}
	var stored struct {
		Sessions []struct {
			ID           string `json:"id"`
			Title        string `json:"title"`
			StartedAt    int64  `json:"started_at"`
			EndedAt      *int64 `json:"ended_at"`
			EndReason    string `json:"end_reason"`
			MessageCount int    `json:"message_count"`
		} `json:"sessions"`
	}
	if err := c.call("session.list", map[string]int{"limit": *limit}, &stored); err != nil {
		fmt.Fprintln(os.Stderr, "tether sessions:", err)
		return 1
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "LIVE\tKEY\tTITLE\tSTATUS\tMESSAGES\tVIEWERS")
	for _, s := range active.Sessions {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\n", s.ID, s.SessionKey, s.Title, s.Status, s.MessageCount, s.Viewers)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "STORED\tTITLE\tSTARTED\tENDED\tMESSAGES")
	for _, s := range stored.Sessions {
		ended := "-"
		if s.EndedAt != nil {
			ended = time.Unix(*s.EndedAt, 0).Format(time.DateTime) + " (" + s.EndReason + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\n", s.ID, s.Title, time.Unix(s.StartedAt, 0).Format(time.DateTime), ended, s.MessageCount)
	}
	if err := w.Flush(); err != nil {
		return 1
	}
	return 0
}

// gatewayClient is the few JSON-RPC calls the client commands need, one
// at a time.
type gatewayClient struct {
	conn io.ReadWriteCloser
	next int
}

// dialGateway connects to /api/ws of the host at base and waits for
// gateway.ready.
func dialGateway(ctx context.Context, base, token string) (*gatewayClient, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("--url %q: %w", base, err)
	}
	switch u.Scheme {
	case "http", "ws":
		u.Scheme = "ws"
	case "https", "wss":
		u.Scheme = "wss"
	default:
		return nil, fmt.Errorf("--url %q: want http(s)://host:port", base)
	}
	u.Path = "/api/ws"
	q := u.Query()
	if token != "" {
		q.Set("token", token)
	}
	u.RawQuery = q.Encode()
	raw, br, _, err := ws.Dial(ctx, u.String())
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", base, err)
	}
	var conn io.ReadWriteCloser = raw
	if br != nil {
		// Frames that arrived with the handshake response are in br.
		conn = bufferedConn{Reader: io.MultiReader(br, raw), Conn: raw}
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	c := &gatewayClient{conn: conn}
	msg, err := c.read()
	if err != nil {
		conn.Close()
		return nil, err
	}
	if !strings.Contains(string(msg), `"gateway.ready"`) {
		conn.Close()
		return nil, fmt.Errorf("unexpected first message %s", msg)
	}
	return c, nil
}

// read returns the next text message, turning a close frame into an error
// that names the close code.
func (c *gatewayClient) read() ([]byte, error) {
	for {
		msg, op, err := wsutil.ReadServerData(c.conn)
		if err != nil {
			var ce wsutil.ClosedError
			if errors.As(err, &ce) {
				return nil, fmt.Errorf("host closed the connection: %d %s", ce.Code, ce.Reason)
			}
			return nil, fmt.Errorf("reading from host: %w", err)
		}
		if op == ws.OpText {
			return msg, nil
		}
	}
}

// call sends one request and waits for its response, skipping events.
func (c *gatewayClient) call(method string, params, out any) error {
	c.next++
	req, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.next, "method": method, "params": params})
	if err != nil {
		return err
	}
	if err := wsutil.WriteClientText(c.conn, req); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	for {
		msg, err := c.read()
		if err != nil {
			return fmt.Errorf("%s: %w", method, err)
		}
		var resp struct {
			ID     *int            `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(msg, &resp); err != nil || resp.ID == nil || *resp.ID != c.next {
			continue
		}
		if resp.Error != nil {
			return fmt.Errorf("%s: %d %s", method, resp.Error.Code, resp.Error.Message)
		}
		return json.Unmarshal(resp.Result, out)
	}
}

func (c *gatewayClient) close() {
	_ = wsutil.WriteClientMessage(c.conn, ws.OpClose, ws.NewCloseFrameBody(ws.StatusNormalClosure, ""))
	_ = c.conn.Close()
}

// bufferedConn reads through Reader (the handshake's leftover bytes, then
// the connection) and writes and closes Conn.
type bufferedConn struct {
	io.Reader
	net.Conn
}

func (c bufferedConn) Read(p []byte) (int, error) { return c.Reader.Read(p) }
