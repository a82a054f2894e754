package main

import (
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host"
	"github.com/tether-agent/tether/internal/statedir"
	"github.com/tether-agent/tether/internal/umask"
	"github.com/tether-agent/tether/plugins/pty"
)

// ptyLogMax is the size past which the PTY plugin's log file is rotated
// (to pty.log.1) when it is opened.
const ptyLogMax = 8 << 20

// ptyPluginMain runs the built-in PTY backend so that it can outlive its
// host (docs/PROTOCOL.md §13.6). The host starts it in a session of its
// own (setsid), so no terminal hangup or process-group signal of the host
// reaches it; here it
//   - catches SIGHUP and SIGPIPE and discards them (caught, not ignored:
//     an ignored signal would stay ignored in the shells it spawns, while
//     a caught one is reset to the default by exec);
//   - never writes to a dead host's stdio: its log goes to stderr (the
//     host re-emits it) until the host is gone, then to
//     <state-dir>/plugins/pty.log;
//   - lets go of the host's stdin;
//   - on SIGTERM kills its PTYs' process groups and exits.
func ptyPluginMain() int {
	detachStdin()
	// The plugin's own files (its socket, its log) are private, whatever
	// started it; its PTYs' shells get the umask of the user who started
	// the host, which the host passes on (contract.EnvPluginUmask).
	umask.Restrict()
	if v, ok := os.LookupEnv(contract.EnvPluginUmask); ok {
		if m, err := umask.Parse(v); err == nil {
			umask.SetChild(m)
		}
		_ = os.Unsetenv(contract.EnvPluginUmask)
	}
	out := newHostLogWriter(os.Stderr, logFile(os.Getenv(host.EnvPluginStateDir), "pty"))
	log := zerolog.New(out).Level(pluginLogLevel()).With().Timestamp().Logger()
	b := pty.New(log)
	// The instance secret the host proves this process by when it
	// reattaches: taken, then gone from the environment (no PTY's shell
	// inherits it).
	secret := os.Getenv(contract.EnvPluginSecret)
	b.SetSecret(secret)
	_ = os.Unsetenv(contract.EnvPluginSecret)
	// exit ends the process on its own account (idle, or SIGTERM): its
	// PTYs go, and so do its reattach record and socket while the record
	// still names this process, so nothing stale is left for the next
	// host or `tether doctor`.
	exit := func() {
		b.Shutdown()
		if dir := os.Getenv(host.EnvPluginStateDir); dir != "" {
			if removed, err := host.RemoveOwnRecord(dir, "pty", secret); err != nil {
				log.Warn().Err(err).Msg("could not remove this plugin's reattach record")
			} else if removed {
				log.Info().Msg("reattach record and socket removed")
			}
		}
		os.Exit(0)
	}
	go exitWhenIdle(b, log, exit)

	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGPIPE, syscall.SIGTERM)
	go func() {
		for sig := range sigs {
			if sig != syscall.SIGTERM {
				log.Debug().Stringer("signal", sig).Msg("signal discarded")
				continue
			}
			log.Info().Msg("SIGTERM: stopping every PTY")
			exit()
		}
	}()
	contract.ServeBackend(b)
	// The host asked the plugin to stop (go-plugin's Kill): end every PTY.
	b.Shutdown()
	return 0
}

// idleCheckEvery is how often the plugin looks whether it is idle.
const idleCheckEvery = 2 * time.Second

// exitWhenIdle ends the plugin process once it has had no host and no PTY
// for the backend's idle time in a row: a PTY plugin left behind by a host
// that is gone, with nothing to keep alive, does not linger.
func exitWhenIdle(b *pty.Backend, log zerolog.Logger, exit func()) {
	var since time.Time
	for range time.Tick(idleCheckEvery) {
		idle, after := b.Idle()
		switch {
		case !idle:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= after:
			log.Info().Str("idle", time.Since(since).Round(time.Second).String()).Msg("no host and no PTY: exiting")
			exit()
		}
	}
}

// logFile is where plugin name logs once its host is gone: a file in
// <stateDir>/plugins, or "" (no state dir: discard).
func logFile(stateDir, name string) string {
	if stateDir == "" {
		return ""
	}
	return filepath.Join(stateDir, "plugins", name+".log")
}

// detachStdin points fd 0 at /dev/null: the plugin must not keep the
// host's terminal (go-plugin hands the plugin the host's stdin).
func detachStdin() {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return
	}
	defer devnull.Close()
	_ = syscall.Dup2(int(devnull.Fd()), 0)
}

// hostLogWriter writes a plugin's log lines to its stderr, which the host
// reads and re-emits, while the host that started it is alive; once the
// host is gone (the plugin was reparented, or a write failed with EPIPE:
// SIGPIPE is caught, so the write just fails) every line goes to the log
// file instead, opened then, with mode 0600. A line that failed on
// stderr is written to the file, so nothing is lost.
type hostLogWriter struct {
	stderr *os.File
	ppid   int
	path   string // "" discards once the host is gone

	mu       sync.Mutex // guards the fields below
	hostGone bool
	file     *os.File
}

func newHostLogWriter(stderr *os.File, path string) *hostLogWriter {
	return &hostLogWriter{stderr: stderr, ppid: os.Getppid(), path: path}
}

// Write implements io.Writer; zerolog writes one line per call.
func (w *hostLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.hostGone && os.Getppid() != w.ppid {
		w.hostGone = true
	}
	if !w.hostGone {
		if _, err := w.stderr.Write(p); err == nil {
			return len(p), nil
		}
		w.hostGone = true
	}
	if w.file == nil && w.path != "" {
		// A file of the state dir: never opened through a link, nor one
		// of another user's (statedir.OpenFile).
		if fi, err := os.Lstat(w.path); err == nil && fi.Mode().IsRegular() && fi.Size() > ptyLogMax {
			_ = os.Rename(w.path, w.path+".1")
		}
		f, err := statedir.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			w.path = "" // nowhere to log; never retry
			return len(p), nil
		}
		w.file = f
	}
	if w.file != nil {
		_, _ = w.file.Write(p)
	}
	return len(p), nil
}
