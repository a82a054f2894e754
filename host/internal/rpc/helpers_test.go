package rpc

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/host/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newTestTable returns a table over a fresh database with echo agents;
// it is shut down and closed when the test ends.
func newTestTable(tb testing.TB) (*session.Table, *store.Store, *metrics.Metrics) {
	tb.Helper()
	st, err := store.Open(context.Background(), filepath.Join(tb.TempDir(), "state.db"))
	if err != nil {
		tb.Fatalf("open store: %v", err)
	}
	m := metrics.New()
	tbl := session.NewTable(session.Config{Store: st, Agents: agent.NewEchoFactory(0), Log: zerolog.Nop(), Metrics: m})
	tb.Cleanup(func() {
		if err := tbl.Shutdown(context.Background()); err != nil {
			tb.Errorf("shutdown: %v", err)
		}
		st.Close()
	})
	return tbl, st, m
}

// handle decodes and dispatches one request frame on the caller's
// goroutine, as the connection's worker does.
func (c *conn) handle(data []byte) {
	req, rerr := decodeRequest(data)
	if rerr != nil {
		c.respond(nullID, nil, rerr)
		return
	}
	c.dispatch(req, false)
}

// boundCount is the number of live sessions the connection holds a
// binding of.
func (c *conn) boundCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.bindings)
}

// adminWho is the access token's identity.
var adminWho = access.Identity{Name: access.AdminName, Scopes: []string{access.ScopeAdmin}}

// as makes the connection's credential who.
func (c *conn) as(who access.Identity) *conn {
	c.who = who
	return c
}
