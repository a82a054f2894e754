// Package umask keeps tether's own files private while the processes
// that run a person's code keep that person's umask.
//
// tether serve sets its umask to 077 first thing (Restrict), so that
// every file and directory it, its plugins and its libraries (SQLite and
// its -wal/-shm, the embedded NATS server's store) make in the state dir
// is 0600 or 0700 from birth. The processes that run the user's code — a
// PTY's shell, an --agent exec command, an --agent acp agent — must not
// inherit that: an agent editing the user's repository would leave files
// nobody else can read. Wrap makes such a command start through a
// trampoline: tether's own binary, run again as
// `tether umask-exec MASK PATH ARGV...`, sets the umask and execs the
// command in its place (the same pid, process group, session, terminal
// and descriptors; argv exactly as given). tether's own umask never
// changes after Restrict, so no file another goroutine makes meanwhile
// gets the user's umask (there is no window around a fork), and nothing
// beyond execve is needed (no unshare, which container seccomp profiles
// refuse).
//
// The umask is the process's, so the one its children get is kept here,
// once for the process, next to it.
package umask

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
)

// Arg is the hidden command under which the tether binary is the
// trampoline: `tether umask-exec MASK PATH ARGV...`.
const Arg = "umask-exec"

// Private is the umask tether runs with: its files are the owner's alone.
const Private = 0o077

// child is the umask the processes Wrap starts get, plus one; 0 means
// none is set and they inherit the process's own.
var child atomic.Int64

// own is the process's umask after Restrict, plus one (0: not known).
var own atomic.Int64

// Restrict sets the process's umask to Private and keeps the one it had
// as the umask of the children Wrap starts. It returns that one.
func Restrict() int {
	old := syscall.Umask(Private)
	own.Store(Private + 1)
	child.Store(int64(old) + 1)
	return old
}

// SetChild makes m the umask of the children Wrap starts (the PTY plugin
// is told its host's user's umask this way; see contract.EnvPluginUmask).
func SetChild(m int) { child.Store(int64(m&0o777) + 1) }

// Child returns the umask the children Wrap starts get, and false when
// none is set (they inherit the process's).
func Child() (int, bool) {
	v := child.Load()
	return int(v - 1), v > 0
}

// Format writes a umask the way the umask(1) builtin does: "0022".
func Format(m int) string { return fmt.Sprintf("%04o", m&0o777) }

// Parse reads a umask in octal ("022" or "0022").
func Parse(s string) (int, error) {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o777 {
		return 0, fmt.Errorf("umask %q: want octal digits, at most 0777", s)
	}
	return int(m), nil
}

// Wrap rewrites cmd, not yet started, so that it starts through the
// trampoline and runs with the umask Child says. It does nothing when no
// child umask is set, when it is the process's own, or when cmd cannot
// start anyway (cmd.Err: its command was not found), so cmd.Start's
// errors stay what they were. cmd.Args keeps nothing of the trampoline
// once the command runs: the trampoline execs PATH with argv as given.
func Wrap(cmd *exec.Cmd) {
	m, ok := Child()
	if !ok || cmd.Err != nil || cmd.Path == "" || int64(m)+1 == own.Load() {
		return
	}
	self := selfPath()
	if self == "" {
		return
	}
	cmd.Args = append([]string{"tether", Arg, Format(m), cmd.Path}, cmd.Args...)
	cmd.Path = self
}

// selfPath is the running binary: /proc/self/exe on Linux (the same
// file even after the path it came from was replaced by an upgrade),
// else os.Executable.
func selfPath() string {
	if runtime.GOOS == "linux" {
		return "/proc/self/exe"
	}
	p, err := os.Executable()
	if err != nil {
		return ""
	}
	return p
}

// Main is the trampoline: with args MASK PATH ARGV..., it sets the umask
// and execs PATH with ARGV and its environment. It returns only when it
// cannot: 2 for bad arguments, else 126 (127 for a missing file) with the
// reason on stderr, as a shell does.
func Main(args []string) int {
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: tether umask-exec MASK PATH ARGV0 [ARG...]")
		return 2
	}
	m, err := Parse(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether umask-exec:", err)
		return 2
	}
	syscall.Umask(m)
	err = syscall.Exec(args[1], args[2:], os.Environ())
	fmt.Fprintf(os.Stderr, "tether: cannot run %s: %v\n", args[1], err)
	if err == syscall.ENOENT {
		return 127
	}
	return 126
}
