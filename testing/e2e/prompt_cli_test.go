package e2e_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
)

// sessionKeyLine is what tether prompt prints on stderr first.
var sessionKeyLine = regexp.MustCompile(`(?m)^tether: session (\d{8}_\d{6}_[0-9a-f]{6})$`)

// TestPromptCLI: `tether prompt` with only --state-dir (the host on a
// random port) makes a session, streams the answer to stdout and exits
// 0; the session is named by its prompt; `--session KEY` with the
// prompt on stdin continues it; a session busy with another run exits 1
// with the reason.
func TestPromptCLI(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "", "--echo-delay", "5ms"}})
	stdout, stderr, code := runCLI(t, "", "prompt", "--state-dir", s.StateDir, "hello", "brave", "new", "world")
	if code != 0 || stdout != "hello brave new world\n" {
		t.Fatalf("tether prompt: exit %d, stdout %q, stderr %q; want 0 and the echoed answer", code, stdout, stderr)
	}
	m := sessionKeyLine.FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("stderr %q names no session", stderr)
	}
	key := m[1]

	out, _, code := runCLI(t, "", "sessions", "--state-dir", s.StateDir, "--json")
	var listed struct {
		Stored []struct {
			ID           string `json:"id"`
			Title        string `json:"title"`
			MessageCount int    `json:"message_count"`
		} `json:"stored"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || len(listed.Stored) != 1 {
		t.Fatalf("tether sessions: exit %d, %q", code, out)
	}
	if got := listed.Stored[0]; got.ID != key || got.Title != "hello brave new world" || got.MessageCount != 2 {
		t.Errorf("stored session %+v; want %s titled by its prompt, 2 messages", got, key)
	}

	stdout, stderr, code = runCLI(t, "second turn here\n", "prompt", "--state-dir", s.StateDir, "--session", key)
	if code != 0 || stdout != "second turn here\n" || !strings.Contains(stderr, "tether: session "+key) {
		t.Fatalf("tether prompt --session: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	// Busy: a slow run in flight, a second prompt is refused.
	slow := exec.Command(e2e.Build(t), "prompt", "--state-dir", s.StateDir, "--session", key, strings.Repeat("word ", 400))
	slow.Env = cliEnv()
	slowOut, err := slow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := slow.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slow.Process.Kill(); _ = slow.Wait() })
	if _, err := bufio.NewReader(slowOut).ReadString(' '); err != nil {
		t.Fatalf("the slow prompt streamed nothing: %v", err)
	}
	_, stderr, code = runCLI(t, "", "prompt", "--state-dir", s.StateDir, "--session", key, "not now")
	if code != 1 || !strings.Contains(stderr, "busy") {
		t.Errorf("a prompt while a run is in flight: exit %d, stderr %q; want 1 saying busy", code, stderr)
	}
	// Ctrl-C interrupts the slow one: 130, and the run ends interrupted.
	if err := slow.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err = slow.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
		t.Errorf("the interrupted prompt: %v, want exit status 130", err)
	}
}

// TestPromptCLIFailedRun: a run that fails exits 1 and says so.
func TestPromptCLIFailedRun(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "", "--agent", "exec", "--agent-command", "sh -c 'echo partial; exit 3'"}})
	stdout, stderr, code := runCLI(t, "", "prompt", "--state-dir", s.StateDir, "--new", "anything")
	if code != 1 || !strings.Contains(stderr, "failed") {
		t.Errorf("a failing run: exit %d, stdout %q, stderr %q; want 1 saying it failed", code, stdout, stderr)
	}
}

// TestSessionsTailCLI: `tether sessions tail KEY` prints the session's
// last messages, then follows it: a prompt another client submits shows
// as its prompt and streamed answer; Ctrl-C ends it with 0.
func TestSessionsTailCLI(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "", "--echo-delay", "5ms"}})
	_, stderr, code := runCLI(t, "", "prompt", "--state-dir", s.StateDir, "first question")
	m := sessionKeyLine.FindStringSubmatch(stderr)
	if code != 0 || m == nil {
		t.Fatalf("tether prompt: exit %d, stderr %q", code, stderr)
	}
	tail := exec.Command(e2e.Build(t), "sessions", "tail", "--state-dir", s.StateDir, m[1])
	tail.Env = cliEnv()
	out, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var tailErr strings.Builder
	tail.Stderr = &tailErr
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tail.Process.Kill(); _ = tail.Wait() })
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	want := []string{"user: first question", "assistant: first question"}
	next := func(wantLine string) {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok || l != wantLine {
				t.Fatalf("tail printed %q (open %v), want %q; stderr %q", l, ok, wantLine, tailErr.String())
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("tail printed nothing; want %q", wantLine)
		}
	}
	for _, w := range want {
		next(w)
	}
	if _, stderr, code := runCLI(t, "", "prompt", "--state-dir", s.StateDir, "--session", m[1], "live from elsewhere"); code != 0 {
		t.Fatalf("second prompt: exit %d, %q", code, stderr)
	}
	next("user: live from elsewhere")
	next("assistant: live from elsewhere")
	if err := tail.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := tail.Wait(); err != nil {
		t.Errorf("tail after Ctrl-C: %v, want exit 0", err)
	}
}

// TestStateDirAloneReachesHost: a host on a random port records its
// address in its state dir, so `--state-dir` alone reaches it; the
// record goes when it stops, and a client then says that no host runs
// there. A --url of another host with this state dir's token is refused
// with a note that says so.
func TestStateDirAloneReachesHost(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", ""}})
	other := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", ""}})
	b, err := os.ReadFile(filepath.Join(s.StateDir, "url"))
	if err != nil || strings.TrimSpace(string(b)) != s.URL {
		t.Fatalf("<state-dir>/url: %q, %v; want %s", b, err, s.URL)
	}
	if fi, err := os.Lstat(filepath.Join(s.StateDir, "url")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("<state-dir>/url mode: %v, %v; want 0600", fi.Mode(), err)
	}
	if out, stderr, code := runCLI(t, "", "sessions", "--state-dir", s.StateDir); code != 0 || !strings.Contains(out, "LIVE") {
		t.Errorf("tether sessions --state-dir: exit %d, %q %q", code, out, stderr)
	}
	_, stderr, code := runCLI(t, "", "sessions", "--state-dir", s.StateDir, "--url", other.URL)
	if code != 1 || !strings.Contains(stderr, "4401") || !strings.Contains(stderr, "is not the host serving") {
		t.Errorf("--url of another host with this state dir: exit %d, stderr %q; want 4401 with a note", code, stderr)
	}
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(s.StateDir, "url")); !os.IsNotExist(err) {
		t.Errorf("<state-dir>/url after the host stopped: %v, want it gone", err)
	}
	_, stderr, code = runCLI(t, "", "sessions", "--state-dir", s.StateDir)
	if code != 1 || !strings.Contains(stderr, "no host is running on "+s.StateDir) {
		t.Errorf("with no host: exit %d, stderr %q; want 1 saying no host runs there", code, stderr)
	}
}

// TestSessionsTailCLIFollowsAcrossARestart: `tether sessions tail` keeps
// following when its host restarts: it dials again, resumes the session
// and shows what comes after, with nothing printed twice.
func TestSessionsTailCLIFollowsAcrossARestart(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "", "--echo-delay", "5ms"}})
	_, stderr, code := runCLI(t, "", "prompt", "--state-dir", s.StateDir, "before the restart")
	m := sessionKeyLine.FindStringSubmatch(stderr)
	if code != 0 || m == nil {
		t.Fatalf("tether prompt: exit %d, stderr %q", code, stderr)
	}
	tail := exec.Command(e2e.Build(t), "sessions", "tail", "--url", s.URL, "--state-dir", s.StateDir, m[1])
	tail.Env = cliEnv()
	out, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	tailErr := new(e2e.Buffer)
	tail.Stderr = tailErr
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tail.Process.Kill(); _ = tail.Wait() })
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(want string) {
		t.Helper()
		select {
		case l := <-lines:
			if l != want {
				t.Fatalf("tail printed %q, want %q; stderr %q", l, want, tailErr.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("tail printed nothing; want %q; stderr %q", want, tailErr.String())
		}
	}
	next("user: before the restart")
	next("assistant: before the restart")

	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	s2 := e2e.Start(t, e2e.Config{StateDir: s.StateDir, Args: []string{"--pty-command", "", "--echo-delay", "5ms", "--listen", s.Addr}})
	waitFor(t, func() bool { return strings.Contains(tailErr.String(), "following again") }, "tail to say it follows again")
	if _, stderr, code := runCLI(t, "", "prompt", "--state-dir", s2.StateDir, "--session", m[1], "after the restart"); code != 0 {
		t.Fatalf("prompt after the restart: exit %d, %q", code, stderr)
	}
	next("user: after the restart")
	next("assistant: after the restart")
}
