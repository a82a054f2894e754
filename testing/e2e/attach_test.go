package e2e_test

import (
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/tether-agent/tether/testing/e2e"
)

// TestAttachCommandInATerminal runs the real `tether attach` in a real
// terminal (a PTY) against the real host: typed input reaches the shell,
// Enter ~. detaches, and attaching again replays the earlier output.
func TestAttachCommandInATerminal(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "sh"}})
	tok := attachToken(t)

	run := func(t *testing.T, typed []string, want string) string {
		t.Helper()
		cmd := exec.Command(e2e.Build(t), "attach", "--url", s.URL, "--token", s.Token, tok)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "TERM=xterm"}
		term, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: 100, Rows: 30})
		if err != nil {
			t.Fatal(err)
		}
		defer term.Close()
		var screen e2e.Buffer
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 4096)
			for {
				n, err := term.Read(buf)
				_, _ = screen.Write(buf[:n])
				if err != nil {
					return
				}
			}
		}()
		waitFor := func(s string) {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				if strings.Contains(screen.String(), s) {
					return
				}
				time.Sleep(20 * time.Millisecond) // polling a terminal screen
			}
			t.Fatalf("terminal never showed %q; screen: %q", s, screen.String())
		}
		for _, in := range typed {
			if _, err := io.WriteString(term, in); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(want)
		if _, err := io.WriteString(term, "\r~."); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- cmd.Wait() }()
		select {
		case err := <-errc:
			if err != nil {
				t.Fatalf("tether attach exited with %v, want 0 after ~.", err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatal("tether attach did not exit after ~.")
		}
		term.Close()
		<-done
		return screen.String()
	}

	first := run(t, []string{"echo marker-$((6*7))\r"}, "marker-42")
	if !strings.Contains(first, "tether: detached") {
		t.Errorf("no detach message after ~.: %q", first)
	}
	// Attaching again shows the earlier output from the replay.
	run(t, nil, "marker-42")
}
