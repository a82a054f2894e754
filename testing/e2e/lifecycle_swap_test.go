package e2e_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

// TestLifecycleHotSwapUnderTraffic swaps the transport plugin three times
// — `tether plugins reload ws`, SIGHUP, and `reload ws --plugin-path` to
// another binary — while clients loop connect / create or resume /
// prompt / close. No connection is ever refused; the sockets of a swapped
// process are closed with 1012 and their clients resume; every session
// is resumable afterwards.
func TestLifecycleHotSwapUnderTraffic(t *testing.T) {
	checkNoLeaks(t)
	s := e2e.Start(t, e2e.Config{Args: []string{"--orphan-grace", "0", "--echo-delay", "2ms", "--admin-listen", "127.0.0.1:0"}})

	// Sockets held across the first swap, each with its session.
	const held = 5
	heldClients := make([]*wsclient.Client, held)
	heldSnaps := make([]snapshot, held)
	for i := range held {
		heldClients[i] = s.Dial(t)
		call(t, heldClients[i], "session.create", map[string]any{"title": fmt.Sprintf("held-%d", i)}, &heldSnaps[i])
	}

	const workers = 6
	var (
		rounds    atomic.Int64
		restarted atomic.Int64 // calls cut by a 1012, then redone
		mu        sync.Mutex
		refused   []string
		keys      = make([]string, workers)
	)
	refuse := func(format string, args ...any) {
		mu.Lock()
		refused = append(refused, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; ; round++ {
				select {
				case <-stop:
					return
				default:
				}
				err := trafficRound(s, &keys[w], fmt.Sprintf("worker %d round %d", w, round))
				var ce *client.CloseError
				switch {
				case err == nil:
					rounds.Add(1)
				case errors.As(err, &ce) && ce.Code == 1012:
					restarted.Add(1) // swapped mid-round: go again
				default:
					refuse("worker %d round %d: %v", w, round, err)
				}
			}
		}()
	}
	waitRounds := func(n int64) {
		t.Helper()
		target := rounds.Load() + n
		deadline := time.Now().Add(30 * time.Second)
		for rounds.Load() < target {
			if time.Now().After(deadline) {
				t.Fatalf("traffic stalled at %d rounds (want %d); refused: %q", rounds.Load(), target, refused)
			}
			time.Sleep(10 * time.Millisecond) // polling the workers' counter
		}
	}

	waitRounds(20)
	pids := []int{pluginPID(t, s, 1)}
	if out, errOut, code := e2e.Tether(t, "plugins", "reload", "ws", "--state-dir", s.StateDir); code != 0 {
		t.Fatalf("plugins reload ws: exit %d\n%s%s", code, out, errOut)
	}
	pids = append(pids, pluginPID(t, s, 2))
	for i, c := range heldClients {
		select {
		case <-c.Closed():
		case <-time.After(10 * time.Second):
			t.Fatalf("held client %d still open 10 s after the swap", i)
		}
		if code, _ := c.CloseCode(); code != 1012 {
			t.Errorf("held client %d closed with %d at the swap, want 1012", i, code)
		}
	}
	waitRounds(20)
	if err := s.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	pids = append(pids, pluginPID(t, s, 3))
	waitRounds(20)

	// Another binary: a script that runs the built-in plugin, with its
	// checksum.
	script := filepath.Join(t.TempDir(), "ws-plugin.sh")
	body := fmt.Sprintf("#!/bin/sh\nexec %s plugin ws \"$@\"\n", e2e.Build(t))
	if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(body))
	if out, errOut, code := e2e.Tether(t, "plugins", "reload", "ws", "--plugin-path", script+"#"+hex.EncodeToString(sum[:]), "--state-dir", s.StateDir); code != 0 {
		t.Fatalf("plugins reload ws --plugin-path: exit %d\n%s%s", code, out, errOut)
	}
	pids = append(pids, pluginPID(t, s, 4))
	waitRounds(20)
	close(stop)
	wg.Wait()

	for i, p := range pids {
		for _, q := range pids[:i] {
			if p == q {
				t.Errorf("plugin pids across the swaps %v: want a new process each time", pids)
			}
		}
		if i < len(pids)-1 {
			waitPIDGone(t, p, 10*time.Second)
		}
	}
	if len(refused) > 0 {
		t.Errorf("%d failures during the swaps (want none), e.g. %q", len(refused), refused[:min(len(refused), 5)])
	}
	t.Logf("%d rounds, %d cut by a 1012 and redone", rounds.Load(), restarted.Load())

	// Every session is resumable: the held ones are still the same live
	// sessions, and every worker's.
	c := s.Dial(t)
	for i, snap := range heldSnaps {
		var got snapshot
		call(t, c, "session.resume", map[string]any{"session_id": snap.SessionKey}, &got)
		if got.SessionID != snap.SessionID {
			t.Errorf("held session %d resumed as %s, want the parked %s", i, got.SessionID, snap.SessionID)
		}
	}
	for w, key := range keys {
		var got snapshot
		call(t, c, "session.resume", map[string]any{"session_id": key}, &got)
		if got.MessageCount == 0 {
			t.Errorf("worker %d's session %s resumed with no messages", w, key)
		}
	}
	if got := s.Metric(t, "tether_plugin_reloads_total", "plugin=ws"); got != 3 {
		t.Errorf("tether_plugin_reloads_total{plugin=ws}: got %v, want 3", got)
	}
	if got := s.Metric(t, "tether_plugin_restarts_total", "plugin=ws"); got != 0 {
		t.Errorf("tether_plugin_restarts_total{plugin=ws}: got %v, want 0 (swaps are no crashes)", got)
	}
	out, errOut, code := e2e.Tether(t, "plugins", "list", "--json", "--state-dir", s.StateDir)
	var list []struct{ Name, Path string }
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) == 0 || list[0].Name != "ws" || list[0].Path != script {
		t.Errorf("plugins list --json: exit %d, %s%s; want ws running %s", code, out, errOut, script)
	}
}

// trafficRound is one client round: connect, create the worker's session
// (the first time) or resume it, prompt, wait for the answer, close. An
// error that is a *client.CloseError with 1012 means the socket's plugin
// was swapped under it.
func trafficRound(s *e2e.Server, key *string, text string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := wsclient.Dial(ctx, "ws://"+s.Addr+"/api/ws", wsclient.Options{Token: s.Token})
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	if ev, err := c.NextEvent(ctx); err != nil || ev.Type != "gateway.ready" {
		return closeErr(c, fmt.Errorf("gateway.ready: %v %s", err, ev.Raw))
	}
	var snap snapshot
	if *key == "" {
		err = c.Call(ctx, "session.create", map[string]any{"title": text}, &snap)
	} else {
		err = c.Call(ctx, "session.resume", map[string]any{"session_id": *key}, &snap)
	}
	if err != nil {
		return closeErr(c, err)
	}
	*key = snap.SessionKey
	if snap.Status == "working" {
		// The run of a round cut short by a swap goes on (a disconnect
		// never interrupts a run); this socket views it to its end.
		if _, err := c.WaitEvent(ctx, func(e wsclient.Event) bool { return e.Type == "message.complete" && e.SessionID == snap.SessionID }); err != nil {
			return closeErr(c, err)
		}
	}
	if err := c.Call(ctx, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": text}, nil); err != nil {
		return closeErr(c, err)
	}
	ev, err := c.WaitEvent(ctx, func(e wsclient.Event) bool { return e.Type == "message.complete" && e.SessionID == snap.SessionID })
	if err != nil {
		return closeErr(c, err)
	}
	var done struct{ Text, Status string }
	if err := ev.Decode(&done); err != nil || done.Status != "complete" || !strings.Contains(done.Text, text) {
		// A run cut short by its socket's swap is interrupted; no error.
		if done.Status == "interrupted" {
			return nil
		}
		return fmt.Errorf("message.complete %s", ev.Payload)
	}
	return nil
}

// closeErr returns the connection's *client.CloseError when it has
// ended, else err.
func closeErr(c *wsclient.Client, err error) error {
	select {
	case <-c.Closed():
		code, reason := c.CloseCode()
		return &client.CloseError{Code: code, Reason: reason, Err: err}
	default:
		return err
	}
}
