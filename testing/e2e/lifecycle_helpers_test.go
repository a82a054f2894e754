package e2e_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
)

// checkNoLeaks registers a check, run at the very end of the test (call it
// before e2e.Start, so that it runs after the harness's own cleanups),
// that no process of the tether binary is left running: no host, no
// plugin. Leftovers are reported and killed.
func checkNoLeaks(t *testing.T) {
	t.Helper()
	bin := e2e.Build(t)
	t.Cleanup(func() {
		deadline := time.Now().Add(10 * time.Second)
		var left []string
		for {
			left = liveProcesses(t, bin)
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond) // waiting for other processes to exit
		}
		if len(left) > 0 {
			t.Errorf("processes of %s still running after the test: %q", bin, left)
			for _, p := range left {
				pid, _ := strconv.Atoi(strings.Fields(p)[0])
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
}

// liveProcesses returns "PID CMDLINE" of every running (not zombie)
// process whose command line holds bin, found with pgrep.
func liveProcesses(tb testing.TB, bin string) []string {
	out, err := exec.Command("pgrep", "-f", "--", regexp.QuoteMeta(bin)).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 1 {
			return nil // none
		}
		tb.Fatalf("pgrep: %v", err)
	}
	var live []string
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // gone meanwhile
		}
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
			continue // exited, not yet reaped by its new parent
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		live = append(live, fmt.Sprintf("%d %s", pid, bytes.ReplaceAll(bytes.TrimRight(cmdline, "\x00"), []byte{0}, []byte{' '})))
	}
	return live
}

// ptyRecord is <state-dir>/plugins/pty.json.
type ptyRecord struct {
	Protocol string `json:"protocol"`
	Network  string `json:"network"`
	Address  string `json:"address"`
	PID      int    `json:"pid"`
	Started  uint64 `json:"started"`
}

func recordFile(dir string) string { return filepath.Join(dir, "plugins", "pty.json") }

// readPTYRecord reads the PTY plugin's reattach record.
func readPTYRecord(tb testing.TB, dir string) ptyRecord {
	tb.Helper()
	b, err := os.ReadFile(recordFile(dir))
	if err != nil {
		tb.Fatalf("reattach record: %v", err)
	}
	var rec ptyRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		tb.Fatalf("reattach record %s: %v", b, err)
	}
	return rec
}

// startTicks returns /proc/PID/stat field 22.
func startTicks(tb testing.TB, pid int) uint64 {
	tb.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	n, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// logLines returns the host's JSON log lines whose message is msg.
func logLines(s *e2e.Server, msg string) []map[string]any {
	var lines []map[string]any
	for _, l := range strings.Split(s.Stderr.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["message"] == msg {
			lines = append(lines, m)
		}
	}
	return lines
}

// waitLogLine waits for a host log line with message msg whose fields
// include want, and returns it.
func waitLogLine(tb testing.TB, s *e2e.Server, msg string, want map[string]any) map[string]any {
	tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		for _, l := range logLines(s, msg) {
			ok := true
			for k, v := range want {
				if fmt.Sprint(l[k]) != fmt.Sprint(v) {
					ok = false
				}
			}
			if ok {
				return l
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("no log line %q with %v; stderr tail:\n%s", msg, want, s.Stderr.Tail(40))
		}
		time.Sleep(50 * time.Millisecond) // polling the child's log
	}
}

// pluginLine is one line of `tether plugins list`.
type pluginLine struct {
	Name, Kind, PID, Uptime, Restarts, State, Version, Conns, Notes string
}

// pluginsList runs `tether plugins list` on dir and parses its lines by
// plugin name.
func pluginsList(tb testing.TB, dir string) map[string]pluginLine {
	tb.Helper()
	out, errOut, code := e2e.Tether(tb, "plugins", "list", "--state-dir", dir)
	if code != 0 {
		tb.Fatalf("tether plugins list: exit %d\n%s%s", code, out, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "NAME") {
		tb.Fatalf("tether plugins list printed %q, want a header and one line per plugin", out)
	}
	m := map[string]pluginLine{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) < 8 {
			tb.Fatalf("tether plugins list line %q: want NAME KIND PID UPTIME RESTARTS STATE VERSION CONNS [NOTES]", l)
		}
		m[f[0]] = pluginLine{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], strings.Join(f[8:], " ")}
	}
	return m
}

// sequenceOK checks that stream is the lines n1, n2, … in order (the last
// one may be cut short) and returns how many whole lines it holds.
func sequenceOK(tb testing.TB, stream []byte) int {
	tb.Helper()
	lines := strings.Split(string(stream), "\r\n")
	for i, line := range lines[:len(lines)-1] {
		if want := fmt.Sprintf("n%d", i+1); line != want {
			tb.Fatalf("line %d is %q, want %q: a gap or a repeat (lines around it: %q)", i, line, want, lines[max(0, i-3):min(len(lines), i+4)])
		}
	}
	return len(lines) - 1
}
