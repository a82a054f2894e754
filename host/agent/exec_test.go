package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"
)

// newExec builds an Exec agent for argv, closed when the test ends.
func newExec(tb testing.TB, argv ...string) Agent {
	tb.Helper()
	f, err := NewExecFactory(argv)
	if err != nil {
		tb.Fatalf("NewExecFactory(%q): got error %v, want nil", argv, err)
	}
	a, err := f.NewAgent(context.Background(), "20250102_030405_abcdef", nil)
	if err != nil {
		tb.Fatalf("NewAgent: got error %v, want nil", err)
	}
	tb.Cleanup(func() {
		if err := a.Close(); err != nil {
			tb.Errorf("Close: got error %v, want nil", err)
		}
	})
	return a
}

// collect runs a with prompt and returns the deltas and the error.
func collect(ctx context.Context, a Agent, prompt string) ([]string, error) {
	var deltas []string
	err := a.Run(ctx, nil, prompt, func(d string) { deltas = append(deltas, d) })
	return deltas, err
}

// shArgv is the argv of a sh script; its $1 is arg.
func shArgv(script, arg string) []string {
	return []string{"sh", "-c", script, "sh", arg}
}

func TestNewExecFactory(t *testing.T) {
	tests := []struct {
		name    string
		argv    []string
		wantErr error
	}{
		{"nil", nil, ErrNoCommand},
		{"empty", []string{}, ErrNoCommand},
		{"empty name", []string{"", "x"}, ErrNoCommand},
		{"command", []string{"true"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := NewExecFactory(tt.argv)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("NewExecFactory(%q): got error %v, want %v", tt.argv, err, tt.wantErr)
			}
			if (f == nil) != (tt.wantErr != nil) {
				t.Errorf("NewExecFactory(%q): got factory %v, want one only without error", tt.argv, f)
			}
		})
	}
}

// TestExecNewAgentLooksUpCommand checks that every NewAgent looks for the
// command, so that a missing agent binary fails the build of a session
// (the host answers 5000) and not its first run, while the factory itself
// can be made before the command exists.
func TestExecNewAgentLooksUpCommand(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "agent.sh")
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatalf("WriteFile: got error %v, want nil", err)
	}
	tests := []struct {
		name    string
		argv    []string
		setup   func(t *testing.T)
		wantErr error
	}{
		{name: "in PATH", argv: []string{"sh", "-c", "true"}},
		{name: "absolute path", argv: []string{"/bin/sh"}},
		{name: "missing absolute path", argv: []string{"/nonexistent/tether-test-agent"}, wantErr: ErrCommandNotFound},
		{name: "missing in PATH", argv: []string{"tether-test-agent-not-in-path"}, wantErr: ErrCommandNotFound},
		{name: "directory", argv: []string{dir}, wantErr: ErrCommandNotFound},
		{name: "not executable", argv: []string{plain}, wantErr: ErrCommandNotFound},
		{
			name: "created after the factory",
			argv: []string{script},
			setup: func(t *testing.T) {
				if err := os.WriteFile(script, []byte("#!/bin/sh\ncat\n"), 0o755); err != nil {
					t.Fatalf("WriteFile: got error %v, want nil", err)
				}
				t.Cleanup(func() { os.Remove(script) })
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := NewExecFactory(tt.argv)
			if err != nil {
				t.Fatalf("NewExecFactory(%q): got error %v, want nil (the factory does not look the command up)", tt.argv, err)
			}
			if tt.setup != nil {
				tt.setup(t)
			}
			a, err := f.NewAgent(context.Background(), "20250102_030405_abcdef", nil)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("NewAgent(%q): got error %v, want %v", tt.argv, err, tt.wantErr)
			}
			if err != nil {
				if a != nil {
					t.Errorf("NewAgent(%q): got agent %v with an error, want nil", tt.argv, a)
				}
				if !strings.Contains(err.Error(), tt.argv[0]) {
					t.Errorf("NewAgent: got error %q, want it to name %q", err, tt.argv[0])
				}
				var execErr *exec.Error
				if !errors.As(err, &execErr) {
					t.Errorf("NewAgent: got error %v, want an *exec.Error in its chain", err)
				}
				return
			}
			if err := a.Close(); err != nil {
				t.Errorf("Close: got error %v, want nil", err)
			}
		})
	}
}

// TestExecNewAgentEveryBuild checks that the lookup is made at every
// build, not once: a command removed after a first build fails the next
// one, and comes back when the command does.
func TestExecNewAgentEveryBuild(t *testing.T) {
	script := filepath.Join(t.TempDir(), "agent.sh")
	write := func() {
		t.Helper()
		if err := os.WriteFile(script, []byte("#!/bin/sh\ncat\n"), 0o755); err != nil {
			t.Fatalf("WriteFile: got error %v, want nil", err)
		}
	}
	write()
	f, err := NewExecFactory([]string{script})
	if err != nil {
		t.Fatalf("NewExecFactory: got error %v, want nil", err)
	}
	ctx := context.Background()
	a, err := f.NewAgent(ctx, "20250102_030405_abcdef", nil)
	if err != nil {
		t.Fatalf("first NewAgent: got error %v, want nil", err)
	}
	defer a.Close()

	if err := os.Remove(script); err != nil {
		t.Fatalf("Remove: got error %v, want nil", err)
	}
	if _, err := f.NewAgent(ctx, "20250102_030405_abcdef", nil); !errors.Is(err, ErrCommandNotFound) {
		t.Errorf("NewAgent after the command was removed: got error %v, want %v", err, ErrCommandNotFound)
	}
	// An agent built before the command went fails its run instead, with
	// no exit status (the command never started).
	got, err := collect(ctx, a, "x")
	if !errors.Is(err, ErrRunFailed) {
		t.Errorf("Run after the command was removed: got error %v, want %v", err, ErrRunFailed)
	}
	if len(got) != 0 {
		t.Errorf("Run after the command was removed: got deltas %q, want none", got)
	}
	if err != nil && !strings.Contains(err.Error(), script) {
		t.Errorf("Run: got error %q, want it to name %q", err, script)
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		t.Errorf("Run: got exit status %d, want none", exitErr.ExitCode())
	}

	write()
	b, err := f.NewAgent(ctx, "20250102_030405_abcdef", nil)
	if err != nil {
		t.Fatalf("NewAgent after the command came back: got error %v, want nil", err)
	}
	b.Close()
}

func TestExecStreams(t *testing.T) {
	long := strings.Repeat("x", 3*maxDelta+17)
	tests := []struct {
		name   string
		argv   []string
		prompt string
		want   []string
	}{
		{"lines", []string{"sh", "-c", `printf "a\nb\n"; printf c`}, "", []string{"a\n", "b\n", "c"}},
		{"prompt on stdin", []string{"cat"}, "hello\nworld", []string{"hello\n", "world"}},
		{"empty prompt", []string{"cat"}, "", nil},
		{"empty lines", []string{"sh", "-c", `printf "\n\nx\n"`}, "", []string{"\n", "\n", "x\n"}},
		{"long line in pieces", []string{"cat"}, long + "\nend", []string{long[:maxDelta], long[maxDelta : 2*maxDelta], long[2*maxDelta : 3*maxDelta], long[3*maxDelta:] + "\n", "end"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := collect(context.Background(), newExec(t, tt.argv...), tt.prompt)
			if err != nil {
				t.Fatalf("Run: got error %v, want nil", err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Run: got %d deltas %.80q, want %d: %.80q", len(got), got, len(tt.want), tt.want)
			}
		})
	}
}

// TestExecNoTetherEnv: the command runs with the host's environment
// minus every TETHER_* variable, so tether's settings (the access token
// among them) never reach an agent; other variables pass through.
func TestExecNoTetherEnv(t *testing.T) {
	const secret = "exec-agent-secret-7f3a9c2e51"
	t.Setenv("TETHER_TOKEN", secret)
	t.Setenv("TETHER_ORPHAN_GRACE", "5s")
	t.Setenv("NOT_TETHER_KEPT", "kept")
	deltas, err := collect(context.Background(), newExec(t, "env"), "")
	if err != nil {
		t.Fatalf("Run: got error %v, want nil", err)
	}
	out := strings.Join(deltas, "")
	lines := strings.Split(out, "\n")
	if !slices.Contains(lines, "NOT_TETHER_KEPT=kept") || !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "PATH=") }) {
		t.Fatalf("env printed %q, want the host's environment (PATH, NOT_TETHER_KEPT)", out)
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "TETHER_") {
			t.Errorf("the agent's environment holds %q, want no TETHER_ variable", l)
		}
	}
	if strings.Contains(out, secret) {
		t.Errorf("the access token reached the agent:\n%s", out)
	}
}

// TestExecStreamsAsLinesArrive checks that a line is emitted before the
// command writes the next one: the command waits for a file that the test
// creates only after it has seen the first line.
func TestExecStreamsAsLinesArrive(t *testing.T) {
	gate := filepath.Join(t.TempDir(), "gate")
	a := newExec(t, shArgv(`echo first; while [ ! -e "$1" ]; do sleep 0.01; done; echo second`, gate)...)
	var got []string
	err := a.Run(context.Background(), nil, "", func(d string) {
		got = append(got, d)
		if d == "first\n" {
			if err := os.WriteFile(gate, nil, 0o600); err != nil {
				t.Errorf("WriteFile: got error %v, want nil", err)
			}
		}
	})
	if err != nil {
		t.Fatalf("Run: got error %v, want nil", err)
	}
	if want := []string{"first\n", "second\n"}; !slices.Equal(got, want) {
		t.Errorf("Run: got %q, want %q", got, want)
	}
}

func TestExecFailure(t *testing.T) {
	tests := []struct {
		name       string
		argv       []string
		wantDeltas []string
		wantInErr  []string
		wantExit   int // -1: no exit status (not started)
	}{
		{
			name:       "non-zero exit",
			argv:       []string{"sh", "-c", "echo partial; echo boom >&2; exit 3"},
			wantDeltas: []string{"partial\n"},
			wantInErr:  []string{"boom", "exit status 3"},
			wantExit:   3,
		},
		{
			name:      "stderr tail is bounded",
			argv:      []string{"sh", "-c", `head -c 100000 /dev/zero | tr '\0' e >&2; echo END >&2; exit 1`},
			wantInErr: []string{"…eee", "eEND"},
			wantExit:  1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := collect(context.Background(), newExec(t, tt.argv...), "")
			if !errors.Is(err, ErrRunFailed) {
				t.Fatalf("Run: got error %v, want %v", err, ErrRunFailed)
			}
			if !slices.Equal(got, tt.wantDeltas) {
				t.Errorf("Run: got deltas %q, want %q", got, tt.wantDeltas)
			}
			for _, s := range tt.wantInErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Run: got error %.200q, want it to contain %q", err, s)
				}
			}
			if n := len(err.Error()); n > stderrTail+512 {
				t.Errorf("Run: got an error of %d bytes, want at most %d", n, stderrTail+512)
			}
			var exitErr *exec.ExitError
			switch {
			case tt.wantExit < 0 && errors.As(err, &exitErr):
				t.Errorf("Run: got exit status %d, want none", exitErr.ExitCode())
			case tt.wantExit >= 0 && !errors.As(err, &exitErr):
				t.Errorf("Run: got error %v, want an *exec.ExitError", err)
			case tt.wantExit >= 0 && exitErr.ExitCode() != tt.wantExit:
				t.Errorf("Run: got exit status %d, want %d", exitErr.ExitCode(), tt.wantExit)
			}
		})
	}
}

func TestExecCancelledBeforeRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	marker := filepath.Join(t.TempDir(), "ran")
	got, err := collect(ctx, newExec(t, shArgv(`touch "$1"`, marker)...), "")
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run: got error %v, want %v", err, context.Canceled)
	}
	if len(got) != 0 {
		t.Errorf("Run: got deltas %q, want none", got)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Stat(marker): got error %v, want %v (the command must not run)", err, os.ErrNotExist)
	}
}

// TestExecKillsProcessGroup checks that no process the command started
// outlives the run, whether the run is interrupted or the command exits
// leaving a background process that holds its standard output.
func TestExecKillsProcessGroup(t *testing.T) {
	tests := []struct {
		name    string
		script  string
		cancel  bool
		want    []string
		wantErr error
	}{
		{
			name:    "interrupt",
			script:  `sleep 30 & echo $! > "$1"; sleep 30 & echo ready; wait`,
			cancel:  true,
			want:    []string{"ready\n"},
			wantErr: context.Canceled,
		},
		{
			name:   "leader exits first",
			script: `sleep 30 & echo $! > "$1"; echo ready`,
			want:   []string{"ready\n"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "pid")
			a := newExec(t, shArgv(tt.script, pidFile)...)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var got []string
			start := time.Now()
			err := a.Run(ctx, nil, "", func(d string) {
				got = append(got, d)
				if tt.cancel && d == "ready\n" {
					cancel()
				}
				if d == "ready\n" {
					start = time.Now()
				}
			})
			elapsed := time.Since(start)
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("Run: got error %v, want %v", err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Run: got deltas %q, want %q", got, tt.want)
			}
			// Far less than the 30 s the children would otherwise hold
			// standard output open, and less than exitGrace: the kill, not
			// the grace timer, ended the run.
			if elapsed >= exitGrace {
				t.Errorf("Run: returned %v after the command was ready, want less than %v", elapsed, exitGrace)
			}
			pid := readPID(t, pidFile)
			waitGone(t, pid)
		})
	}
}

// readPID reads a process id written by a test script.
func readPID(tb testing.TB, path string) int {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("ReadFile(%s): got error %v, want nil", path, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		tb.Fatalf("pid file: got %q, want a process id", b)
	}
	return pid
}

// waitGone waits for the process pid to be dead: gone (ESRCH), or a zombie
// its new parent has not reaped yet. Only the kernel's reaping is waited
// for, with a bound: Run has already killed the process.
func waitGone(tb testing.TB, pid int) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := syscall.Kill(pid, 0)
		if errors.Is(err, syscall.ESRCH) || isZombie(pid) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("process %d: got kill(pid, 0) = %v and not a zombie 5 s after Run returned, want it dead", pid, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// isZombie reports whether /proc shows pid as a zombie or dead process.
func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] == 'Z' || b[i+2] == 'X'
}

func TestReadDeltas(t *testing.T) {
	// A multi-byte character straddling the buffer boundary moves whole to
	// the next piece.
	straddle := strings.Repeat("a", maxDelta-1) + "é" + "b\n"
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"empty", "", nil},
		{"no newline", "abc", []string{"abc"}},
		{"lines", "a\nb\n", []string{"a\n", "b\n"}},
		{"exactly full", strings.Repeat("z", maxDelta), []string{strings.Repeat("z", maxDelta)}},
		{"straddling character", straddle, []string{strings.Repeat("a", maxDelta-1), "éb\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := make(chan string)
			done := make(chan struct{})
			go func() {
				defer close(done)
				defer close(out)
				readDeltas(strings.NewReader(tt.in), out)
			}()
			var got []string
			for d := range out {
				got = append(got, d)
			}
			<-done
			if !slices.Equal(got, tt.want) {
				t.Errorf("readDeltas: got %d pieces %.60q, want %d: %.60q", len(got), got, len(tt.want), tt.want)
			}
			for i, d := range got {
				if !utf8.ValidString(d) {
					t.Errorf("piece %d: got invalid UTF-8, want valid", i)
				}
			}
		})
	}
}

func TestRuneBoundary(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"", 0},
		{"abc", 3},
		{"aé", 3},
		{"a\xc3", 1},
		{"a\xe6\x97", 1},
		{"a日", 4},
		{"a\xf0\x9f\x98", 1},
		{"\xff\xff", 2},
	}
	for _, tt := range tests {
		if got := runeBoundary([]byte(tt.in)); got != tt.want {
			t.Errorf("runeBoundary(%q): got %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestTailBuffer(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		want   string
	}{
		{"nothing", nil, ""},
		{"short", []string{"ab", "cd\n"}, "abcd"},
		{"exact", []string{"12345678"}, "12345678"},
		{"overflow across writes", []string{"12345", "6789"}, "…23456789"},
		{"one big write", []string{"abcdefghijkl"}, "…efghijkl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := &tailBuffer{max: 8}
			for _, w := range tt.writes {
				if n, err := tb.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q): got %d, %v; want %d, nil", w, n, err, len(w))
				}
			}
			if got := tb.String(); got != tt.want {
				t.Errorf("String: got %q, want %q", got, tt.want)
			}
		})
	}
}
