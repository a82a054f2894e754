package host

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/supervise"
	"github.com/tether-agent/tether/internal/statedir"
)

// LockFile is the name of the host's lock in its state dir: a host holds
// an exclusive flock on it for its whole life, and writes its pid into it.
const LockFile = "lock"

// State dir errors; test for them with errors.Is.
var (
	// ErrStateDirInUse: another host holds the state dir's lock.
	ErrStateDirInUse = errors.New("state dir in use")
	// ErrStateDirNotTrusted: the state dir, or a path in it, is owned by
	// another user, writable by group or others, or a symbolic link
	// (docs/PROTOCOL.md, "The state dir").
	ErrStateDirNotTrusted = statedir.ErrNotTrusted
)

// PrepareStateDir makes dir ready for a host, or refuses it: it creates
// it (mode 0700) when missing; refuses it, changing nothing, when it or
// anything in it is a symbolic link, owned by another user, writable by
// group or others, or not a file tether keeps there (an error wrapping
// ErrStateDirNotTrusted, one line naming the path and the fix); and
// takes the group and other bits off what is ours but readable by others,
// saying so at info level. tether doctor reports the same findings
// (Diagnose), from the same check.
func PrepareStateDir(dir string, log zerolog.Logger) error {
	return statedir.Prepare(dir, log)
}

// afterLock, when a test sets it, is called by Run right after the
// state dir's lock is taken (and its pid written), before the rest of the
// start-up: a test blocks there to start a second host in between.
var afterLock func()

// stateLock is a held state-dir lock.
type stateLock struct{ f *os.File }

// lockStateDir takes the exclusive lock of dir for this process, or
// fails at once with ErrStateDirInUse naming the holder's pid. The lock
// is an flock on an open file description: it goes with the process (a
// host killed with -9 holds nothing), is atomic (two hosts started at the
// same instant cannot both get it), and its descriptor is close-on-exec,
// so the plugins the host starts never inherit it.
func lockStateDir(dir string) (*stateLock, error) {
	path := filepath.Join(dir, LockFile)
	f, err := statedir.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		// The holder writes its pid right after it got the lock: give it
		// a moment when we came in between.
		pid := readLockPid(f)
		for deadline := time.Now().Add(time.Second); pid == 0 && time.Now().Before(deadline); pid = readLockPid(f) {
			time.Sleep(10 * time.Millisecond)
		}
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			who := "another tether host"
			if pid > 0 {
				who = "pid " + strconv.Itoa(pid)
			}
			return nil, fmt.Errorf("state dir %s is in use by %s (stop it first, or use another --state-dir): %w", dir, who, ErrStateDirInUse)
		}
		return nil, fmt.Errorf("state dir lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &stateLock{f: f}, nil
}

// readLockPid reads the pid the lock's holder wrote, or 0.
func readLockPid(f *os.File) int {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil {
		return 0
	}
	return pid
}

// LockHolder returns the pid of the host holding dir's lock, 0 when no
// host holds it (a lock file left by a host that is gone holds nothing),
// or -1 when it is held by a host whose pid is not written yet.
func LockHolder(dir string) (int, error) {
	f, err := statedir.OpenFile(filepath.Join(dir, LockFile), os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err == nil {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return 0, nil
	} else if !errors.Is(err, syscall.EWOULDBLOCK) {
		return 0, err
	}
	if pid := readLockPid(f); pid > 0 {
		return pid, nil
	}
	return -1, nil // held, by a host that has not written its pid yet
}

// unlock lets go of the lock (the file stays: it names no holder once
// unlocked).
func (l *stateLock) unlock() {
	_ = l.f.Truncate(0)
	_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	_ = l.f.Close()
}

// SocketDir is where the host of stateDir keeps its Unix sockets (the
// control socket and the plugins' go-plugin sockets): <state-dir>/plugins
// when its paths fit the kernel's limit for a socket path, else a private
// directory under the system temp dir named for the state dir, so that
// every tether command finds the same one.
func SocketDir(stateDir string) string {
	dir := filepath.Join(stateDir, "plugins")
	if len(filepath.Join(dir, "plugin0123456789")) <= supervise.MaxSocketPath {
		return dir
	}
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		abs = stateDir
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(os.TempDir(), fmt.Sprintf("tether-%d-%s", os.Getuid(), hex.EncodeToString(sum[:8])))
}

// makeSocketDir creates dir with mode 0700, or checks that an existing
// one is a directory of ours that nobody else can enter, holding nothing
// of anyone else's, with the state dir's own rules (PrepareStateDir).
func makeSocketDir(dir string, log zerolog.Logger) error {
	return statedir.PrepareSocketDir(dir, log)
}
