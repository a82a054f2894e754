package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/ownership"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

func TestToRPCError(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"unknown session", session.ErrUnknownSession, wire.CodeUnknownSession},
		{"unknown session wrapped", fmt.Errorf("deadbeef: %w", session.ErrUnknownSession), wire.CodeUnknownSession},
		{"stored not found", session.ErrStoredNotFound, wire.CodeStoredNotFound},
		{"stored not found wrapped", fmt.Errorf("%q: %w", "title", session.ErrStoredNotFound), wire.CodeStoredNotFound},
		{"no longer live", session.ErrNoLongerLive, wire.CodeStoredNotFound},
		{"no longer live wrapped", fmt.Errorf("k: %v: %w", context.Canceled, session.ErrNoLongerLive), wire.CodeStoredNotFound},
		{"session busy", session.ErrSessionBusy, wire.CodeSessionBusy},
		{"session busy wrapped", fmt.Errorf("abcd1234: %w", session.ErrSessionBusy), wire.CodeSessionBusy},
		{"build failed", session.ErrBuildFailed, wire.CodeResumeFailed},
		{"build failed wrapped", fmt.Errorf("agent for k: %v: %w", errors.New("exec: not found"), session.ErrBuildFailed), wire.CodeResumeFailed},
		{"table closed", session.ErrTableClosed, wire.CodeResumeFailed},
		// As the table wraps an ownership store's refusal (ownersError).
		{"owners unavailable", fmt.Errorf("claim k: %v: %w", ownership.ErrUnavailable, session.ErrOwnersUnavailable), wire.CodeOwnerUnreachable},
		{"owned elsewhere", fmt.Errorf("bind k: %v: %w", ownership.ErrConflict, session.ErrOwnedElsewhere), wire.CodeResumeFailed},
		// As the table wraps a shared store that did not answer a resume
		// (a cluster electing leaders): retry, not a storage fault.
		{"cluster store unreachable", fmt.Errorf("load k: %v: %w", fmt.Errorf("%w: %w: %w", context.DeadlineExceeded, store.ErrUnreachable, store.ErrUnavailable), session.ErrStoreUnreachable), wire.CodeOwnerUnreachable},
		{"storage fault", fmt.Errorf("load k: %v: %w", store.ErrUnavailable, session.ErrStorageUnavailable), wire.CodeStorageUnavailable},
		{"overloaded", fmt.Errorf("submit to s: %w: %w", &store.OverloadError{RetryAfter: time.Second, Err: context.DeadlineExceeded}, session.ErrOverloaded), wire.CodeStorageUnavailable},
		{"rpc error kept", errorf(wire.CodeInvalidParams, "x must be a string"), wire.CodeInvalidParams},
		{"rpc error wrapped", fmt.Errorf("outer: %w", errorf(wire.CodeSessionRequired, "session_id required")), wire.CodeSessionRequired},
		// Anything else is a bug or an unexpected failure: -32603.
		{"unexpected", errors.New("disk on fire"), wire.CodeInternalError},
		{"unexpected wrapped", fmt.Errorf("list stored sessions: %w", errors.New("database is locked")), wire.CodeInternalError},
		{"context error", context.DeadlineExceeded, wire.CodeInternalError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := toRPCError(tt.err)
			if got == nil {
				t.Fatalf("toRPCError(%v): got nil, want code %d", tt.err, tt.want)
			}
			if got.Code != tt.want {
				t.Errorf("toRPCError(%v): got code %d (%q), want %d", tt.err, got.Code, got.Message, tt.want)
			}
			if got.Message == "" {
				t.Errorf("toRPCError(%v): got an empty message, want one", tt.err)
			}
		})
	}
	// 5002 says its code's words first, and the cause once.
	unreachable := fmt.Errorf("load k: asking the cluster's meta leader: %v: %w", fmt.Errorf("%w: %w", context.DeadlineExceeded, store.ErrUnreachable), session.ErrStoreUnreachable)
	if got, want := toRPCError(unreachable).Message, "owner unreachable; retry: load k: asking the cluster's meta leader: context deadline exceeded: cluster store unreachable"; got != want {
		t.Errorf("toRPCError(store unreachable): got message %q, want %q", got, want)
	}
	// Only an overload's 5003 carries a retry hint: a storage fault's
	// write may be refused again at once.
	if got := toRPCError(fmt.Errorf("load k: %v: %w", store.ErrUnavailable, session.ErrStorageUnavailable)); got.Data != nil {
		t.Errorf("toRPCError(storage fault): got data %v, want none", got.Data)
	}
	if got := toRPCError(fmt.Errorf("submit: %w", session.ErrOverloaded)); got.Data != (wire.RetryData{RetryAfterMS: 1000}) {
		t.Errorf("toRPCError(overloaded, no hint of the store's): got data %v, want retry_after_ms 1000", got.Data)
	}
	// The internal error names its cause, so a bug report carries it.
	if got := toRPCError(errors.New("disk on fire")); !strings.Contains(got.Message, "disk on fire") {
		t.Errorf("toRPCError(unexpected): got message %q, want it to contain the cause", got.Message)
	}
}

// recordingSender is a sender that keeps every command a connection sends.
type recordingSender struct {
	mu   sync.Mutex // guards cmds
	cmds []contract.Command
}

func (s *recordingSender) Send(cmd contract.Command) {
	s.mu.Lock()
	s.cmds = append(s.cmds, cmd)
	s.mu.Unlock()
}

// frames returns the data of the Send commands so far.
func (s *recordingSender) frames() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([][]byte, 0, len(s.cmds))
	for _, c := range s.cmds {
		if c.Kind == contract.CommandSend {
			out = append(out, c.Data)
		}
	}
	return out
}

// specCodes are the JSON-RPC error codes of docs/PROTOCOL.md, section 11.
var specCodes = map[int]bool{
	wire.CodeParseError:         true,
	wire.CodeInvalidRequest:     true,
	wire.CodeMethodNotFound:     true,
	wire.CodeInvalidParams:      true,
	wire.CodeInternalError:      true,
	wire.CodeBusy:               true,
	wire.CodeUnknownSession:     true,
	wire.CodeSessionRequired:    true,
	wire.CodeStoredNotFound:     true,
	wire.CodeSessionBusy:        true,
	wire.CodeResumeFailed:       true,
	wire.CodeStorageUnavailable: true,
	wire.CodeAlreadyResolved:    true,
	wire.CodeForbidden:          true,
}

// outFrame is a frame the gateway sends, decoded: a response or an event.
type outFrame struct {
	ID    json.RawMessage // nil for an event
	Error *rpcError       // nil for a result or an event
}

// checkOutFrame checks one frame the gateway sent: valid JSON, an object
// with "jsonrpc":"2.0", and either an event (method "event", no id) or a
// response with an id and exactly one of result and error, whose code is
// one of docs/PROTOCOL.md's (section 11).
func checkOutFrame(tb testing.TB, frame []byte) outFrame {
	tb.Helper()
	if !json.Valid(frame) {
		tb.Fatalf("gateway sent invalid JSON: %q", frame)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(frame, &m); err != nil {
		tb.Fatalf("gateway sent %q, not an object: %v", frame, err)
	}
	if string(m["jsonrpc"]) != `"2.0"` {
		tb.Fatalf("gateway sent %s: got no \"jsonrpc\":\"2.0\"", frame)
	}
	id, hasID := m["id"]
	result, hasResult := m["result"]
	rawErr, hasError := m["error"]
	if !hasID {
		if string(m["method"]) != `"event"` || hasResult || hasError {
			tb.Fatalf("gateway sent %s: got a frame without id that is not an event", frame)
		}
		return outFrame{}
	}
	if _, ok := m["method"]; ok {
		tb.Fatalf("gateway sent %s: a response with a method", frame)
	}
	if hasResult == hasError {
		tb.Fatalf("gateway sent %s: want exactly one of result and error", frame)
	}
	if hasResult {
		if string(result) == "null" {
			tb.Fatalf("gateway sent %s: a null result", frame)
		}
		return outFrame{ID: id}
	}
	var e struct {
		Code    *int    `json:"code"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(rawErr, &e); err != nil || e.Code == nil || e.Message == nil {
		tb.Fatalf("gateway sent %s: error without code or message", frame)
	}
	if !specCodes[*e.Code] {
		tb.Fatalf("gateway sent %s: code %d is not in docs/PROTOCOL.md", frame, *e.Code)
	}
	// -32603 is the bug code: no input reaches it on a healthy table and
	// database.
	if *e.Code == wire.CodeInternalError {
		tb.Fatalf("gateway sent %s: internal error for client input", frame)
	}
	return outFrame{ID: id, Error: &rpcError{Code: *e.Code, Message: *e.Message}}
}

// TestGatewayOneResponsePerFrame checks what the fuzz target cannot: each
// malformed frame gets exactly one response with docs/PROTOCOL.md's code and id.
func TestGatewayOneResponsePerFrame(t *testing.T) {
	tbl, st, m := newTestTable(t)
	gw := New(tbl, st, "test", zerolog.Nop(), m)
	defer gw.Close()
	tests := []struct {
		name   string
		frame  string
		binary bool
		wantID string
		code   int // 0: a result
	}{
		{name: "not json", frame: "not json", wantID: "null", code: wire.CodeParseError},
		{name: "empty", frame: "", wantID: "null", code: wire.CodeParseError},
		{name: "truncated", frame: `{"jsonrpc":"2.0","id":1,`, wantID: "null", code: wire.CodeParseError},
		{name: "batch", frame: `[{"jsonrpc":"2.0","id":1,"method":"session.list"}]`, wantID: "null", code: wire.CodeInvalidRequest},
		{name: "array", frame: `[1]`, wantID: "null", code: wire.CodeInvalidRequest},
		{name: "number", frame: `7`, wantID: "null", code: wire.CodeInvalidRequest},
		{name: "binary", frame: `{"jsonrpc":"2.0","id":1,"method":"session.list"}`, binary: true, wantID: "null", code: wire.CodeInvalidRequest},
		{name: "no method", frame: `{"id":1}`, wantID: "1", code: wire.CodeInvalidRequest},
		{name: "numeric method", frame: `{"jsonrpc":"2.0","id":2,"method":5}`, wantID: "2", code: wire.CodeInvalidRequest},
		{name: "null method", frame: `{"jsonrpc":"2.0","id":2,"method":null}`, wantID: "2", code: wire.CodeInvalidRequest},
		{name: "wrong version", frame: `{"jsonrpc":"1.0","id":3,"method":"session.list"}`, wantID: "3", code: wire.CodeInvalidRequest},
		{name: "object id", frame: `{"jsonrpc":"2.0","id":{},"method":"session.list"}`, wantID: "null", code: wire.CodeInvalidRequest},
		{name: "unknown method", frame: `{"jsonrpc":"2.0","id":"s","method":"nope"}`, wantID: `"s"`, code: wire.CodeMethodNotFound},
		{name: "params array", frame: `{"jsonrpc":"2.0","id":4,"method":"session.list","params":[1]}`, wantID: "4", code: wire.CodeInvalidParams},
		{name: "params checked before the method", frame: `{"jsonrpc":"2.0","id":4,"method":"nope","params":[1]}`, wantID: "4", code: wire.CodeInvalidParams},
		{name: "ok", frame: `{"jsonrpc":"2.0","id":5,"method":"session.active_list"}`, wantID: "5"},
		{name: "ok with spaces", frame: " \n{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"session.list\"}\n", wantID: "6"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := &recordingSender{}
			c := gw.newConn(contract.TransportID{Instance: "t", Conn: uint64(i + 1)}, "ws", out).as(adminWho)
			defer c.OnClosed()
			c.OnFrame([]byte(tt.frame), tt.binary)
			gw.wg.Wait()
			sent := out.frames()
			if len(sent) != 1 {
				t.Fatalf("onFrame(%q): got %d frames %q, want 1 response", tt.frame, len(sent), sent)
			}
			f := checkOutFrame(t, sent[0])
			if string(f.ID) != tt.wantID {
				t.Errorf("onFrame(%q): got response %s, want id %s", tt.frame, sent[0], tt.wantID)
			}
			switch {
			case tt.code == 0 && f.Error != nil:
				t.Errorf("onFrame(%q): got error %s, want a result", tt.frame, sent[0])
			case tt.code != 0 && (f.Error == nil || f.Error.Code != tt.code):
				t.Errorf("onFrame(%q): got %s, want code %d", tt.frame, sent[0], tt.code)
			}
		})
	}
	// A notification (no id) gets no response, even when it fails.
	out := &recordingSender{}
	c := gw.newConn(contract.TransportID{Instance: "t", Conn: 1000}, "ws", out).as(adminWho)
	defer c.OnClosed()
	c.OnFrame([]byte(`{"jsonrpc":"2.0","method":"nope"}`), false)
	gw.wg.Wait()
	if sent := out.frames(); len(sent) != 0 {
		t.Errorf("notification: got %q, want no response", sent)
	}
}

// TestGatewayBusy checks the pending-request bound without a socket: a
// worker stuck on its first request leaves maxPending queued, and the next
// one is answered -32000 at once with its id.
func TestGatewayBusy(t *testing.T) {
	tbl, st, m := newTestTable(t)
	gw := New(tbl, st, "test", zerolog.Nop(), m)
	defer gw.Close()
	out := &recordingSender{}
	c := gw.newConn(contract.TransportID{Instance: "t", Conn: 1}, "ws", out).as(adminWho)
	defer c.OnClosed()
	// Fill the queue as a stuck worker would leave it: working is set, so
	// onFrame starts no worker of its own.
	c.mu.Lock()
	for i := 0; i < maxPending; i++ {
		req, rerr := decodeRequest([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"session.active_list"}`, i)))
		if rerr != nil {
			c.mu.Unlock()
			t.Fatalf("decodeRequest: %v", rerr)
		}
		c.queue = append(c.queue, req)
	}
	c.working = true
	c.mu.Unlock()
	c.OnFrame([]byte(`{"jsonrpc":"2.0","id":"over","method":"session.active_list"}`), false)
	sent := out.frames()
	if len(sent) != 1 {
		t.Fatalf("over the bound: got %d frames, want 1", len(sent))
	}
	f := checkOutFrame(t, sent[0])
	if f.Error == nil || f.Error.Code != wire.CodeBusy || string(f.ID) != `"over"` {
		t.Errorf("over the bound: got %s, want -32000 with id \"over\"", sent[0])
	}
	// Let the queued requests run and check they are all answered.
	gw.wg.Add(1)
	go c.work()
	gw.wg.Wait()
	if got := len(out.frames()); got != maxPending+1 {
		t.Errorf("after the worker ran: got %d frames, want %d", got, maxPending+1)
	}
}

// notifyingSender is a recordingSender that signals every command.
type notifyingSender struct {
	recordingSender
	sent chan struct{} // capacity 1
}

func (s *notifyingSender) Send(cmd contract.Command) {
	s.recordingSender.Send(cmd)
	select {
	case s.sent <- struct{}{}:
	default:
	}
}

// waitFrame waits until a sent frame contains want and returns it.
func (s *notifyingSender) waitFrame(t *testing.T, want string) []byte {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		for _, f := range s.frames() {
			if bytes.Contains(f, []byte(want)) {
				return f
			}
		}
		select {
		case <-s.sent:
		case <-timeout:
			t.Fatalf("no frame with %q; sent %q", want, s.frames())
		}
	}
}

// TestGatewayEventsSinceFromJournal checks the hand-over from the link's
// goroutine to the worker: session.events.since is answered inline from
// the ring, and from the journal (by the worker) when the ring no longer
// reaches back far enough; both answers are complete and in order.
func TestGatewayEventsSinceFromJournal(t *testing.T) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	m := metrics.New()
	tbl := session.NewTable(session.Config{Store: st, Agents: agent.NewEchoFactory(0), RingSize: 2, Log: zerolog.Nop(), Metrics: m})
	gw := New(tbl, st, "test", zerolog.Nop(), m)
	t.Cleanup(func() {
		gw.Close()
		if err := tbl.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		st.Close()
	})
	out := &notifyingSender{sent: make(chan struct{}, 1)}
	c := gw.newConn(contract.TransportID{Instance: "t", Conn: 1}, "ws", out).as(adminWho)
	defer c.OnClosed()

	c.OnFrame([]byte(`{"jsonrpc":"2.0","id":1,"method":"session.create"}`), false)
	var created struct {
		Result session.Snapshot `json:"result"`
	}
	if err := json.Unmarshal(out.waitFrame(t, `"id":1`), &created); err != nil {
		t.Fatalf("session.create answer: %v", err)
	}
	sid := created.Result.SessionID
	c.OnFrame([]byte(`{"jsonrpc":"2.0","id":2,"method":"prompt.submit","params":{"session_id":"`+sid+`","text":"one two three four"}}`), false)
	out.waitFrame(t, `"message.complete"`)
	gw.wg.Wait()

	for _, tt := range []struct {
		name     string
		lastSeen int
	}{
		{"ring", 5}, // the ring holds the last two events
		{"journal", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			id := fmt.Sprintf(`"since-%s"`, tt.name)
			c.OnFrame([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":"session.events.since","params":{"session_id":%q,"last_seen":%d}}`, id, sid, tt.lastSeen)), false)
			var got struct {
				Result struct {
					Events    []struct{ Seq uint64 } `json:"events"`
					LatestSeq uint64                 `json:"latest_seq"`
					Truncated bool                   `json:"truncated"`
					Epoch     string                 `json:"epoch"`
				} `json:"result"`
				Error *rpcError `json:"error"`
			}
			if err := json.Unmarshal(out.waitFrame(t, `"id":`+id), &got); err != nil || got.Error != nil {
				t.Fatalf("events.since(%d): got error %v %v, want a result", tt.lastSeen, err, got.Error)
			}
			r := got.Result
			if r.Truncated || r.Epoch == "" || r.LatestSeq < 6 {
				t.Fatalf("events.since(%d): got latest_seq %d truncated %v epoch %q, want all of at least 6 events", tt.lastSeen, r.LatestSeq, r.Truncated, r.Epoch)
			}
			if want := int(r.LatestSeq) - tt.lastSeen; len(r.Events) != want {
				t.Fatalf("events.since(%d): got %d events, want %d", tt.lastSeen, len(r.Events), want)
			}
			for i, e := range r.Events {
				if want := uint64(tt.lastSeen + 1 + i); e.Seq != want {
					t.Errorf("events.since(%d): event %d has seq %d, want %d", tt.lastSeen, i, e.Seq, want)
				}
			}
		})
	}
}
