package hostproc

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// modulePath is the module of the tether repository.
const modulePath = "github.com/tether-agent/tether"

// FindRepo returns the root of the tether repository (the directory whose
// go.mod declares the tether module) at or above dir.
func FindRepo(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("hostproc: %w", err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && declaresModule(b) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("hostproc: no tether repository (go.mod of %s) at or above %s", modulePath, dir)
		}
	}
}

// declaresModule reports whether the go.mod text b declares modulePath.
func declaresModule(b []byte) bool {
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" && strings.Trim(f[1], `"`) == modulePath {
			return true
		}
	}
	return false
}

// Build builds ./cmd/tether of the repository at repo into the file out,
// with the race detector when race is set. It never changes the
// repository's go.mod or go.sum (-mod=readonly) and needs no VCS data
// (-buildvcs=false: repo may be an exported tree). The error carries the
// compiler's output.
func Build(repo, out string, race bool) error {
	args := []string{"build", "-mod=readonly", "-buildvcs=false", "-o", out}
	if race {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/tether")
	cmd := exec.Command("go", args...)
	cmd.Dir = repo
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOFLAGS=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("hostproc: go %s in %s: %w\n%s", strings.Join(args, " "), repo, err, b)
	}
	return nil
}

// Environ is this process's environment without TETHER_* variables (a
// developer's settings must not change what a test or benchmark sees),
// plus extra (KEY=VALUE).
func Environ(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TETHER_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// KillPTYPlugin stops the PTY plugin recorded in stateDir/plugins/pty.json
// — the one a host leaves running for the next host (docs/PROTOCOL.md
// §13.6) — when that pid still runs the binary bin:
// SIGTERM and up to grace for it to exit, then SIGKILL to it and its
// process group (at once when grace is 0). It reports whether it had to
// send SIGKILL.
func KillPTYPlugin(stateDir, bin string, grace time.Duration) (killed bool) {
	b, err := os.ReadFile(filepath.Join(stateDir, "plugins", "pty.json"))
	if err != nil {
		return false
	}
	var rec struct {
		PID int `json:"pid"`
	}
	if json.Unmarshal(b, &rec) != nil || rec.PID <= 0 || !runs(rec.PID, bin) {
		return false // gone, or a pid reused by another program
	}
	if grace > 0 {
		if syscall.Kill(rec.PID, syscall.SIGTERM) != nil {
			return false
		}
		deadline := time.Now().Add(grace)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", rec.PID)); err != nil {
				return false
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
	_ = syscall.Kill(rec.PID, syscall.SIGKILL)
	return true
}

// runs reports whether the process pid runs the executable bin.
func runs(pid int, bin string) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return false
	}
	exe = strings.TrimSuffix(exe, " (deleted)")
	if exe == bin {
		return true
	}
	real, err := filepath.EvalSymlinks(bin)
	return err == nil && exe == real
}

// FreeAddrs returns n distinct loopback addresses whose ports were free a
// moment ago: all n are listened on together, then closed. For what must
// know its addresses before it starts (the embedded NATS servers of a
// cluster know each other's routes).
func FreeAddrs(n int) ([]string, error) {
	var out []string
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("hostproc: free address: %w", err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	return out, nil
}
