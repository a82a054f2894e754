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
	"syscall"
	"time"

	"github.com/tether-agent/tether/internal/statedir"
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
	// Secret is the random instance secret the host gave the process at
	// its start (contract.EnvPluginSecret): a reattaching host asks the
	// process to prove it (contract.Prove of a fresh challenge), so the
	// record names the plugin by what it knows, not by the path of the
	// binary it runs — a host rebuilt or upgraded since still reattaches.
	// The record file is 0600 in a 0700 directory.
	Secret string `json:"secret,omitempty"`
	// Argv is the plugin's command line as the host started it, which
	// /proc/PID/cmdline shows for the process's whole life (also when its
	// binary is rebuilt on disk): a process with the recorded pid and
	// start time but another command line is not trusted or touched.
	Argv []string `json:"argv,omitempty"`
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
	// Args is /proc/PID/cmdline.
	Args []string
}

// judgeRecord decides whether rec names a live process: the one the host
// that wrote it started, with the pid and start time it recorded (a pid
// reused by another process has another start time) and the command line
// it was started with. It does no I/O.
// The reason explains a refusal (and is logged); a refused record is
// stale: it is removed and never trusted. A live process still has to
// prove the record's secret before it is reattached (see connect).
func judgeRecord(rec ReattachRecord, p procInfo) (live bool, reason string) {
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
	case len(rec.Argv) > 0 && !slices.Equal(p.Args, rec.Argv):
		return false, fmt.Sprintf("pid %d runs %q, not the plugin (%q)", rec.Pid, strings.Join(p.Args, " "), strings.Join(rec.Argv, " "))
	case len(rec.Argv) == 0 && (len(p.Args) < 2 || p.Args[1] != "plugin"):
		// A record of an older tether, with no command line: only a
		// `tether plugin NAME` process is taken for the plugin.
		return false, fmt.Sprintf("pid %d runs %q, not the plugin", rec.Pid, strings.Join(p.Args, " "))
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

// readRecord reads the reattach record at path, never through a
// symbolic link and only when it is a file of ours that others cannot
// write (statedir.ReadFile); a missing file is (zero, false, nil).
func readRecord(path string) (ReattachRecord, bool, error) {
	b, err := statedir.ReadFile(path)
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
	if d, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0); err == nil {
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

// RemoveOwnRecord is for a plugin that outlived its host and now exits
// by itself: it removes the reattach record of plugin name in stateDir,
// and the socket the record names (see removeRecord), when the record
// still names this process — pid and instance secret — so that no
// record of a process that is gone is left behind. A record naming
// another process (a newer plugin a newer host started) is left alone.
// removed says whether the record was this process's and is gone.
func RemoveOwnRecord(stateDir, sockDir, name string, pid int, secret string) (removed bool, err error) {
	path := recordPath(stateDir, name)
	rec, found, err := readRecord(path)
	if !found || err != nil || rec.Pid != pid || rec.Secret != secret {
		return false, err
	}
	if err := removeRecord(path, rec, sockDir); err != nil {
		return false, err
	}
	return true, nil
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
	st.Live, st.Reason = judgeRecord(rec, readProc(rec.Pid))
	return st, nil
}
