package hostproc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// helperEnv names, in the environment of the test binary run as a child,
// how it behaves in place of `tether serve` (helper-process pattern).
const helperEnv = "HOSTPROC_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(fakeServe(mode, os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

// fakeServe plays tether serve for the tests: it checks its arguments,
// writes to stderr, and then does what mode says.
func fakeServe(mode string, args []string) int {
	if len(args) < 3 || args[0] != "serve" || args[1] != "--state-dir" {
		fmt.Fprintf(os.Stderr, "fake: bad args %q\n", args)
		return 2
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	fmt.Fprintln(os.Stderr, "fake: starting on", args[2])
	ready := func() {
		fmt.Println("some other line first")
		fmt.Println(ListeningPrefix + "http://127.0.0.1:4321/?token=tok%2Ben")
		if HasAdminListen(args, os.Environ()) {
			time.Sleep(50 * time.Millisecond)
			fmt.Println(AdminPrefix + "http://127.0.0.1:4322")
		}
	}
	switch mode {
	case "serve": // ready, exit 0 on SIGTERM
		ready()
		<-term
		fmt.Fprintln(os.Stderr, "fake: stopping")
		return 0
	case "exit7": // ready, exit 7 on SIGTERM
		ready()
		<-term
		return 7
	case "stubborn": // ready, SIGTERM ignored
		ready()
		for {
			<-term
		}
	case "fail": // exit 3 before ready
		fmt.Println("about to fail")
		fmt.Fprintln(os.Stderr, "fake: boom")
		return 3
	case "silent": // never ready
		<-term
		return 0
	case "badline":
		fmt.Println(ListeningPrefix + "not a url")
		<-term
		return 0
	case "sleep": // a PTY plugin left behind, SIGTERM ignored
		fmt.Println("sleeping")
		time.Sleep(time.Minute)
		return 0
	}
	fmt.Fprintln(os.Stderr, "fake: unknown mode", mode)
	return 2
}

// syncBuffer collects the child's stderr.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// start runs the test binary as tether serve in mode.
func start(t *testing.T, mode string, args ...string) (*Process, *syncBuffer, error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	stderr := new(syncBuffer)
	p, err := Start(Config{
		Binary:       self,
		StateDir:     t.TempDir(),
		Args:         args,
		Env:          Environ(helperEnv + "=" + mode),
		Stderr:       stderr,
		StartTimeout: 5 * time.Second,
	})
	if p != nil {
		t.Cleanup(func() { p.Kill() })
	}
	return p, stderr, err
}

func TestStartAndStop(t *testing.T) {
	p, stderr, err := start(t, "serve")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if p.URL != "http://127.0.0.1:4321" || p.Addr != "127.0.0.1:4321" || p.Token != "tok+en" || p.AdminURL != "" {
		t.Errorf("got URL %q Addr %q Token %q AdminURL %q; want http://127.0.0.1:4321, 127.0.0.1:4321, tok+en, none", p.URL, p.Addr, p.Token, p.AdminURL)
	}
	if !strings.Contains(p.Stdout(), "some other line first\n") {
		t.Errorf("Stdout: got %q, want the line before the listening line too", p.Stdout())
	}
	if p.ExitDescription() != "running" || p.Err() != nil {
		t.Errorf("before Stop: got %q, %v; want running, nil", p.ExitDescription(), p.Err())
	}
	if err := p.Stop(5 * time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if code, err := p.Wait(time.Second); code != 0 || err != nil {
		t.Errorf("Wait after Stop: got %d, %v; want 0, nil", code, err)
	}
	if got := stderr.String(); !strings.Contains(got, "fake: starting on "+p.StateDir) || !strings.Contains(got, "fake: stopping") {
		t.Errorf("stderr: got %q, want the start and stop lines", got)
	}
	if p.ExitDescription() != "exited 0" {
		t.Errorf("ExitDescription: got %q, want exited 0", p.ExitDescription())
	}
}

func TestStartWaitsForAdmin(t *testing.T) {
	for _, args := range [][]string{
		{"--admin-listen", "127.0.0.1:0"},
		{"--admin-listen=127.0.0.1:0"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			p, _, err := start(t, "serve", args...)
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			if p.AdminURL != "http://127.0.0.1:4322" {
				t.Errorf("AdminURL: got %q, want http://127.0.0.1:4322", p.AdminURL)
			}
		})
	}
}

func TestStartFails(t *testing.T) {
	tests := []struct {
		name, mode string
		timeout    time.Duration
		want       error
		wantOut    string // in the error
	}{
		{"exits before ready", "fail", 0, ErrExited, "about to fail"},
		{"never ready", "silent", 300 * time.Millisecond, ErrNotReady, `no "tether listening on" line within 300ms`},
		{"bad listening line", "badline", 0, ErrBadLine, "not a url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			p, err := Start(Config{
				Binary:       self,
				StateDir:     t.TempDir(),
				Env:          Environ(helperEnv + "=" + tt.mode),
				StartTimeout: cmpOr(tt.timeout, 5*time.Second),
			})
			if p != nil {
				p.Kill()
				t.Fatalf("Start: got a process, want %v", tt.want)
			}
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.wantOut) {
				t.Fatalf("Start: got %v, want %v with %q", err, tt.want, tt.wantOut)
			}
		})
	}
}

func cmpOr(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

func TestStopKillsStubborn(t *testing.T) {
	p, _, err := start(t, "stubborn")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := p.Stop(300 * time.Millisecond); !errors.Is(err, ErrKilled) {
		t.Fatalf("Stop: got %v, want ErrKilled", err)
	}
	if code, err := p.Wait(time.Second); code != -1 || err == nil || !strings.Contains(err.Error(), "signal 9") {
		t.Errorf("Wait: got %d, %v; want -1 and signal 9", code, err)
	}
}

func TestSignalAndWait(t *testing.T) {
	p, _, err := start(t, "exit7")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if code, err := p.Wait(100 * time.Millisecond); code != -1 || !errors.Is(err, ErrStillRunning) {
		t.Errorf("Wait while running: got %d, %v; want -1, ErrStillRunning", code, err)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if code, err := p.Wait(5 * time.Second); code != 7 || err != nil {
		t.Errorf("Wait: got %d, %v; want 7, nil", code, err)
	}
	select {
	case <-p.Exited():
	default:
		t.Error("Exited not closed after Wait")
	}
}

func TestHasAdminListen(t *testing.T) {
	tests := []struct {
		name      string
		args, env []string
		want      bool
	}{
		{"none", []string{"--listen", "127.0.0.1:0"}, nil, false},
		{"flag and value", []string{"--admin-listen", "127.0.0.1:0"}, nil, true},
		{"flag=value", []string{"--admin-listen=127.0.0.1:0"}, nil, true},
		{"one dash", []string{"-admin-listen", "127.0.0.1:0"}, nil, true},
		{"flag turned off", []string{"--admin-listen="}, nil, false},
		{"a value, not a flag", []string{"--agent-command", "admin-listen"}, nil, false},
		{"variable", nil, []string{"TETHER_ADMIN_LISTEN=127.0.0.1:0"}, true},
		{"flag wins over variable", []string{"--admin-listen="}, []string{"TETHER_ADMIN_LISTEN=127.0.0.1:0"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := HasAdminListen(tt.args, tt.env); got != tt.want {
				t.Errorf("HasAdminListen(%q, %q): got %v, want %v", tt.args, tt.env, got, tt.want)
			}
		})
	}
}

func TestEnviron(t *testing.T) {
	t.Setenv("TETHER_TOKEN", "leak")
	env := Environ("A=1")
	for _, kv := range env {
		if strings.HasPrefix(kv, "TETHER_") {
			t.Errorf("Environ has %q", kv)
		}
	}
	if env[len(env)-1] != "A=1" {
		t.Errorf("Environ: got last %q, want A=1", env[len(env)-1])
	}
}

func TestFindRepo(t *testing.T) {
	root, err := FindRepo(".")
	if err != nil {
		t.Fatalf("FindRepo: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "tether")); err != nil {
		t.Errorf("FindRepo: got %s, which has no cmd/tether", root)
	}
	if _, err := FindRepo(t.TempDir()); err == nil {
		t.Error("FindRepo of a temporary directory: got no error")
	}
}

func TestFreeAddrs(t *testing.T) {
	addrs, err := FreeAddrs(5)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 5 {
		t.Fatalf("got %d addresses, want 5", len(addrs))
	}
	s := slices.Clone(addrs)
	slices.Sort(s)
	if len(slices.Compact(s)) != 5 {
		t.Errorf("got %q, want 5 distinct", addrs)
	}
}

func TestKillPTYPlugin(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, grace := range []time.Duration{0, 200 * time.Millisecond} {
		t.Run(fmt.Sprint("grace ", grace), func(t *testing.T) {
			dir := t.TempDir()
			if KillPTYPlugin(dir, self, grace) {
				t.Error("with no record: got killed")
			}
			// A live process of this binary, in the record.
			cmd := exec.Command(self, "serve", "--state-dir", dir)
			cmd.Env = Environ(helperEnv + "=sleep")
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			// Once it says so, it ignores SIGTERM.
			if line, err := bufio.NewReader(out).ReadString('\n'); line != "sleeping\n" {
				t.Fatalf("the sleeper printed %q, %v", line, err)
			}
			if err := os.MkdirAll(filepath.Join(dir, "plugins"), 0o700); err != nil {
				t.Fatal(err)
			}
			rec := fmt.Sprintf(`{"pid":%d}`, cmd.Process.Pid)
			if err := os.WriteFile(filepath.Join(dir, "plugins", "pty.json"), []byte(rec), 0o600); err != nil {
				t.Fatal(err)
			}
			if KillPTYPlugin(dir, "/bin/not-this-binary", grace) {
				t.Error("for another binary: got killed")
			}
			if !KillPTYPlugin(dir, self, grace) {
				t.Error("got not killed, want killed (it ignores SIGTERM for a minute)")
			}
			if err := cmd.Wait(); err == nil {
				t.Error("the recorded process exited 0, want killed")
			}
		})
	}
}
