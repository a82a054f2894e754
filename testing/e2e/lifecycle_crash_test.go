package e2e_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

// TestLifecycleTransportKill50Clients kills the WebSocket plugin with
// SIGKILL while 50 clients hold sessions. The host keeps the port bound
// (it owns the listener), the supervisor's first restart attempt brings a
// new plugin up, and every client reconnects and resumes its own parked
// session: same runtime id, none lost, none duplicated.
func TestLifecycleTransportKill50Clients(t *testing.T) {
	checkNoLeaks(t)
	const n = 50
	s := e2e.Start(t, e2e.Config{Args: []string{"--orphan-grace", "0", "--admin-listen", "127.0.0.1:0"}})
	snaps := make([]snapshot, n)
	clients := make([]*wsclient.Client, n)
	for i := range n {
		clients[i] = s.Dial(t)
		call(t, clients[i], "session.create", map[string]any{"title": fmt.Sprintf("client-%02d", i)}, &snaps[i])
	}
	pid := pluginPID(t, s, 1)
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill ws plugin %d: %v", pid, err)
	}
	for i, c := range clients {
		select {
		case <-c.Closed():
		case <-time.After(10 * time.Second):
			t.Fatalf("client %d still connected 10 s after its plugin was killed", i)
		}
	}

	// Everyone reconnects at once; connections made while no plugin
	// accepts wait in the host's listen backlog.
	type result struct {
		snap  snapshot
		ready time.Time
		err   error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c, err := wsclient.Dial(ctx, "ws://"+s.Addr+"/api/ws", wsclient.Options{Token: s.Token})
			if err != nil {
				results[i].err = fmt.Errorf("dial: %w", err)
				return
			}
			clients[i] = c
			if ev, err := c.NextEvent(ctx); err != nil || ev.Type != "gateway.ready" {
				results[i].err = fmt.Errorf("gateway.ready: %v %s", err, ev.Raw)
				return
			}
			results[i].ready = time.Now()
			results[i].err = c.Call(ctx, "session.resume", map[string]any{"session_id": snaps[i].SessionKey}, &results[i].snap)
		}()
	}
	wg.Wait()
	for _, c := range clients {
		t.Cleanup(func() { c.Close() })
	}
	first := time.Time{}
	for i, r := range results {
		if r.err != nil {
			t.Errorf("client %d: %v", i, r.err)
			continue
		}
		if r.snap.SessionID != snaps[i].SessionID || r.snap.SessionKey != snaps[i].SessionKey {
			t.Errorf("client %d resumed %s (%s), want its own parked session %s (%s)", i, r.snap.SessionID, r.snap.SessionKey, snaps[i].SessionID, snaps[i].SessionKey)
		}
		if first.IsZero() || r.ready.Before(first) {
			first = r.ready
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("first gateway.ready %v after the kill", first.Sub(killed))

	// None lost, none duplicated: 50 live sessions, each key once, each
	// viewed by exactly its client.
	seen := map[string]bool{}
	for _, e := range activeList(t, clients[0]) {
		if seen[e.SessionKey] {
			t.Errorf("session %s listed twice", e.SessionKey)
		}
		seen[e.SessionKey] = true
		if e.Viewers != 1 {
			t.Errorf("session %s has %d viewers, want 1", e.SessionKey, e.Viewers)
		}
	}
	if len(seen) != n {
		t.Errorf("%d live sessions, want %d", len(seen), n)
	}

	// Back within the first backoff step: one restart, and its first
	// attempt started the new plugin.
	if newPID := pluginPID(t, s, 2); newPID == pid {
		t.Errorf("ws plugin pid after the restart is still %d", pid)
	}
	if got := s.Metric(t, "tether_plugin_restarts_total", "plugin=ws"); got != 1 {
		t.Errorf("tether_plugin_restarts_total{plugin=ws}: got %v, want 1", got)
	}
	if failed := logLines(s, "restarting transport plugin"); len(failed) != 0 {
		t.Errorf("restart attempts failed: %v", failed)
	}
	if p := pluginsList(t, s.StateDir)["ws"]; p.Restarts != "1" || p.State != "running" || p.Conns != fmt.Sprint(n) {
		t.Errorf("plugins list ws: %+v, want running, 1 restart, %d connections", p, n)
	}
}
