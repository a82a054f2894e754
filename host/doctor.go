package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tether-agent/tether/host/internal/supervise"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/internal/statedir"
)

// Finding is one check of `tether doctor`.
type Finding struct {
	Check  string `json:"check"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// Fix says what to do when the check failed.
	Fix string `json:"fix,omitempty"`
}

// DoctorConfig says what Diagnose looks at.
type DoctorConfig struct {
	StateDir  string
	TokenFile string // "" means <state-dir>/token
	Listen    string // the address tether serve would listen on
	// MinFree is the free disk space below which the state dir's file
	// system is a problem (0: 64 MiB).
	MinFree uint64
}

// Diagnose checks what a host needs of its machine and its state dir —
// the state dir's permissions, the lock and the running host, the
// database's integrity, the plugin reattach records, free disk, the
// port and the token file — and says of each what is wrong and how to
// fix it. It changes nothing.
func Diagnose(ctx context.Context, cfg DoctorConfig) []Finding {
	if cfg.TokenFile == "" {
		cfg.TokenFile = filepath.Join(cfg.StateDir, "token")
	}
	if cfg.MinFree == 0 {
		cfg.MinFree = 64 << 20
	}
	var out []Finding
	add := func(check string, ok bool, detail, fix string) {
		out = append(out, Finding{Check: check, OK: ok, Detail: detail, Fix: fix})
	}

	// The state dir: the very check tether serve makes (PrepareStateDir),
	// reported instead of refused. The token file's own problems are
	// said under "token file", below.
	problems, err := statedir.Check(cfg.StateDir)
	if _, lerr := os.Lstat(cfg.StateDir); errors.Is(lerr, os.ErrNotExist) {
		add("state dir", true, cfg.StateDir+" does not exist yet (tether serve makes it, mode 0700)", "")
		return append(out, diagnosePort(cfg)...)
	}
	if err != nil {
		add("state dir", false, err.Error(), "check the path and its parents' permissions")
		return out
	}
	bad := 0
	for _, p := range problems {
		if p.Path == filepath.Clean(cfg.TokenFile) {
			continue
		}
		bad++
		add("state dir", false, p.Detail(), p.Fix())
		if p.Top && p.Kind != statedir.Readable && p.Kind != statedir.Writable {
			return out // not a directory of ours: nothing in it to look at
		}
	}
	if bad == 0 {
		add("state dir", true, cfg.StateDir+" (mode 0700; everything in it is yours and closed to others)", "")
	}

	// The lock and the host.
	pid, err := LockHolder(cfg.StateDir)
	running := false
	switch {
	case err != nil:
		add("lock", false, err.Error(), "check "+filepath.Join(cfg.StateDir, LockFile))
	case pid != 0:
		running = true
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, cerr := Control(cctx, cfg.StateDir, ControlRequest{Op: OpList})
		cancel()
		if cerr != nil {
			add("host", false, fmt.Sprintf("a host (pid %d) holds the lock but its control socket does not answer: %v", pid, cerr), fmt.Sprintf("it may be hung: kill %d, then start tether serve again", pid))
		} else {
			add("host", true, fmt.Sprintf("a host is running (pid %d) and answers on its control socket", pid), "")
		}
	default:
		add("host", true, "no host is running on this state dir", "")
	}

	// The database.
	db := filepath.Join(cfg.StateDir, "state.db")
	if dfi, err := os.Stat(db); errors.Is(err, os.ErrNotExist) {
		add("database", true, "no state.db yet (a new state dir)", "")
	} else if err == nil && dfi.Size() == 0 {
		add("database", false, db+" is empty: the host would start with no history", "restore it from a backup, or remove it to start afresh")
	} else if err := store.Check(ctx, db); err != nil {
		add("database", false, err.Error(), "restore "+db+" from a backup, or move it aside (the host then starts with no history)")
	} else {
		add("database", true, db+" passes quick_check", "")
	}

	// Plugin records.
	rs, err := supervise.InspectRecord(cfg.StateDir, "pty")
	switch {
	case err != nil:
		add("pty plugin", false, err.Error(), "remove "+filepath.Join(cfg.StateDir, "plugins", "pty.json"))
	case !rs.Found:
		add("pty plugin", true, "no reattach record (no PTY plugin left running)", "")
	case rs.Live && running:
		add("pty plugin", true, fmt.Sprintf("pid %d is running for the host", rs.Pid), "")
	case rs.Live:
		add("pty plugin", true, fmt.Sprintf("pid %d is running with no host: the next tether serve reattaches to it (it exits by itself within a minute when it has no PTY)", rs.Pid), "")
	default:
		add("pty plugin", false, fmt.Sprintf("stale reattach record: %s", rs.Reason), "nothing to do: the next tether serve removes it; or remove "+filepath.Join(cfg.StateDir, "plugins", "pty.json"))
	}

	// Free disk.
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(cfg.StateDir, &sfs); err == nil {
		free := sfs.Bavail * uint64(sfs.Bsize)
		if free < cfg.MinFree {
			add("disk", false, fmt.Sprintf("%s free on the state dir's file system (less than %s): writes will fail and the host will answer 5003", bytesText(free), bytesText(cfg.MinFree)), "free space on that file system, or move --state-dir")
		} else {
			add("disk", true, bytesText(free)+" free", "")
		}
	}

	// The token file.
	add(diagnoseTokenFile(cfg))

	if !running {
		out = append(out, diagnosePort(cfg)...)
	}
	return out
}

// diagnoseTokenFile checks the token file by the rules tether serve
// reads it by: in the state dir never through a link, and only a file of
// ours closed to others; elsewhere it may be a link (the operator's
// choice). It reads nothing through a link in the state dir and never
// waits on a FIFO.
func diagnoseTokenFile(cfg DoctorConfig) (check string, ok bool, detail, fix string) {
	const name = "token file"
	path := cfg.TokenFile
	var f *os.File
	var err error
	if statedir.Within(cfg.StateDir, path) {
		f, err = statedir.OpenFile(path, os.O_RDONLY, 0)
	} else {
		f, err = os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	}
	var p *statedir.Problem
	switch {
	case errors.Is(err, os.ErrNotExist):
		if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
			target, _ := os.Readlink(path)
			return name, false, path + " is a symbolic link to " + target + ", which does not exist", "make the file it points at, or point --token-file elsewhere"
		}
		return name, true, path + " does not exist yet (tether serve makes it, mode 0600)", ""
	case errors.As(err, &p):
		return name, false, p.Detail(), p.Fix()
	case err != nil:
		return name, false, err.Error(), "check " + path
	}
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		return name, false, err.Error(), "check " + path
	case !fi.Mode().IsRegular():
		return name, false, path + " is not a regular file", "point --token-file at one"
	case fi.Mode().Perm()&0o077 != 0:
		return name, false, fmt.Sprintf("%s has mode %04o: other users can read the access token", path, fi.Mode().Perm()), "chmod 600 " + path
	}
	if b, err := io.ReadAll(io.LimitReader(f, 64<<10)); err != nil || strings.TrimSpace(string(b)) == "" {
		return name, false, path + " is empty or unreadable", "remove it to have tether serve make a new one (clients then need the new token)"
	}
	return name, true, path + " (mode 0600)", ""
}

// diagnosePort checks that the listen address can be bound.
func diagnosePort(cfg DoctorConfig) []Finding {
	if cfg.Listen == "" || !supervise.HostListens(cfg.Listen) {
		return nil
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return []Finding{{Check: "port", Detail: fmt.Sprintf("cannot listen on %s: %v", cfg.Listen, err), Fix: "stop what uses the port (ss -ltnp | grep " + portOf(cfg.Listen) + "), or pick another with --listen"}}
	}
	ln.Close()
	return []Finding{{Check: "port", OK: true, Detail: cfg.Listen + " is free"}}
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return ":" + p
}

func bytesText(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}
