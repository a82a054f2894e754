// Package e2e is an end-to-end harness for tether: it builds the real binary
// once per test binary, starts `tether serve` on a free port with a state
// directory of the test's own, and stops it (and anything it left behind)
// when the test ends.
//
// A test package using it runs its tests through Main:
//
//	func TestMain(m *testing.M) { e2e.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		s := e2e.Start(t, e2e.Config{Args: []string{"--echo-delay", "10ms"}})
//		c := s.Dial(t)
//		var snap struct{ SessionID string `json:"session_id"` }
//		if err := c.Call(ctx, "session.create", map[string]any{}, &snap); err != nil { ... }
//	}
//
// Environment: TETHER_E2E_BINARY, when set, names a prebuilt tether binary to
// use instead of building ./cmd/tether. TETHER_* variables of the test's own
// environment are never passed on to the child: tests set what they need
// with Config.Env.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tether-agent/tether/testing/hostproc"
)

// tetherTimeout bounds a one-shot command run by Tether.
const tetherTimeout = 60 * time.Second

// build and plain are the binaries Build and BuildPlain make.
var build, plain struct {
	once sync.Once
	dir  string // temporary directory holding the binary; removed by Main
	path string
	err  error
}

// Build builds ./cmd/tether once per test binary (with -race when the test
// binary has it) into a temporary directory and returns the binary's path.
// A failed build fails every test that needs the binary.
func Build(tb testing.TB) string {
	tb.Helper()
	build.once.Do(func() {
		if p := os.Getenv("TETHER_E2E_BINARY"); p != "" {
			build.path, build.err = filepath.Abs(p)
			return
		}
		build.path, build.err = buildTether(&build.dir, raceEnabled)
	})
	if build.err != nil {
		tb.Fatalf("e2e: build tether: %v", build.err)
	}
	return build.path
}

// BuildPlain is Build without -race whatever the test binary has: for a
// test that measures the processes' memory, which the race detector
// multiplies (its shadow memory is resident too). Without -race, or with
// TETHER_E2E_BINARY, it is Build.
func BuildPlain(tb testing.TB) string {
	tb.Helper()
	if !raceEnabled || os.Getenv("TETHER_E2E_BINARY") != "" {
		return Build(tb)
	}
	plain.once.Do(func() {
		plain.path, plain.err = buildTether(&plain.dir, false)
	})
	if plain.err != nil {
		tb.Fatalf("e2e: build tether without -race: %v", plain.err)
	}
	return plain.path
}

// buildTether builds ./cmd/tether of the repository above the working
// directory (a test runs in its package's directory), with -race when
// race is set, into a new temporary directory, which it stores in *dir.
func buildTether(dir *string, race bool) (string, error) {
	root, err := hostproc.FindRepo(".")
	if err != nil {
		return "", err
	}
	d, err := os.MkdirTemp("", "tether-e2e-")
	if err != nil {
		return "", err
	}
	*dir = d
	bin := filepath.Join(d, "tether")
	if err := hostproc.Build(root, bin, race); err != nil {
		return "", err
	}
	return bin, nil
}

// Main runs the tests of m, checks for leaked goroutines with goleak (opts
// are passed on), removes the built binary and exits. Call it from TestMain.
func Main(m *testing.M, opts ...goleak.Option) {
	opts = append(opts, goleak.Cleanup(func(code int) {
		for _, dir := range []string{build.dir, plain.dir} {
			if dir != "" {
				os.RemoveAll(dir)
			}
		}
		os.Exit(code)
	}))
	goleak.VerifyTestMain(m, opts...)
}

// Tether runs the built binary once with args (a client command such as
// `sessions --url U --token T`) and returns what it printed and its exit
// code. It fails the test if the binary cannot be run or does not finish
// within a minute.
func Tether(tb testing.TB, args ...string) (stdout, stderr string, exit int) {
	tb.Helper()
	bin := Build(tb)
	ctx, cancel := context.WithTimeout(context.Background(), tetherTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = childEnv(nil)
	cmd.WaitDelay = 5 * time.Second // a leftover child holding the pipes
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		tb.Fatalf("e2e: tether %s: no exit within %v\nstdout:\n%s\nstderr:\n%s",
			strings.Join(args, " "), tetherTimeout, out.String(), errb.String())
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		tb.Fatalf("e2e: tether %s: %v\nstderr:\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// childEnv is the test's environment without TETHER_* variables, plus extra.
func childEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TETHER_") && !strings.HasPrefix(kv, "GORACE=") {
			env = append(env, kv)
		}
	}
	// A race-built child exits at once instead of sleeping 1 s (races are
	// still reported, on stderr, and fail the test; see Server.stop).
	env = append(env, "GORACE=atexit_sleep_ms=0")
	return append(env, extra...)
}
