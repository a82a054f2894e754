package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// tail keeps the last bytes written to it (a process's stderr).
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 16<<20 {
		t.buf = t.buf[len(t.buf)-8<<20:]
	}
	return len(p), nil
}

func (t *tail) all() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// String is the last 2 KiB written.
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf[max(0, len(t.buf)-2<<10):])
}

// running is every server started and not yet stopped, for stopOnSignal.
var running sync.Map // *server -> struct{}

// stopOnSignal stops every running server when the benchmark is
// interrupted: they run in process groups of their own and would
// otherwise outlive it.
func stopOnSignal() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		<-ch
		running.Range(func(k, _ any) bool {
			k.(*server).kill()
			return true
		})
		if tmpRoot != "" {
			os.RemoveAll(tmpRoot)
		}
		os.Exit(130)
	}()
}

// server is a started `tether serve` (or a baseline server process).
type server struct {
	cmd      *exec.Cmd
	stderr   *tail
	addr     string // host:port of the public listener
	token    string
	admin    string // host:port of the admin listener, or ""
	stateDir string
	exited   chan struct{}
	waitErr  error
	bin      string
}

// tetherOpts are the flags a row starts tether with.
type tetherOpts struct {
	ptyCommand string // "" keeps the default shell
	listen     string // default 127.0.0.1:0
	token      string // default: tether makes one up
	stateDir   string // default: a fresh temp dir
	admin      bool
	extra      []string
	env        []string // added to tether's environment (KEY=VALUE)
	// wait bounds the wait for the URL line (0: 30 s). A cluster host
	// prints it only once it has joined the others.
	wait time.Duration
}

// startTether runs `tether serve` and waits for its first stdout line.
func startTether(bin string, o tetherOpts) (*server, error) {
	if o.listen == "" {
		o.listen = "127.0.0.1:0"
	}
	if o.stateDir == "" {
		d, err := os.MkdirTemp(tmpRoot, "state-")
		if err != nil {
			return nil, err
		}
		o.stateDir = d
	}
	level := "warn"
	if l := os.Getenv("TETHERBENCH_LOG_LEVEL"); l != "" {
		level = l // for debugging the harness
	}
	args := []string{"serve", "--listen", o.listen, "--state-dir", o.stateDir, "--log-level", level, "--log-format", "json"}
	if o.token != "" {
		args = append(args, "--token", o.token)
	}
	if o.ptyCommand != "" {
		args = append(args, "--pty-command", o.ptyCommand)
	}
	if o.admin {
		args = append(args, "--admin-listen", "127.0.0.1:0")
	}
	args = append(args, o.extra...)
	s := &server{bin: bin, stderr: &tail{}, stateDir: o.stateDir, exited: make(chan struct{})}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Env = append(cleanEnv(), o.env...)
	s.cmd.Stderr = s.stderr
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start tether: %w", err)
	}
	running.Store(s, struct{}{})
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	lines := make(chan string, 2)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
	}()
	want := 1
	if o.admin {
		want = 2
	}
	if o.wait == 0 {
		o.wait = 30 * time.Second
	}
	timeout := time.After(o.wait)
	for got := 0; got < want; got++ {
		var line string
		var ok bool
		select {
		case line, ok = <-lines:
		case <-timeout:
			s.kill()
			return nil, fmt.Errorf("tether did not print its URL in %v; stderr:\n%s", o.wait, s.stderr)
		}
		if !ok {
			s.kill()
			return nil, fmt.Errorf("tether exited before printing its URL; stderr:\n%s", s.stderr)
		}
		switch {
		case strings.HasPrefix(line, "tether listening on "):
			u, err := url.Parse(strings.TrimPrefix(line, "tether listening on "))
			if err != nil {
				s.kill()
				return nil, fmt.Errorf("bad URL line %q", line)
			}
			s.addr, s.token = u.Host, u.Query().Get("token")
		case strings.HasPrefix(line, "tether admin on "):
			u, err := url.Parse(strings.TrimPrefix(line, "tether admin on "))
			if err != nil {
				s.kill()
				return nil, fmt.Errorf("bad admin line %q", line)
			}
			s.admin = u.Host
		default:
			got--
		}
	}
	return s, nil
}

// cleanEnv is the environment without TETHER_* settings (so a developer's
// shell cannot change what is measured) and without GOFLAGS.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "TETHER_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// baseURL is the host's base URL for package client (the token goes in
// client.Options, as a header).
func (s *server) baseURL() string { return "http://" + s.addr }

// wsURL is the URL of path with the token in the query, for the wsc
// instrument.
func (s *server) wsURL(path, query string) string {
	q := "token=" + url.QueryEscape(s.token)
	if query != "" {
		q += "&" + query
	}
	return "ws://" + s.addr + path + "?" + q
}

func (s *server) pid() int { return s.cmd.Process.Pid }

// stop ends the server: SIGTERM, SIGKILL of its process group after 6 s,
// and whatever PTY plugin it left behind.
func (s *server) stop() {
	if s == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(6 * time.Second):
	}
	s.kill()
}

// stopKeepPTY stops the host like stop but leaves the PTY plugin it may
// have left for the next host (docs/PROTOCOL.md, 13.6) running.
func (s *server) stopKeepPTY() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(6 * time.Second):
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
	running.Delete(s)
}

func (s *server) kill() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
	s.killLeftPTYPlugin()
	running.Delete(s)
}

// killLeftPTYPlugin kills the PTY plugin recorded in the state dir
// (docs/PROTOCOL.md 13.6 lets it outlive its host) when it is still our binary.
func (s *server) killLeftPTYPlugin() {
	if s.stateDir == "" {
		return
	}
	b, err := os.ReadFile(filepath.Join(s.stateDir, "plugins", "pty.json"))
	if err != nil {
		return
	}
	var rec struct {
		PID int `json:"pid"`
	}
	if json.Unmarshal(b, &rec) != nil || rec.PID <= 0 {
		return
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", rec.PID))
	if err != nil || strings.TrimSuffix(exe, " (deleted)") != s.bin {
		return
	}
	_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
	_ = syscall.Kill(rec.PID, syscall.SIGKILL)
}

// pluginPID finds the child of the process hostPID whose command line
// contains "plugin" and then name.
func pluginPID(hostPID int, name string) (int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid(pid) != hostPID {
			continue
		}
		cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "plugin" && args[i+1] == name {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no child of %d runs `plugin %s`", hostPID, name)
}

func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The command name is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return -1
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// rssKiB is VmRSS of pid in KiB.
func rssKiB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				return strconv.ParseInt(f[1], 10, 64)
			}
		}
	}
	return 0, errors.New("no VmRSS")
}

// startHelper runs this binary as a baseline server (`tetherbench
// helper KIND args...`) and reads the address it prints first.
func startHelper(kind string, args ...string) (*server, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	s := &server{stderr: &tail{}, exited: make(chan struct{})}
	s.cmd = exec.Command(self, append([]string{"helper", kind}, args...)...)
	s.cmd.Stderr = s.stderr
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	running.Store(s, struct{}{})
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		s.kill()
		return nil, fmt.Errorf("helper %s: %v; stderr:\n%s", kind, err, s.stderr)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	s.addr = strings.TrimSpace(line)
	if _, _, err := net.SplitHostPort(s.addr); err != nil {
		s.kill()
		return nil, fmt.Errorf("helper %s printed %q", kind, line)
	}
	return s, nil
}

// freePort returns a loopback address no one listens on (for a moment).
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr, nil
}

// cpuTime is the CPU time of a process and of its waited-for children.
type cpuTime struct{ self, children float64 }

func (a cpuTime) sub(b cpuTime) cpuTime {
	return cpuTime{self: a.self - b.self, children: a.children - b.children}
}

// procCPU reads utime+stime and cutime+cstime of pid (in seconds,
// USER_HZ 100).
func procCPU(pid int) cpuTime {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return cpuTime{}
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return cpuTime{}
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return cpuTime{}
	}
	v := func(k int) float64 { n, _ := strconv.ParseFloat(f[k], 64); return n / 100 }
	return cpuTime{self: v(11) + v(12), children: v(13) + v(14)}
}

// selfCPU is this process's CPU time.
func selfCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// children lists the pids whose parent is pid.
func children(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		k, err := strconv.Atoi(e.Name())
		if err == nil && ppid(k) == pid && !zombie(k) {
			out = append(out, k)
		}
	}
	return out
}

// waitNoChildren waits (at most d) until pid has no live children: a PTY
// child still writing after its socket was closed would steal CPU from
// the next run.
func waitNoChildren(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if len(children(pid)) == 0 {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}
