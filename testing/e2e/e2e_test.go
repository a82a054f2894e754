package e2e_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

func TestMain(m *testing.M) {
	if os.Getenv(fakeTransportEnv) != "" {
		// Re-executed as a plugin by a test (see fakeTransportScript).
		serveFakeTransport(os.Getenv(fakeTransportEnv))
		return
	}
	if os.Getenv(hookPluginEnv) != "" {
		// Re-executed as a notifier plugin (see hookPluginScript).
		serveHookPlugin()
		return
	}
	e2e.Main(m)
}

// TestServeLifecycle is the harness's own test against the real binary:
// start, health check, the gateway's ready event, graceful shutdown.
func TestServeLifecycle(t *testing.T) {
	s := e2e.Start(t, e2e.Config{})
	if first, _, _ := strings.Cut(s.Stdout(), "\n"); !strings.HasPrefix(first, "tether listening on http://") {
		t.Errorf("first stdout line: got %q, want the listening line", first)
	}
	if s.Token == "" || s.Addr == "" || s.URL != "http://"+s.Addr {
		t.Errorf("parsed listening line: got URL %q addr %q token %q", s.URL, s.Addr, s.Token)
	}

	status, body := s.Get(t, "/healthz")
	if status != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("GET /healthz: got %d %q, want 200 ok", status, body)
	}

	c, ready := s.DialReady(t)
	var p struct {
		Version *string `json:"version"`
	}
	if err := ready.Decode(&p); err != nil || p.Version == nil || *p.Version == "" {
		t.Errorf("gateway.ready payload: got %s (%v), want a version", ready.Payload, err)
	}
	c.Close()

	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	code, err := s.Wait(5 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("after SIGTERM: got exit %d, %v; want 0 within 5s", code, err)
	}
}

// TestAdminMetrics checks the admin line and a scrape of /metrics.
func TestAdminMetrics(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--admin-listen", "127.0.0.1:0"}})
	if !strings.HasPrefix(s.AdminURL, "http://") {
		t.Fatalf("AdminURL: got %q, want http://HOST:PORT", s.AdminURL)
	}
	s.Dial(t)
	if got := s.Metric(t, "tether_live_sessions"); got != 0 {
		t.Errorf("tether_live_sessions: got %v, want 0", got)
	}
}

// TestSessionsCommand runs `tether sessions` against a host, reading the
// token from the host's token file: the table, and --json with a session
// left live (listed live and stored, not ended) and one closed (stored
// only, ended "closed").
func TestSessionsCommand(t *testing.T) {
	s := e2e.Start(t, e2e.Config{})
	c := s.Dial(t)
	var open, done snapshot
	call(t, c, "session.create", map[string]any{"title": "left open"}, &open)
	call(t, c, "prompt.submit", map[string]any{"session_id": open.SessionID, "text": "hello"}, nil)
	waitComplete(t, c, open.SessionID)
	call(t, c, "session.create", map[string]any{"title": "closed one"}, &done)
	call(t, c, "session.close", map[string]any{"session_id": done.SessionID}, nil)
	// A session whose last run a named credential started ("who started
	// the last run").
	out, errOut, exit := e2e.Tether(t, "token", "create", "--name", "robot", "--json", "--url", s.URL, "--state-dir", s.StateDir)
	var made struct {
		Secret string `json:"secret"`
	}
	if err := json.Unmarshal([]byte(out), &made); exit != 0 || err != nil || made.Secret == "" {
		t.Fatalf("tether token create --json: exit %d, %v\nstdout:\n%s\nstderr:\n%s", exit, err, out, errOut)
	}
	robot := s.Dial(t, func(o *wsclient.Options) { o.Token = made.Secret })
	var bots snapshot
	call(t, robot, "session.create", map[string]any{"title": "robot's"}, &bots)
	call(t, robot, "prompt.submit", map[string]any{"session_id": bots.SessionID, "text": "beep"}, nil)
	waitComplete(t, robot, bots.SessionID)

	stdout, stderr, exit := e2e.Tether(t, "sessions", "--url", s.URL, "--state-dir", s.StateDir)
	if exit != 0 || stderr != "" || !strings.HasPrefix(stdout, "LIVE") || !strings.Contains(stdout, open.SessionID) || !strings.Contains(stdout, "closed one") {
		t.Errorf("tether sessions: exit %d\nstdout:\n%s\nstderr:\n%s\nwant 0, the table with both sessions, no stderr", exit, stdout, stderr)
	}
	byKey := map[string]string{}
	for _, line := range strings.Split(stdout, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			byKey[f[0]] = line
		}
	}
	if !strings.Contains(stdout, "LAST RUN BY") || !strings.Contains(byKey[open.SessionKey], " admin ") ||
		!strings.Contains(byKey[bots.SessionKey], " robot ") || strings.Contains(byKey[done.SessionKey], "admin") {
		t.Errorf("tether sessions:\n%s\nwant a LAST RUN BY column: admin for %s, robot for %s, nobody for %s", stdout, open.SessionKey, bots.SessionKey, done.SessionKey)
	}

	stdout, stderr, exit = e2e.Tether(t, "sessions", "--json", "--url", s.URL, "--state-dir", s.StateDir)
	if exit != 0 || stderr != "" {
		t.Fatalf("tether sessions --json: exit %d\nstdout:\n%s\nstderr:\n%s", exit, stdout, stderr)
	}
	var got struct {
		Live []struct {
			ID           string         `json:"id"`
			SessionKey   string         `json:"session_key"`
			Title        string         `json:"title"`
			Status       string         `json:"status"`
			MessageCount int            `json:"message_count"`
			StartedAt    int64          `json:"started_at"`
			LastActive   int64          `json:"last_active"`
			Viewers      int            `json:"viewers"`
			Transports   map[string]int `json:"transports"`
		} `json:"live"`
		Stored []struct {
			ID           string `json:"id"`
			Title        string `json:"title"`
			StartedAt    int64  `json:"started_at"`
			EndedAt      *int64 `json:"ended_at"`
			EndReason    string `json:"end_reason"`
			MessageCount int    `json:"message_count"`
			LastActive   int64  `json:"last_active"`
			LastRunBy    string `json:"last_run_by"`
		} `json:"stored"`
	}
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("tether sessions --json printed %q: %v", stdout, err)
	}
	live := -1
	for i, l := range got.Live {
		if l.ID == open.SessionID {
			live = i
		}
	}
	if len(got.Live) != 2 || live < 0 {
		t.Fatalf("live: %+v, want %s and the robot's", got.Live, open.SessionID)
	}
	if l := got.Live[live]; l.ID != open.SessionID || l.SessionKey != open.SessionKey || l.Title != "left open" || l.Status != "idle" || l.MessageCount != 2 || l.Viewers != 1 || l.Transports["ws"] != 1 || l.StartedAt == 0 || l.LastActive < l.StartedAt {
		t.Errorf("live: %+v, want %s (key %s) \"left open\", idle, 2 messages, 1 viewer on ws, start and last-active times", l, open.SessionID, open.SessionKey)
	}
	stored := map[string]int{}
	for i, r := range got.Stored {
		stored[r.ID] = i
	}
	if i, ok := stored[open.SessionKey]; !ok {
		t.Errorf("stored: %+v, want %s listed", got.Stored, open.SessionKey)
	} else if r := got.Stored[i]; r.Title != "left open" || r.EndedAt != nil || r.MessageCount != 2 || r.StartedAt == 0 || r.LastRunBy != "admin" {
		t.Errorf("stored %s: %+v, want \"left open\", not ended, 2 messages, a start time, last run by admin", open.SessionKey, r)
	}
	if i, ok := stored[done.SessionKey]; !ok {
		t.Errorf("stored: %+v, want %s listed", got.Stored, done.SessionKey)
	} else if r := got.Stored[i]; r.Title != "closed one" || r.EndedAt == nil || r.EndReason != "closed" || r.MessageCount != 0 || r.LastRunBy != "" {
		t.Errorf("stored %s: %+v, want \"closed one\", ended, reason closed, no message", done.SessionKey, r)
	}

	// A wrong --token (a flag beats the token file) gets the one
	// explained line and exit 1; TestAccessClientTokenMessages has the
	// TETHER_TOKEN and no-token cases.
	stdout, stderr, exit = e2e.Tether(t, "sessions", "--url", s.URL, "--state-dir", s.StateDir, "--token", "wrong")
	want := "tether sessions: the host refused the access token (4401 unauthorized): set TETHER_TOKEN to the host's token, or run this as the host's user on its machine so that its token file (" + filepath.Join(s.StateDir, "token") + ") is read\n"
	if exit != 1 || stderr != want || stdout != "" {
		t.Errorf("tether sessions --token wrong: exit %d, stdout %q, stderr %q; want 1, nothing, %q", exit, stdout, stderr, want)
	}
}
