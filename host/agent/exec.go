package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/internal/umask"
)

var _ Agent = (*Exec)(nil)

const (
	// stderrTail is how much of the end of a command's standard error a
	// failed run's error carries.
	stderrTail = 4 << 10
	// maxDelta is the longest delta Exec emits: a longer line is streamed in
	// pieces of at most this many bytes, cut between UTF-8 characters.
	maxDelta = 64 << 10
	// exitGrace bounds how long a run waits for the command's pipes to
	// close after the command exited and its process group was killed.
	// They stay open only when a descendant that left the group (setsid)
	// still holds them.
	exitGrace = 2 * time.Second
)

// Exec is an agent that answers each prompt by running a command: the
// prompt is written to the command's standard input, which is then closed,
// and its standard output is streamed back one line (with its "\n") per
// delta, as the lines arrive. The history is not given to the command.
//
// The command runs in its own process group. When it exits, or when the run
// is interrupted, the whole group is killed, so that nothing it started
// outlives the run.
type Exec struct {
	argv []string // constant after construction
}

// NewExecFactory returns a factory of Exec agents running argv[0] with
// arguments argv[1:] (argv[0] is looked up in PATH unless it contains a
// slash). It returns ErrNoCommand when argv is empty or argv[0] is "".
//
// The factory does not look for the command itself, so a host can start
// (and keep serving) while it is missing; every NewAgent does, and returns
// an error wrapping ErrCommandNotFound (and the exec.LookPath error) when
// argv[0] cannot be found or is not executable.
func NewExecFactory(argv []string) (Factory, error) {
	if len(argv) == 0 || argv[0] == "" {
		return nil, fmt.Errorf("exec agent: %w", ErrNoCommand)
	}
	argv = append([]string(nil), argv...)
	return FactoryFunc(func(ctx context.Context, sessionKey string, _ json.RawMessage) (Agent, error) {
		if _, err := exec.LookPath(argv[0]); err != nil {
			return nil, fmt.Errorf("exec agent: %w: %w", ErrCommandNotFound, err)
		}
		return &Exec{argv: argv}, nil
	}), nil
}

// Close does nothing: an Exec holds no process between runs.
func (e *Exec) Close() error { return nil }

// Run runs the command once for prompt and emits its standard output line by
// line from the calling goroutine. It returns nil when the command exits with
// status 0, an error wrapping ErrRunFailed (with the tail of the command's
// standard error) when it cannot be started or exits otherwise, and an error
// wrapping ctx.Err() when ctx is cancelled first: then the command's process
// group is killed and waited for, and nothing more is emitted.
func (e *Exec) Run(ctx context.Context, history []Message, prompt string, emit func(delta string)) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("exec agent: %w", err)
	}
	// The three pipes are the run's own (not exec's copying goroutines), so
	// that cmd.Wait returns as soon as the process exits, and the run can
	// close its ends if a descendant that escaped the group holds the others.
	var p pipes
	defer p.closeAll()
	if err := p.open(); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrRunFailed, e.argv[0], err)
	}
	cmd := exec.Command(e.argv[0], e.argv[1:]...)
	cmd.Env = contract.WithoutTetherEnv(os.Environ())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = p.stdinR, p.stdoutW, p.stderrW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	umask.Wrap(cmd) // the user's umask, not tether's 077
	err := cmd.Start()
	p.closeChildEnds() // the child has its copies
	if err != nil {
		return fmt.Errorf("%w: start %s: %w", ErrRunFailed, e.argv[0], err)
	}
	pgid := cmd.Process.Pid

	var wg sync.WaitGroup
	defer wg.Wait()
	exited := make(chan error, 1)
	wg.Go(func() { exited <- cmd.Wait() })
	stdinDone := make(chan struct{})
	wg.Go(func() {
		defer close(stdinDone)
		// An error means the command stopped reading; it will tell by
		// its exit status.
		_, _ = io.WriteString(p.stdinW, prompt)
		_ = p.stdinW.Close()
	})
	stderr := &tailBuffer{max: stderrTail}
	stderrDone := make(chan struct{})
	wg.Go(func() {
		defer close(stderrDone)
		_, _ = io.Copy(stderr, p.stderrR)
	})
	lines := make(chan string)
	wg.Go(func() {
		defer close(lines)
		readDeltas(p.stdoutR, lines)
	})

	var (
		done        = ctx.Done()
		interrupted bool
		waitErr     error
		grace       <-chan time.Time
	)
	for lines != nil || exited != nil || stdinDone != nil || stderrDone != nil {
		select {
		case line, ok := <-lines:
			if !ok {
				lines = nil
				continue
			}
			if !interrupted {
				emit(line)
			}
		case <-stdinDone:
			stdinDone = nil
		case <-stderrDone:
			stderrDone = nil
		case <-done:
			done = nil
			interrupted = true
			killGroup(pgid)
		case waitErr = <-exited:
			exited = nil
			// The leader is gone; so must be whatever it left in its
			// group. The pipes then close once drained, unless a
			// descendant escaped the group with them: the grace timer
			// bounds that wait.
			killGroup(pgid)
			timer := time.NewTimer(exitGrace)
			defer timer.Stop()
			grace = timer.C
		case <-grace:
			grace = nil
			p.closeAll() // unblocks the goroutines still on a pipe
		}
	}

	switch {
	case interrupted:
		return fmt.Errorf("exec agent: %s interrupted: %w", e.argv[0], ctx.Err())
	case waitErr == nil:
		return nil
	}
	if tail := stderr.String(); tail != "" {
		return fmt.Errorf("%w: %s: %w; stderr: %s", ErrRunFailed, e.argv[0], waitErr, tail)
	}
	return fmt.Errorf("%w: %s: %w", ErrRunFailed, e.argv[0], waitErr)
}

// pipes are the standard input, output and error pipes of one run.
type pipes struct {
	stdinR, stdinW   *os.File
	stdoutR, stdoutW *os.File
	stderrR, stderrW *os.File
}

// open creates the three pipes. On error, closeAll closes what was created.
func (p *pipes) open() error {
	var err error
	if p.stdinR, p.stdinW, err = os.Pipe(); err != nil {
		return fmt.Errorf("stdin pipe: %w", err)
	}
	if p.stdoutR, p.stdoutW, err = os.Pipe(); err != nil {
		return fmt.Errorf("stdout pipe: %w", err)
	}
	if p.stderrR, p.stderrW, err = os.Pipe(); err != nil {
		return fmt.Errorf("stderr pipe: %w", err)
	}
	return nil
}

// closeChildEnds closes the ends the child process uses.
func (p *pipes) closeChildEnds() {
	closeFiles(p.stdinR, p.stdoutW, p.stderrW)
}

// closeAll closes every end. Closing an end twice is harmless, and closing
// the run's ends unblocks a goroutine reading or writing them.
func (p *pipes) closeAll() {
	closeFiles(p.stdinR, p.stdinW, p.stdoutR, p.stdoutW, p.stderrR, p.stderrW)
}

// closeFiles closes the non-nil files, ignoring errors (a second close).
func closeFiles(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			_ = f.Close()
		}
	}
}

// killGroup kills every process in the process group pgid. A group that is
// already gone is not an error.
func killGroup(pgid int) {
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// readDeltas sends r's content to out one line at a time, each with its
// "\n"; a final line without one is sent too. A line longer than maxDelta is
// sent in pieces cut between UTF-8 characters. It returns when r reports
// end of file or an error.
func readDeltas(r io.Reader, out chan<- string) {
	br := bufio.NewReaderSize(r, maxDelta)
	var carry []byte // the start of a character cut by a full buffer
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 || len(carry) > 0 {
			buf := append(carry, chunk...)
			carry = nil
			if errors.Is(err, bufio.ErrBufferFull) {
				cut := runeBoundary(buf)
				carry = append([]byte(nil), buf[cut:]...)
				buf = buf[:cut]
			}
			if len(buf) > 0 {
				out <- string(buf)
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if len(carry) > 0 {
				out <- string(carry)
			}
			return
		}
	}
}

// runeBoundary returns the length of the longest prefix of b that does not
// end inside an incomplete UTF-8 character.
func runeBoundary(b []byte) int {
	for back := 1; back <= utf8.UTFMax && back <= len(b); back++ {
		i := len(b) - back
		if utf8.RuneStart(b[i]) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}

// tailBuffer is an io.Writer that keeps the last max bytes written to it.
type tailBuffer struct {
	max int // constant after construction

	mu        sync.Mutex // guards the fields below
	buf       []byte
	truncated bool
}

// Write keeps the end of p. It never fails.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(p) > t.max {
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		t.truncated = true
		return len(p), nil
	}
	if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.truncated = true
	}
	t.buf = append(t.buf, p...)
	return len(p), nil
}

// String returns what was kept as valid UTF-8, trimmed of surrounding
// whitespace, with a leading "…" when earlier bytes were dropped.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(strings.ToValidUTF8(string(t.buf), ""))
	if t.truncated && s != "" {
		s = "…" + s
	}
	return s
}
