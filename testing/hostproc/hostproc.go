// Package hostproc starts the real `tether serve` as a child process and
// drives it: it builds or finds the binary, starts it with arguments and an
// environment on a state directory, reads the listening and admin lines it
// prints on stdout (docs/PROTOCOL.md §1), signals it, waits for
// it with a timeout and keeps its output.
//
// It is the one launcher of the end-to-end harness (testing/e2e) and of the
// benchmarks (bench/cmd/tetherbench). It takes no testing.TB: it returns
// errors and writes the child's stderr to an io.Writer, so a main program
// can use it as well as a test.
//
//	p, err := hostproc.Start(hostproc.Config{
//		Binary:   bin,
//		StateDir: dir,
//		Args:     []string{"--listen", "127.0.0.1:0"},
//		Stderr:   os.Stderr,
//	})
//	if err != nil { ... }
//	defer p.Stop(10 * time.Second)
//	resp, err := http.Get(p.URL + "/healthz")
package hostproc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Lines `tether serve` prints on stdout once it serves (docs/PROTOCOL.md
// §1).
const (
	ListeningPrefix = "tether listening on "
	AdminPrefix     = "tether admin on "
)

// Timeouts of the launcher.
const (
	// DefaultStartTimeout bounds the wait for the listening (and admin)
	// line when Config.StartTimeout is 0.
	DefaultStartTimeout = 30 * time.Second
	// drainTimeout bounds the wait for output still in the pipes once
	// the process has exited (a process it left may hold their write
	// ends).
	drainTimeout = 2 * time.Second
)

// Errors of Start, Stop and Wait.
var (
	// ErrExited: the process exited before it printed its ready lines.
	ErrExited = errors.New("tether serve exited before it was ready")
	// ErrNotReady: the process printed no ready lines within the start
	// timeout (it has been killed).
	ErrNotReady = errors.New("tether serve printed no ready line in time")
	// ErrBadLine: a ready line did not hold the URL it should.
	ErrBadLine = errors.New("bad ready line of tether serve")
	// ErrStillRunning: the process had not exited when Wait's timeout ran
	// out.
	ErrStillRunning = errors.New("tether serve still running")
	// ErrKilled: the process did not exit within Stop's timeout after
	// SIGTERM and was killed.
	ErrKilled = errors.New("tether serve did not exit after SIGTERM and was killed")
)

// Config configures Start.
type Config struct {
	// Binary is the tether binary (see Build).
	Binary string
	// StateDir is passed as --state-dir; it must exist.
	StateDir string
	// Args are the flags after `serve --state-dir DIR`; a flag given
	// twice takes its last value. With --admin-listen (or
	// TETHER_ADMIN_LISTEN in Env) set to an address, Start also waits for
	// the admin line.
	Args []string
	// Env is the child's whole environment; nil means Environ().
	Env []string
	// Stderr receives everything the child writes to stderr; nil
	// discards it.
	Stderr io.Writer
	// StartTimeout bounds the wait for the ready lines; 0 means
	// DefaultStartTimeout. A cluster host prints its listening line only
	// once it has joined the others.
	StartTimeout time.Duration
}

// Process is a started `tether serve`. The exported fields are set by
// Start and not changed afterwards.
type Process struct {
	Cmd      *exec.Cmd
	Binary   string
	StateDir string
	URL      string // scheme://host:port of the public listener
	Addr     string // host:port of the public listener
	Token    string // the access token of the listening line
	AdminURL string // scheme://host:port of the admin listener, "" without one

	stdout    buffer
	exited    chan struct{} // closed once Cmd.Wait has returned
	waitErr   error         // Cmd.Wait's result, set before exited is closed
	drained   sync.WaitGroup
	closeOnce sync.Once  // for CloseOutput
	pipes     []*os.File // read ends of stdout and stderr

	mu        sync.Mutex // guards the fields below
	listening string     // the listening line's URL, once seen
	admin     string     // the admin line's URL, once seen
	seen      chan struct{}
}

// Start runs `cfg.Binary serve --state-dir cfg.StateDir cfg.Args...` in a
// process group of its own (killed with the calling thread's death) and
// returns once it has printed its listening line, and its admin line when
// it was given an admin address. Its stdout is kept (Stdout) and its stderr
// copied to cfg.Stderr all along. When the process exits first (ErrExited),
// prints nothing in time (ErrNotReady) or prints a bad line (ErrBadLine),
// Start kills its process group and returns the error with the stdout
// seen.
func Start(cfg Config) (*Process, error) {
	if cfg.Binary == "" || cfg.StateDir == "" {
		return nil, errors.New("hostproc: Config.Binary and Config.StateDir are required")
	}
	args := append([]string{"serve", "--state-dir", cfg.StateDir}, cfg.Args...)
	cmd := exec.Command(cfg.Binary, args...)
	cmd.Env = cfg.Env
	if cmd.Env == nil {
		cmd.Env = Environ()
	}
	// Its own process group, so that Stop can find what it started; and
	// killed if the thread that started it dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("hostproc: pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("hostproc: pipe: %w", err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("hostproc: start %s serve: %w", cfg.Binary, err)
	}

	p := &Process{
		Cmd:      cmd,
		Binary:   cfg.Binary,
		StateDir: cfg.StateDir,
		exited:   make(chan struct{}),
		pipes:    []*os.File{outR, errR},
		seen:     make(chan struct{}, 1),
	}
	stderr := cfg.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	p.drained.Add(2)
	go func() {
		defer p.drained.Done()
		p.readStdout(outR)
	}()
	go func() {
		defer p.drained.Done()
		_, _ = io.Copy(stderr, errR)
	}()
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()

	timeout := cfg.StartTimeout
	if timeout == 0 {
		timeout = DefaultStartTimeout
	}
	if err := p.awaitReady(HasAdminListen(cfg.Args, cmd.Env), timeout); err != nil {
		p.Kill()
		return nil, fmt.Errorf("hostproc: %w\nstdout:\n%s", err, p.stdout.String())
	}
	return p, nil
}

// awaitReady waits for the listening line (and the admin line when
// wantAdmin) and sets URL, Addr, Token and AdminURL from them.
func (p *Process) awaitReady(wantAdmin bool, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		p.mu.Lock()
		listening, admin := p.listening, p.admin
		p.mu.Unlock()
		if listening != "" && (admin != "" || !wantAdmin) {
			break
		}
		select {
		case <-p.seen:
		case <-p.exited:
			// The last lines may still be on their way.
			p.CloseOutput()
			p.mu.Lock()
			listening, admin = p.listening, p.admin
			p.mu.Unlock()
			if listening == "" || (wantAdmin && admin == "") {
				return fmt.Errorf("%w (%s)", ErrExited, p.ExitDescription())
			}
		case <-timer.C:
			missing := ListeningPrefix
			if listening != "" {
				missing = AdminPrefix
			}
			return fmt.Errorf("%w: no %q line within %v", ErrNotReady, strings.TrimSpace(missing), timeout)
		}
	}

	p.mu.Lock()
	listening, admin := p.listening, p.admin
	p.mu.Unlock()
	u, err := url.Parse(listening)
	if err != nil || u.Host == "" || u.Query().Get("token") == "" {
		return fmt.Errorf("%w %q (want %sHTTP://HOST:PORT/?token=TOKEN)", ErrBadLine, ListeningPrefix+listening, ListeningPrefix)
	}
	p.URL = u.Scheme + "://" + u.Host
	p.Addr = u.Host
	p.Token = u.Query().Get("token")
	if admin != "" {
		a, err := url.Parse(admin)
		if err != nil || a.Host == "" {
			return fmt.Errorf("%w %q (want %sHTTP://HOST:PORT)", ErrBadLine, AdminPrefix+admin, AdminPrefix)
		}
		p.AdminURL = a.Scheme + "://" + a.Host
	}
	return nil
}

// HasAdminListen reports whether args (flags of `tether serve`) or env
// (KEY=VALUE) turn on the admin listener; a flag wins over the variable.
func HasAdminListen(args, env []string) bool {
	for i, a := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "admin-listen" {
			continue
		}
		if !hasValue && i+1 < len(args) {
			value = args[i+1]
		}
		return value != ""
	}
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "TETHER_ADMIN_LISTEN="); ok {
			return v != ""
		}
	}
	return false
}

// readStdout keeps every line of r and notes the listening and admin lines.
func (p *Process) readStdout(r io.Reader) {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		_, _ = p.stdout.Write([]byte(line))
		if l := strings.TrimRight(line, "\r\n"); l != "" {
			p.mu.Lock()
			if v, ok := strings.CutPrefix(l, ListeningPrefix); ok && p.listening == "" {
				p.listening = v
			}
			if v, ok := strings.CutPrefix(l, AdminPrefix); ok && p.admin == "" {
				p.admin = v
			}
			p.mu.Unlock()
			select {
			case p.seen <- struct{}{}:
			default:
			}
		}
		if err != nil {
			return
		}
	}
}

// Pid is the process id of tether serve (also its process group's id).
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Stdout returns everything the process wrote to stdout so far.
func (p *Process) Stdout() string { return p.stdout.String() }

// Exited returns a channel closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is what waiting for the process returned (nil for exit status 0);
// nil while it runs.
func (p *Process) Err() error {
	select {
	case <-p.exited:
		return p.waitErr
	default:
		return nil
	}
}

// ExitDescription says how the process ended ("exited 0", "ended: exit
// status 1"), or "running".
func (p *Process) ExitDescription() string {
	select {
	case <-p.exited:
	default:
		return "running"
	}
	if p.waitErr != nil {
		return "ended: " + p.waitErr.Error()
	}
	return "exited 0"
}

// Signal sends sig to the tether serve process.
func (p *Process) Signal(sig os.Signal) error {
	if err := p.Cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("hostproc: signal %v to pid %d: %w", sig, p.Pid(), err)
	}
	return nil
}

// Wait waits up to timeout for the process to exit and returns its exit
// code. The error is not nil when it is still running after timeout
// (ErrStillRunning, code -1) or was killed by a signal (code -1, the error
// names the signal).
func (p *Process) Wait(timeout time.Duration) (exitCode int, err error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		return -1, fmt.Errorf("hostproc: pid %d: %w after %v", p.Pid(), ErrStillRunning, timeout)
	}
	var ee *exec.ExitError
	if p.waitErr != nil && !errors.As(p.waitErr, &ee) {
		return -1, fmt.Errorf("hostproc: wait for pid %d: %w", p.Pid(), p.waitErr)
	}
	if ws, ok := p.Cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, fmt.Errorf("hostproc: tether serve terminated by signal %d (%v)", int(ws.Signal()), ws.Signal())
	}
	return p.Cmd.ProcessState.ExitCode(), nil
}

// Stop ends the process: SIGTERM, then SIGKILL when it has not exited
// within timeout (the error is then ErrKilled); then SIGKILL to whatever
// is left of its process group (plugins it started) and the pipes are
// closed. A PTY plugin the host left running for the next host is not in
// its group: see KillPTYPlugin. Stop of an exited process only cleans up.
func (p *Process) Stop(timeout time.Duration) error {
	var err error
	select {
	case <-p.exited:
	default:
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(timeout)
		select {
		case <-p.exited:
		case <-t.C:
			err = fmt.Errorf("hostproc: pid %d: %w (after %v)", p.Pid(), ErrKilled, timeout)
			_ = p.Cmd.Process.Kill()
			<-p.exited
		}
		t.Stop()
	}
	p.Kill()
	return err
}

// Kill sends SIGKILL to the process group, waits for the process and
// closes the pipes.
func (p *Process) Kill() {
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	<-p.exited
	p.CloseOutput()
}

// CloseOutput waits a little for the output still in the pipes, then
// closes them: a process that outlived the host may still hold their
// write ends. Call it only once the process has exited; Stop and Kill do.
func (p *Process) CloseOutput() {
	p.closeOnce.Do(p.closeOutputOnce)
}

func (p *Process) closeOutputOnce() {
	done := make(chan struct{})
	go func() {
		p.drained.Wait()
		close(done)
	}()
	t := time.NewTimer(drainTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	for _, f := range p.pipes {
		f.Close()
	}
	<-done
}

// buffer is a bytes.Buffer safe for concurrent use.
type buffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
