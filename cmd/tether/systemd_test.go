package main

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestSystemdUnit checks the shipped unit against what the host does:
// KillMode=process (the PTY plugin outlives a restart), Restart=on-failure
// (which covers exit status 3, the primary transport failing for good),
// no restart loop on a refusal to start (exit 1, 2), systemctl reload
// sending SIGHUP, stdout (the token in its first line) kept out of the
// journal, and an ExecStart whose flags tether serve knows.
func TestSystemdUnit(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "contrib", "systemd", "tether.service"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	keys := map[string][]string{}
	var comments strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			comments.WriteString(line + "\n")
		}
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("unit line %q is not KEY=VALUE", line)
		}
		keys[k] = append(keys[k], v)
	}
	for k, want := range map[string]string{
		"KillMode": "process", "Restart": "on-failure", "Type": "simple",
		"ExecReload":     "/bin/kill -HUP $MAINPID", // SIGHUP: reload the transport (a renewed certificate)
		"StandardOutput": "null",                    // its first line holds the token: not for the journal
	} {
		if got := keys[k]; len(got) != 1 || got[0] != want {
			t.Errorf("%s = %v, want %s", k, got, want)
		}
	}
	if got := strings.Fields(strings.Join(keys["RestartPreventExitStatus"], " ")); !slices.Contains(got, "1") || !slices.Contains(got, "2") || slices.Contains(got, "3") {
		t.Errorf("RestartPreventExitStatus = %v: want 1 (a refusal to start) and 2 (a bad flag), never 3", got)
	}
	// The install steps make the User= the unit runs as.
	if users := keys["User"]; len(users) == 1 && !strings.Contains(comments.String(), "useradd") {
		t.Errorf("the unit runs as User=%s, but its install steps never create that user", users[0])
	} else if len(users) == 1 && !strings.Contains(comments.String(), " "+users[0]+"\n") {
		t.Errorf("the install steps' useradd does not name User=%s", users[0])
	}
	exec := strings.Fields(strings.Join(keys["ExecStart"], " "))
	if len(exec) < 2 || exec[1] != "serve" {
		t.Fatalf("ExecStart = %v, want tether serve ...", exec)
	}
	// The flags parse as tether serve's.
	var seen []string
	for _, a := range exec[2:] {
		if strings.HasPrefix(a, "--") {
			seen = append(seen, strings.TrimPrefix(a, "--"))
		}
	}
	out, _, code := captureOutput(t, "serve", "--help")
	if code != 0 {
		t.Fatalf("tether serve --help exited %d", code)
	}
	for _, name := range seen {
		if !strings.Contains(out, "-"+name) {
			t.Errorf("ExecStart uses --%s, which tether serve does not know", name)
		}
	}
}

// captureOutput runs the tether command args in this process and returns
// what it wrote to stdout and to stderr, and its exit status.
func captureOutput(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	capture := func(f **os.File) (restore func() string) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		old := *f
		*f = w
		done := make(chan string)
		go func() {
			b, _ := io.ReadAll(r)
			r.Close()
			done <- string(b)
		}()
		return func() string {
			*f = old
			w.Close()
			return <-done
		}
	}
	restoreOut := capture(&os.Stdout)
	restoreErr := capture(&os.Stderr)
	code = run(args)
	return restoreOut(), restoreErr(), code
}

// TestHelpOnStdout: help asked for (-h, --help) goes to stdout, all of
// it, with exit status 0, for tether itself and for each of its
// commands; nothing goes to stderr.
func TestHelpOnStdout(t *testing.T) {
	cases := [][]string{{"--help"}, {"-h"}, {"help"}}
	for _, cmd := range []string{"serve", "sessions", "attach", "ptys", "cluster", "plugins", "doctor"} {
		cases = append(cases, []string{cmd, "--help"}, []string{cmd, "-h"})
	}
	for _, args := range cases {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			stdout, stderr, code := captureOutput(t, args...)
			want := "usage: tether"
			if len(args) == 2 {
				want = "tether " + args[0]
			}
			if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "usage:") || !strings.Contains(stdout, want) {
				t.Errorf("exit %d, stderr %q, stdout %q; want 0, nothing on stderr, and a usage line naming %q on stdout", code, stderr, stdout, want)
			}
		})
	}
}
