package pty

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/internal/umask"
)

// readBufSize is the drain's read size.
const readBufSize = 64 << 10

// exitGrace is how long output is still read after the child has exited,
// when something else keeps the terminal open; and how long the child may
// take to exit after its terminal closed before it is killed.
const exitGrace = 500 * time.Millisecond

// ptyRec is one PTY: its child, master and ring.
type ptyRec struct {
	token   string
	epoch   string
	pid     int // the child's pid, also its process group and session id
	created time.Time
	argv    []string // the command line as given (cmd.Args may lead with the umask trampoline)
	cmd     *exec.Cmd
	master  *os.File      // non-blocking, in the runtime poller
	exited  chan struct{} // closed once the child has exited (not yet reaped)
	log     zerolog.Logger
	room    sync.Cond // on mu: broadcast when the stream's cursor advances or the stream unlinks
	screen  *screen   // the screen model, fed by its own goroutine

	// testHookWait, when set, is called (under mu) each time the drain
	// waits for the stream.
	testHookWait func()
	noFeed       bool // see Backend.testNoFeed

	mu       sync.Mutex // guards the fields below
	ring     *ring
	sizes    []sizeAt // terminal sizes by offset, from the one in effect at the ring's start on
	cols     int      // the terminal's size now
	rows     int
	linked   bool  // an Output stream is linked and holds a cursor for this PTY
	cursor   int64 // the linked stream's cursor: the bytes before it are sent
	writer   contract.TransportID
	viewers  map[contract.TransportID]struct{}
	detached time.Time // when the PTY was last left without a writer
	reaped   bool      // the child was waited for: its pid may be reused
	done     bool      // all output is in the ring and exitCode is set
	exitCode int
}

// spawn starts a child on a new PTY in its own session and process group.
func (b *Backend) spawn(cfg contract.BackendConfig, req contract.AttachRequest) (*ptyRec, error) {
	argv := req.Argv
	if len(argv) == 0 {
		argv = cfg.Argv
	}
	cols, rows := req.Cols, req.Rows
	if cols == 0 {
		cols = DefaultCols
	}
	if rows == 0 {
		rows = DefaultRows
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = childEnv()
	umask.Wrap(cmd) // the user's umask (contract.EnvPluginUmask), not the plugin's 077
	f, err := pty.StartWithAttrs(cmd, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)},
		&syscall.SysProcAttr{Setsid: true, Setctty: true})
	if err != nil {
		return nil, fmt.Errorf("spawn %q: %w", argv[0], err)
	}
	rec := &ptyRec{
		token:    req.Token,
		epoch:    newEpoch(),
		pid:      cmd.Process.Pid,
		created:  time.Now(),
		argv:     argv,
		cmd:      cmd,
		exited:   make(chan struct{}),
		ring:     newRing(int(cfg.Buffer)),
		sizes:    []sizeAt{{0, cols, rows}},
		cols:     cols,
		rows:     rows,
		screen:   newScreen(cols, rows, cfg.Scrollback, &b.rebuilds),
		viewers:  make(map[contract.TransportID]struct{}),
		detached: time.Now(),
	}
	rec.room.L = &rec.mu
	rec.testHookWait = b.testHookDrainWait
	rec.noFeed = b.testNoFeed
	rec.log = b.log.With().Str("epoch", rec.epoch).Int("pid", rec.pid).Logger()
	rec.master, err = pollable(f)
	if err != nil {
		_ = syscall.Kill(-rec.pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return nil, fmt.Errorf("spawn: %w", err)
	}
	return rec, nil
}

// pollable returns a non-blocking duplicate of the master f and closes f.
// creack/pty hands out its master in blocking mode (it calls Fd), where a
// Read can neither time out nor be woken by Close.
func pollable(f *os.File) (*os.File, error) {
	defer f.Close()
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup pty master: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("pty master non-blocking: %w", err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// childEnv is the plugin's environment with TERM=xterm-256color.
func childEnv() []string {
	env := os.Environ()
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		// The shell gets the plugin's environment without go-plugin's
		// handshake variables (TETHER_PLUGIN, PLUGIN_*).
		if !strings.HasPrefix(kv, "TERM=") && !strings.HasPrefix(kv, "TETHER_") && !strings.HasPrefix(kv, "PLUGIN_") {
			out = append(out, kv)
		}
	}
	return append(out, "TERM=xterm-256color")
}

// newEpoch returns a fresh random PTY epoch: 16 hex characters.
func newEpoch() string { return contract.RandomHex(8) }

// drain is the one reader of rec's master: it appends everything to the
// ring and wakes the Output sender. While a stream is linked it never
// reads more than the ring can take without overwriting bytes the stream
// has not sent: it waits for the stream instead, the terminal's buffer
// fills and the kernel blocks the child in write, as a direct pump would.
// With no stream linked it runs free and the ring keeps the latest output.
// It ends when the terminal is closed (EIO), or when output stops after the
// child exited, and then finishes the PTY.
func (b *Backend) drain(rec *ptyRec) {
	defer b.wg.Done()
	buf := make([]byte, readBufSize)
	for {
		n, err := rec.master.Read(buf[:rec.waitRoom(len(buf))])
		if n > 0 {
			rec.append(buf[:n])
			wake(b.outWake)
		}
		if err != nil {
			if rec.drainEnded(err, buf) {
				wake(b.outWake)
			}
			break
		}
	}
	b.finish(rec)
}

// drainEnded handles the error that ended the drain. It reports whether
// it appended output.
func (rec *ptyRec) drainEnded(err error, buf []byte) bool {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The child is gone but the terminal is held open: take what the
		// kernel still has, then stop.
		rec.log.Debug().Msg("pty still open after the child exited")
		return rec.sweep(buf)
	case isEIO(err), errors.Is(err, io.EOF):
	default:
		rec.log.Warn().Err(err).Msg("pty read")
	}
	return false
}

// sweep appends what can be read from the master without waiting for the
// child (it still waits for a linked stream, as drain does).
func (rec *ptyRec) sweep(buf []byte) (got bool) {
	rc, err := rec.master.SyscallConn()
	if err != nil {
		return false
	}
	for {
		p := buf[:rec.waitRoom(len(buf))]
		var n int
		var rerr error
		if err := rc.Control(func(fd uintptr) {
			for {
				n, rerr = unix.Read(int(fd), p)
				if rerr != unix.EINTR {
					return
				}
			}
		}); err != nil {
			return got
		}
		if n > 0 {
			rec.append(p[:n])
			got = true
		}
		if n <= 0 || rerr != nil {
			return got
		}
	}
}

// waitRoom waits while a linked stream is so far behind that a read of
// the drain's chunk (limit bytes, at most half the ring) would overwrite
// bytes it has not sent yet, and returns how many bytes may be read now:
// at most limit; with no stream linked, limit.
func (rec *ptyRec) waitRoom(limit int) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	size := rec.ring.size
	if size <= 0 {
		return limit
	}
	chunk := min(limit, (size+1)/2)
	for rec.linked {
		if free := size - int(rec.ring.EndOffset()-rec.cursor); free >= chunk {
			return min(free, limit)
		}
		if rec.testHookWait != nil {
			rec.testHookWait()
		}
		rec.room.Wait()
	}
	return limit
}

// advance records that the linked stream has sent everything before cur,
// and wakes the drain if it waits for room.
func (rec *ptyRec) advance(cur int64) {
	rec.mu.Lock()
	if rec.linked && cur > rec.cursor {
		rec.cursor = cur
		rec.room.Broadcast()
	}
	rec.mu.Unlock()
}

// linkLocked records whether a stream is linked (with its cursor) and
// wakes the drain; rec.mu is held.
func (rec *ptyRec) linkLocked(linked bool, cursor int64) {
	rec.linked, rec.cursor = linked, cursor
	rec.room.Broadcast()
}

// append adds p to the ring and wakes the screen model's feeder, which
// takes it from the ring on its own time.
func (rec *ptyRec) append(p []byte) {
	rec.mu.Lock()
	rec.ring.Append(p)
	rec.mu.Unlock()
	rec.wakeFeeder()
}

// wakeFeeder wakes the screen model's feeder, unless the model is stale
// (the feeder then waits for the output to pause) or not fed at all.
func (rec *ptyRec) wakeFeeder() {
	if !rec.noFeed && !rec.screen.lagging.Load() {
		wake(rec.screen.wake)
	}
}

// waitExit waits for the child to exit without reaping it, so its pid and
// process group stay reserved until finish has killed the group. It then
// gives the drain exitGrace to read what is left.
func (b *Backend) waitExit(rec *ptyRec) {
	defer b.wg.Done()
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, rec.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			if err != nil {
				rec.log.Warn().Err(err).Msg("waitid")
			}
			break
		}
	}
	_ = rec.master.SetReadDeadline(time.Now().Add(exitGrace))
	close(rec.exited)
}

// finish ends a PTY whose output is complete: it makes sure the child and
// its process group are dead, reaps the child, closes the master and marks
// the record done, removing it from the registry if it is still there. The
// exit marker goes out on the Output stream after the last bytes.
func (b *Backend) finish(rec *ptyRec) {
	select {
	case <-rec.exited:
	default:
		t := time.NewTimer(exitGrace)
		select {
		case <-rec.exited:
		case <-t.C:
			rec.log.Debug().Msg("pty closed but the child runs on: killing it")
			rec.kill()
			<-rec.exited
		}
		t.Stop()
	}
	rec.kill() // what is left of the group; the zombie child holds the pgid
	rec.mu.Lock()
	rec.reaped = true
	rec.mu.Unlock()
	_ = rec.cmd.Wait() // a non-zero status is an ExitError; the state is what we need
	code := exitCode(rec.cmd.ProcessState)
	_ = rec.master.Close()
	rec.screen.close()

	b.mu.Lock()
	rec.mu.Lock()
	rec.done = true
	rec.exitCode = code
	rec.writer = contract.TransportID{}
	clear(rec.viewers)
	end := rec.ring.EndOffset()
	if b.streamDone == nil {
		rec.ring.Discard() // no stream to send it; a new one starts at end
	}
	rec.mu.Unlock()
	if b.ptys[rec.token] == rec {
		delete(b.ptys, rec.token)
	}
	b.mu.Unlock()
	wake(b.outWake)
	rec.log.Debug().Int("exit_code", code).Int64("end_offset", end).Msg("pty exited")
}

// exitCode is the child's exit status, or 128+signal when it was killed.
func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// kill sends SIGKILL to the child's whole process group, unless the child
// has been reaped (its pid could belong to someone else by now).
func (rec *ptyRec) kill() {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.reaped {
		return
	}
	if err := syscall.Kill(-rec.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		rec.log.Warn().Err(err).Msg("kill pty process group")
	}
}

// abort ends a PTY that was spawned but never registered.
func (rec *ptyRec) abort() {
	_ = syscall.Kill(-rec.pid, syscall.SIGKILL)
	_ = rec.cmd.Wait()
	_ = rec.master.Close()
}

// isWriter reports whether viewer is rec's current writer.
func (rec *ptyRec) isWriter(viewer contract.TransportID) bool {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return !viewer.IsZero() && rec.writer == viewer
}

// setSize sets the terminal size through the poller-owned descriptor
// (pty.Setsize would switch the master to blocking mode).
// The feeder is woken to render the snapshot of the new size ahead, for a
// child that draws nothing after it.
func (rec *ptyRec) setSize(cols, rows int) error {
	rec.mu.Lock()
	err := rec.setSizeLocked(cols, rows)
	rec.mu.Unlock()
	rec.wakeFeeder()
	return err
}

// setSizeLocked is setSize with rec.mu held.
func (rec *ptyRec) setSizeLocked(cols, rows int) error {
	rc, err := rec.master.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: uint16(cols), Row: uint16(rows)})
	}); err != nil {
		return err
	}
	if ioErr == nil && (cols != rec.cols || rows != rec.rows) {
		// Under rec.mu, as the drain appends: the bytes after this
		// offset are the child's answer to the new size.
		rec.resizedLocked(cols, rows)
	}
	return ioErr
}

// info describes rec; the caller holds the registry lock.
func (rec *ptyRec) info() contract.PTYInfo {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return contract.PTYInfo{
		Token:          rec.token,
		Epoch:          rec.epoch,
		Pid:            rec.pid,
		StartOffset:    rec.ring.StartOffset(),
		EndOffset:      rec.ring.EndOffset(),
		Writer:         rec.writer,
		Viewers:        len(rec.viewers),
		Exited:         rec.done,
		Created:        rec.created,
		Detached:       rec.detached,
		Cols:           rec.cols,
		Rows:           rec.rows,
		ScreenRebuilds: rec.screen.rebuilds.Load(),
	}
}

func isEIO(err error) bool { return errors.Is(err, syscall.EIO) }
