package e2e_test

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
)

func TestMain(m *testing.M) {
	if os.Getenv(fakeTransportEnv) != "" {
		// Re-executed as a plugin by a test (see fakeTransportScript).
		serveFakeTransport(os.Getenv(fakeTransportEnv))
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

// TestSessionsCommand runs a one-shot client command against a host.
func TestSessionsCommand(t *testing.T) {
	s := e2e.Start(t, e2e.Config{})
	stdout, stderr, exit := e2e.Tether(t, "sessions", "--url", s.URL, "--token", s.Token)
	if exit != 0 {
		t.Fatalf("tether sessions: exit %d\nstdout:\n%s\nstderr:\n%s", exit, stdout, stderr)
	}
	_, stderr, exit = e2e.Tether(t, "sessions", "--url", s.URL, "--token", "wrong")
	if exit == 0 {
		t.Errorf("tether sessions with a wrong token: exit 0, want an error\nstderr:\n%s", stderr)
	}
}
