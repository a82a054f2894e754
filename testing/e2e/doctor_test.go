package e2e_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
)

// TestDoctorExitStatus runs the real `tether doctor`: it exits 0 and says
// no problem was found on the state dir a host left behind cleanly, and
// exits 1 with a FAIL line and a fix for each problem planted in it.
func TestDoctorExitStatus(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", ""}})
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("host exit %d, %v", code, err)
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()

	out, errOut, code := e2e.Tether(t, "doctor", "--state-dir", s.StateDir, "--listen", freeAddr)
	if code != 0 || !strings.Contains(out, "no problem found") || strings.Contains(out, "FAIL") {
		t.Fatalf("doctor on a sound state dir: exit %d, want 0 and no problem found\n%s%s", code, out, errOut)
	}

	// Plant problems: an empty token file, a 0-byte state.db, a
	// malformed reattach record.
	if err := os.WriteFile(filepath.Join(s.StateDir, "token"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"state.db", "state.db-wal", "state.db-shm"} {
		os.Remove(filepath.Join(s.StateDir, f))
	}
	if err := os.WriteFile(filepath.Join(s.StateDir, "state.db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.StateDir, "plugins"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.StateDir, "plugins", "pty.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = e2e.Tether(t, "doctor", "--state-dir", s.StateDir, "--listen", freeAddr)
	if code != 1 {
		t.Errorf("doctor with planted problems: exit %d, want 1\n%s%s", code, out, errOut)
	}
	for _, check := range []string{"database", "token file", "pty plugin"} {
		found := false
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "FAIL") && strings.Contains(l, check) {
				found = true
			}
		}
		if !found {
			t.Errorf("doctor printed no FAIL line for %s:\n%s", check, out)
		}
	}
	if n := strings.Count(out, "fix:"); n < 3 {
		t.Errorf("doctor printed %d fixes for 3 problems:\n%s", n, out)
	}
	if !strings.Contains(out, "3 problem(s) found") {
		t.Errorf("doctor's summary does not say 3 problems:\n%s", out)
	}
}
