package rpc

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

// overloadedStore is a store whose StartTurn answers an overload while
// overloaded is set.
type overloadedStore struct {
	*store.Store
	overloaded atomic.Bool
}

func (s *overloadedStore) StartTurn(ctx context.Context, key string, prompt agent.Message, r store.Run) error {
	if s.overloaded.Load() {
		return fmt.Errorf("start turn of %s: %w", key, &store.OverloadError{Queued: 9000, RetryAfter: 1234 * time.Millisecond, Err: context.DeadlineExceeded})
	}
	return s.Store.StartTurn(ctx, key, prompt, r)
}

// TestSubmitOverloadedAnswer: a prompt.submit the store could not take
// in time is answered 5003 with data.retry_after_ms (the store's hint),
// as the frame goes out of the gateway; once the store takes it, the
// same prompt is served.
func TestSubmitOverloadedAnswer(t *testing.T) {
	inner, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	st := &overloadedStore{Store: inner}
	m := metrics.New()
	tbl := session.NewTable(session.Config{Store: st, Agents: agent.NewEchoFactory(0), Log: zerolog.Nop(), Metrics: m})
	gw := New(tbl, inner, "test", zerolog.Nop(), m)
	t.Cleanup(func() {
		gw.Close()
		if err := tbl.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		inner.Close()
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
	st.overloaded.Store(true)
	c.OnFrame([]byte(`{"jsonrpc":"2.0","id":2,"method":"prompt.submit","params":{"session_id":"`+sid+`","text":"hello"}}`), false)
	frame := out.waitFrame(t, `"id":2`)
	checkOutFrame(t, frame)
	var resp wire.Response
	if err := json.Unmarshal(frame, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Error == nil || resp.Error.Code != wire.CodeStorageUnavailable {
		t.Fatalf("prompt.submit while overloaded: got %s, want error 5003", frame)
	}
	var data wire.RetryData
	if err := json.Unmarshal(resp.Error.Data, &data); err != nil || data.RetryAfterMS != 1234 {
		t.Errorf("5003's data: got %s (%v), want {\"retry_after_ms\":1234}", resp.Error.Data, err)
	}
	st.overloaded.Store(false)
	c.OnFrame([]byte(`{"jsonrpc":"2.0","id":3,"method":"prompt.submit","params":{"session_id":"`+sid+`","text":"hello"}}`), false)
	var served wire.Response
	if err := json.Unmarshal(out.waitFrame(t, `"id":3`), &served); err != nil || served.Error != nil {
		t.Errorf("prompt.submit once the store takes it: got %v %v, want a result", err, served.Error)
	}
	out.waitFrame(t, `"message.complete"`)
}
