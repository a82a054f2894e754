package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tether-agent/tether/testing/hostproc"
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
	waitErr  error // set before exited is closed
	bin      string
	proc     *hostproc.Process // the tether serve; nil for a baseline
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

// args are the flags of `tether serve` after --state-dir.
func (o tetherOpts) args() []string {
	listen := o.listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	level := "warn"
	if l := os.Getenv("TETHERBENCH_LOG_LEVEL"); l != "" {
		level = l // for debugging the harness
	}
	args := []string{"--listen", listen, "--log-level", level, "--log-format", "json"}
	if o.token != "" {
		args = append(args, "--token", o.token)
	}
	if o.ptyCommand != "" {
		args = append(args, "--pty-command", o.ptyCommand)
	}
	if o.admin {
		args = append(args, "--admin-listen", "127.0.0.1:0")
	}
	return append(args, o.extra...)
}

// startTether runs `tether serve` (through testing/hostproc) and waits
// until it serves.
func startTether(bin string, o tetherOpts) (*server, error) {
	if o.stateDir == "" {
		d, err := os.MkdirTemp(tmpRoot, "state-")
		if err != nil {
			return nil, fmt.Errorf("state dir: %w", err)
		}
		o.stateDir = d
	}
	stderr := &tail{}
	p, err := hostproc.Start(hostproc.Config{
		Binary:       bin,
		StateDir:     o.stateDir,
		Args:         o.args(),
		Env:          hostproc.Environ(o.env...),
		Stderr:       stderr,
		StartTimeout: o.wait,
	})
	if err != nil {
		return nil, fmt.Errorf("%w; stderr:\n%s", err, stderr)
	}
	s := &server{
		cmd:      p.Cmd,
		stderr:   stderr,
		addr:     p.Addr,
		token:    p.Token,
		admin:    strings.TrimPrefix(strings.TrimPrefix(p.AdminURL, "http://"), "https://"),
		stateDir: o.stateDir,
		exited:   make(chan struct{}),
		bin:      bin,
		proc:     p,
	}
	running.Store(s, struct{}{})
	go func() {
		<-p.Exited()
		s.waitErr = p.Err()
		close(s.exited)
	}()
	return s, nil
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

// stopTimeout is how long a server has to exit after SIGTERM.
const stopTimeout = 6 * time.Second

// stop ends the server: SIGTERM, SIGKILL of its process group after 6 s,
// and whatever PTY plugin it left behind.
func (s *server) stop() {
	if s == nil {
		return
	}
	if s.proc == nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(stopTimeout):
		}
	} else {
		_ = s.proc.Stop(stopTimeout)
	}
	s.kill()
}

// stopKeepPTY stops the host like stop but leaves the PTY plugin it may
// have left for the next host (docs/PROTOCOL.md §13.6) running.
func (s *server) stopKeepPTY() {
	_ = s.proc.Stop(stopTimeout)
	<-s.exited
	running.Delete(s)
}

// kill sends SIGKILL to the server's process group, waits for it, and
// kills the PTY plugin a tether server left behind.
func (s *server) kill() {
	if s.proc != nil {
		s.proc.Kill()
	} else {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-s.exited
	s.killLeftPTYPlugin()
	running.Delete(s)
}

// killLeftPTYPlugin kills the PTY plugin recorded in the state dir
// (docs/PROTOCOL.md §13.6 lets it outlive its host) when it is still our
// binary.
func (s *server) killLeftPTYPlugin() {
	if s.stateDir != "" {
		hostproc.KillPTYPlugin(s.stateDir, s.bin, 0)
	}
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
	addrs, err := hostproc.FreeAddrs(1)
	if err != nil {
		return "", err
	}
	return addrs[0], nil
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
