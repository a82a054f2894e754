package supervise

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// EnvPluginStateDir names the environment variable through which the host
// tells the plugins it starts its state directory (a plugin that outlives
// its host logs to <dir>/plugins/<name>.log once the host is gone).
const EnvPluginStateDir = "TETHER_PLUGIN_STATE_DIR"

// reattachBudget bounds everything a starting host does to reattach to a
// plugin left running by the previous host: reading the record, checking
// the process, dialing it and calling Start.
const reattachBudget = 3 * time.Second

// ReattachRecord is what the host keeps at <state-dir>/plugins/<name>.json
// about a plugin that outlives it: enough for the next host to
// find it, check that it is still the same process and reattach.
type ReattachRecord struct {
	// Protocol is the go-plugin protocol, "grpc".
	Protocol string `json:"protocol"`
	// Network and Address are the plugin's gRPC listener ("unix" and a
	// socket path, normally in <state-dir>/plugins).
	Network string `json:"network"`
	Address string `json:"address"`
	// Pid is the plugin process.
	Pid int `json:"pid"`
	// Started is the process's start time as the kernel reports it in
	// /proc/PID/stat field 22: clock ticks since boot. With Pid it names
	// one process for the life of the machine's boot: a pid reused by
	// another process has another start time.
	Started uint64 `json:"started"`
}

// procInfo is what /proc says about a pid; gathered by readProc, judged
// by judgeRecord.
type procInfo struct {
	// Exists: /proc/PID/stat could be read.
	Exists bool
	// Zombie: the process has exited and waits to be reaped.
	Zombie bool
	// Started is /proc/PID/stat field 22 (clock ticks since boot).
	Started uint64
	// Exe is the target of /proc/PID/exe without a " (deleted)" suffix
	// (a binary replaced on disk since it started); "" when unreadable.
	Exe string
	// Args is /proc/PID/cmdline.
	Args []string
}

// pluginIdentity is what a recorded plugin process must look like.
type pluginIdentity struct {
	// Exes are the executables it may run: the configured plugin binary
	// and the host's own (the built-in plugins, and scripts that exec
	// `tether plugin NAME`), symlinks resolved.
	Exes []string
	// Self is the host's own executable: a process running it must be a
	// plugin (argv[1] == "plugin"), not some other tether command.
	Self string
}

// judgeRecord decides whether rec names a live plugin process to reattach
// to, from what /proc says about rec.Pid. It does no I/O. The reason
// explains a refusal (and is logged); a refused record is stale: it is
// removed and never trusted.
func judgeRecord(rec ReattachRecord, p procInfo, id pluginIdentity) (ok bool, reason string) {
	switch {
	case rec.Protocol != "grpc":
		return false, fmt.Sprintf("protocol %q is not grpc", rec.Protocol)
	case rec.Network != "unix" && rec.Network != "tcp":
		return false, fmt.Sprintf("network %q is not unix or tcp", rec.Network)
	case rec.Network == "unix" && !filepath.IsAbs(rec.Address):
		return false, fmt.Sprintf("socket %q is not an absolute path", rec.Address)
	case rec.Network == "tcp" && !loopbackAddr(rec.Address):
		return false, fmt.Sprintf("address %q is not a loopback host:port", rec.Address)
	case rec.Pid <= 1:
		return false, fmt.Sprintf("pid %d is not a plugin", rec.Pid)
	case rec.Started == 0:
		return false, "no start time"
	case !p.Exists:
		return false, fmt.Sprintf("process %d is gone", rec.Pid)
	case p.Zombie:
		return false, fmt.Sprintf("process %d has exited", rec.Pid)
	case p.Started != rec.Started:
		return false, fmt.Sprintf("pid %d was reused: the process started at tick %d, the record says %d", rec.Pid, p.Started, rec.Started)
	case p.Exe == "":
		return false, fmt.Sprintf("cannot tell which program pid %d runs", rec.Pid)
	case !slices.Contains(id.Exes, p.Exe):
		return false, fmt.Sprintf("pid %d runs %s, not the plugin", rec.Pid, p.Exe)
	case p.Exe == id.Self && (len(p.Args) < 2 || p.Args[1] != "plugin"):
		return false, fmt.Sprintf("pid %d runs %q, not a plugin", rec.Pid, strings.Join(p.Args, " "))
	}
	return true, ""
}

// loopbackAddr reports whether addr is host:port with a loopback IP.
func loopbackAddr(addr string) bool {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// recordPath is where the reattach record of plugin name lives.
func recordPath(stateDir, name string) string {
	return filepath.Join(stateDir, "plugins", name+".json")
}

// readRecord reads the reattach record at path; a missing file is
// (zero, false, nil).
func readRecord(path string) (ReattachRecord, bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return ReattachRecord{}, false, nil
	}
	if err != nil {
		return ReattachRecord{}, false, err
	}
	var rec ReattachRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return ReattachRecord{}, true, fmt.Errorf("reattach record %s: %w", path, err)
	}
	return rec, true, nil
}

// writeRecord writes rec to path atomically: a temporary file of mode
// 0600 in the same directory, synced, then renamed over path.
func writeRecord(path string, rec ReattachRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("reattach record: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op once renamed
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("reattach record: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("reattach record: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("reattach record: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("reattach record: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("reattach record: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// removeRecord removes the record at path and, when it names a Unix
// socket inside the record's own directory, that socket. Nothing outside
// <state-dir>/plugins is ever removed on a record's word.
func removeRecord(path string, rec ReattachRecord, sockDir string) error {
	var errs []error
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	dir := filepath.Dir(filepath.Clean(rec.Address))
	if rec.Network == "unix" && rec.Address != "" && (dir == filepath.Dir(path) || sockDir != "" && dir == filepath.Clean(sockDir)) {
		if err := os.Remove(rec.Address); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// identityFor returns what a plugin process started from path (or by the
// host binary) looks like in /proc.
func identityFor(path string) pluginIdentity {
	var id pluginIdentity
	if self, err := os.Executable(); err == nil {
		id.Self = resolvePath(self)
		id.Exes = append(id.Exes, id.Self)
	}
	if path != "" {
		id.Exes = append(id.Exes, resolvePath(path))
	}
	return id
}

// resolvePath resolves symlinks in p where it can.
func resolvePath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}

// RecordState is what a reattach record says about its plugin, for
// `tether doctor`.
type RecordState struct {
	// Found: the record exists.
	Found bool
	// Pid is the process it names.
	Pid int
	// Live: the process is alive and is the one the record names.
	Live bool
	// Reason says why a found record is stale (Live false).
	Reason string
}

// InspectRecord reads the reattach record of plugin name in stateDir and
// judges it the way a starting host does, changing nothing.
func InspectRecord(stateDir, name string) (RecordState, error) {
	rec, found, err := readRecord(recordPath(stateDir, name))
	if !found {
		return RecordState{}, err
	}
	st := RecordState{Found: true, Pid: rec.Pid}
	if err != nil {
		st.Reason = err.Error()
		return st, nil
	}
	st.Live, st.Reason = judgeRecord(rec, readProc(rec.Pid), identityFor(""))
	return st, nil
}
