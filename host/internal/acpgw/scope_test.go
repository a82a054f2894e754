package acpgw

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/coder/acp-go-sdk"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/wire"
)

// TestACPScopes: each kind of credential against the /acp calls that
// reach a session — session/new, session/load, session/prompt,
// session/cancel — and session/list. An allowed call works; one outside
// the scope closes the connection 4403 and changes nothing (the
// session's stored messages are as before); the list shows only what
// the credential reaches.
func TestACPScopes(t *testing.T) {
	e := newEnv(t, agent.NewEchoFactory(0))
	bg := context.Background()
	book := access.NewBook(e.st, zerolog.Nop())
	if err := book.SetAccessToken(bg, access.AdminName, "admintoken"); err != nil {
		t.Fatal(err)
	}
	e.gw.SetCredentials(book)
	admin := e.connect()
	admin.initialize(t)
	keyA := admin.newSession(t, "/srv/a")
	if _, err := admin.prompt(t, keyA, "first"); err != nil {
		t.Fatal(err)
	}
	keyB := admin.newSession(t, "/srv/b")
	who := map[string]access.Identity{"admin": adminWho}
	for col, scopes := range map[string][]string{
		"new": nil, "session:A": {access.SessionScope(keyA, false)},
		"session:A:view": {access.SessionScope(keyA, true)}, "session:B": {access.SessionScope(keyB, false)},
	} {
		secret, _, err := book.Create(bg, "c-"+col[len(col)-1:]+col[:1], access.KindMade, scopes, 0)
		if err != nil {
			t.Fatal(err)
		}
		if who[col], err = book.Verify(secret); err != nil {
			t.Fatal(err)
		}
	}
	stored := func() int {
		msgs, err := e.st.Messages(bg, keyA)
		if err != nil {
			t.Fatal(err)
		}
		return len(msgs)
	}
	calls := []struct {
		name    string
		allowed []string
		do      func(t *testing.T, cl *client) error
	}{
		{"session/new", []string{"admin", "new"}, func(t *testing.T, cl *client) error {
			_, err := cl.cs.NewSession(ctx(t), acp.NewSessionRequest{Cwd: "/srv/n", McpServers: []acp.McpServer{}})
			return err
		}},
		{"session/load", []string{"admin", "session:A", "session:A:view"}, func(t *testing.T, cl *client) error {
			_, err := cl.cs.LoadSession(ctx(t), acp.LoadSessionRequest{SessionId: acp.SessionId(keyA), Cwd: "/srv/a", McpServers: []acp.McpServer{}})
			return err
		}},
		{"session/prompt", []string{"admin", "session:A"}, func(t *testing.T, cl *client) error {
			// Loaded first when the credential may load it: a viewer is
			// refused the prompt, not the load.
			_, _ = cl.cs.LoadSession(ctx(t), acp.LoadSessionRequest{SessionId: acp.SessionId(keyA), Cwd: "/srv/a", McpServers: []acp.McpServer{}})
			_, err := cl.prompt(t, keyA, "again")
			return err
		}},
		{"session/cancel", []string{"admin", "session:A"}, func(t *testing.T, cl *client) error {
			_, _ = cl.cs.LoadSession(ctx(t), acp.LoadSessionRequest{SessionId: acp.SessionId(keyA), Cwd: "/srv/a", McpServers: []acp.McpServer{}})
			if err := cl.cs.Cancel(ctx(t), acp.CancelNotification{SessionId: acp.SessionId(keyA)}); err != nil {
				return err
			}
			// A notification has no answer, and the SDK serves it apart
			// from requests: a refused one closes the connection soon.
			select {
			case <-cl.out.gone:
				return errors.New("closed")
			case <-time.After(2 * time.Second):
			}
			_, err := cl.cs.ListSessions(ctx(t), acp.ListSessionsRequest{})
			return err
		}},
	}
	for _, call := range calls {
		for _, col := range []string{"admin", "new", "session:A", "session:A:view", "session:B"} {
			t.Run(call.name+"/"+col, func(t *testing.T) {
				cl := e.connectAs(who[col])
				cl.initialize(t)
				before := stored()
				err := call.do(t, cl)
				cl.out.mu.Lock()
				closed, code := cl.out.closed, cl.out.code
				cl.out.mu.Unlock()
				if slices.Contains(call.allowed, col) {
					if err != nil || closed {
						t.Fatalf("allowed call: %v (closed %v, code %d)", err, closed, code)
					}
					return
				}
				if err == nil || !closed || code != wire.CloseForbidden {
					t.Fatalf("refused call: err %v, closed %v code %d; want the connection closed 4403", err, closed, code)
				}
				if after := stored(); after != before {
					t.Fatalf("a refused call changed session A: %d stored messages, want %d", after, before)
				}
			})
		}
	}
	for col, want := range map[string]int{"admin": -1, "session:A": 1, "session:A:view": 1, "session:B": 1} {
		cl := e.connectAs(who[col])
		cl.initialize(t)
		resp, err := cl.cs.ListSessions(ctx(t), acp.ListSessionsRequest{})
		if err != nil {
			t.Fatalf("%s: list: %v", col, err)
		}
		if want >= 0 && len(resp.Sessions) != want {
			t.Errorf("%s lists %d sessions, want %d", col, len(resp.Sessions), want)
		}
		if want < 0 && len(resp.Sessions) < 3 {
			t.Errorf("admin lists %d sessions, want every one", len(resp.Sessions))
		}
	}
}
