package umask

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

// TestMain makes the test binary the trampoline when it is run as one
// (Wrap re-executes the running binary, here this test binary), and
// checks for leaked goroutines otherwise.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == Arg {
		os.Exit(Main(os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}

// withChild runs the test with the process restricted (umask 077) and
// children given mask, then puts back what was.
func withChild(t *testing.T, mask int) {
	t.Helper()
	oldChild, oldOwn := child.Load(), own.Load()
	orig := Restrict()
	SetChild(mask)
	t.Cleanup(func() {
		syscall.Umask(orig)
		child.Store(oldChild)
		own.Store(oldOwn)
	})
}

// TestWrapGivesTheChildItsUmask: a command started through Wrap runs
// with the child umask — the shell's own umask builtin says so, and a
// file it creates gets the mode that umask gives — while this process
// keeps 077 and a file it makes meanwhile is private. The command runs in
// place of the trampoline (the pid the shell reports is the one Start
// returned) with its argv as given (argv[0] not rewritten to a path).
func TestWrapGivesTheChildItsUmask(t *testing.T) {
	for _, mask := range []int{0o022, 0o002, 0o027, 0} {
		t.Run(Format(mask), func(t *testing.T) {
			withChild(t, mask)
			dir := t.TempDir()
			made := filepath.Join(dir, "by-child")
			cmd := exec.Command("sh", "-c", `umask; echo $$; touch "$1"; tr '\0' ' ' </proc/$$/cmdline`, "sh", made)
			Wrap(cmd)
			if cmd.Path != "/proc/self/exe" {
				t.Fatalf("Wrap left cmd.Path %q, want the trampoline", cmd.Path)
			}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pid := cmd.Process.Pid
			if err := cmd.Wait(); err != nil {
				t.Fatalf("%v: %s", err, out.String())
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != 3 {
				t.Fatalf("output %q, want three lines", out.String())
			}
			if lines[0] != Format(mask) {
				t.Errorf("the child's umask is %s, want %s", lines[0], Format(mask))
			}
			if lines[1] != strconv.Itoa(pid) {
				t.Errorf("the shell's pid is %s, Start said %d: the command did not run in the trampoline's place", lines[1], pid)
			}
			if !strings.HasPrefix(lines[2], "sh -c umask;") || !strings.HasSuffix(lines[2], " sh "+made) {
				t.Errorf("the child's argv is %q, want the argv given (sh -c ... sh FILE)", lines[2])
			}
			fi, err := os.Stat(made)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := fi.Mode().Perm(), os.FileMode(0o666&^mask); got != want {
				t.Errorf("a file the child made has mode %04o, want %04o", got, want)
			}
			ours := filepath.Join(dir, "by-tether")
			if err := os.WriteFile(ours, nil, 0o666); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(ours); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("a file this process made has mode %v (%v), want 0600 under umask 077", fi.Mode(), err)
			}
		})
	}
}

// TestWrapLeavesAlone: with no child umask set, with one equal to the
// process's own, and for a command that was not found, Wrap changes
// nothing, so Start behaves as without it (the missing command fails at
// Start with exec.ErrNotFound, not later in the trampoline).
func TestWrapLeavesAlone(t *testing.T) {
	t.Run("none set", func(t *testing.T) {
		old := child.Load()
		child.Store(0)
		t.Cleanup(func() { child.Store(old) })
		cmd := exec.Command("true")
		path := cmd.Path
		Wrap(cmd)
		if cmd.Path != path || len(cmd.Args) != 1 {
			t.Errorf("Wrap with no child umask rewrote the command: %q %q", cmd.Path, cmd.Args)
		}
	})
	t.Run("same as ours", func(t *testing.T) {
		withChild(t, Private)
		cmd := exec.Command("true")
		path := cmd.Path
		Wrap(cmd)
		if cmd.Path != path {
			t.Errorf("Wrap with the process's own umask rewrote the command: %q", cmd.Path)
		}
	})
	t.Run("not found", func(t *testing.T) {
		withChild(t, 0o022)
		cmd := exec.Command("no-such-command-anywhere")
		Wrap(cmd)
		if err := cmd.Start(); !errors.Is(err, exec.ErrNotFound) {
			t.Errorf("Start of a missing command: %v, want exec.ErrNotFound", err)
		}
	})
}

// TestMainRefuses: the trampoline run with bad arguments, or a file it
// cannot run, exits with a shell's status and a reason, and never runs
// anything.
func TestMainRefuses(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	notExec := filepath.Join(dir, "plain")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		code int
		say  string
	}{
		{"too few", []string{"022", "/bin/true"}, 2, "usage"},
		{"bad mask", []string{"9", "/bin/true", "true"}, 2, "octal"},
		{"mask too big", []string{"1777", "/bin/true", "true"}, 2, "octal"},
		{"missing file", []string{"022", filepath.Join(dir, "none"), "none"}, 127, "cannot run"},
		{"not executable", []string{"022", notExec, "plain"}, 126, "permission denied"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(self, append([]string{Arg}, tt.args...)...)
			out, _ := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != tt.code || !strings.Contains(string(out), tt.say) {
				t.Errorf("umask-exec %q: exit %d %q, want %d and %q", tt.args, code, out, tt.code, tt.say)
			}
		})
	}
}

// TestParse reads what Format writes, and refuses what is no umask.
func TestParse(t *testing.T) {
	for _, m := range []int{0, 0o002, 0o022, 0o027, 0o077, 0o777} {
		if got, err := Parse(Format(m)); err != nil || got != m {
			t.Errorf("Parse(Format(%o)) = %o, %v", m, got, err)
		}
	}
	for _, s := range []string{"", "8", "-1", "0o22", "1000", "abc"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) took it", s)
		}
	}
}
