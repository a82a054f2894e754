package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/supervise"
	"github.com/tether-agent/tether/internal/statedir"
)

// PluginSpec says how to run a plugin process: its name, executable,
// arguments and optional expected sha256.
type PluginSpec = supervise.PluginSpec

// TransportSettings are the settings every transport plugin is started
// with (Config.TransportSettings): bound on connections, TLS files,
// liveness checks, and the extra Origins and Hosts accepted.
type TransportSettings = supervise.TransportSettings

// TransportSpec is one transport plugin the host runs, under its name,
// and the address it serves.
type TransportSpec = supervise.TransportSpec

// PrimaryTransport is the name of the transport that serves --listen.
const PrimaryTransport = supervise.PrimaryTransport

// EnvPluginStateDir names the environment variable through which the host
// tells the plugins it starts its state directory.
const EnvPluginStateDir = supervise.EnvPluginStateDir

// Plugin start errors; test for them with errors.Is.
var (
	// ErrPrimaryFailed: the primary transport failed its restart limit in
	// a row; Run shut the host down (tether serve exits with status 3).
	ErrPrimaryFailed = errors.New("primary transport failed")
	// ErrChecksum: the plugin binary's checksum did not match.
	ErrChecksum = supervise.ErrChecksum
	// ErrHandshake: the binary did not answer a tether plugin's handshake.
	ErrHandshake = supervise.ErrHandshake
)

// CheckTransportName reports whether name may name an added transport.
func CheckTransportName(name string) error { return supervise.CheckTransportName(name) }

// StopRecordedPlugin stops the plugin named name that a host left running
// on stateDir, when no host runs there to do it (see supervise).
func StopRecordedPlugin(ctx context.Context, stateDir, name string, log zerolog.Logger) (pid int, stopped bool, err error) {
	// It acts on a record and removes files: not in a state dir that
	// breaks the rules.
	if err := statedir.Verify(stateDir); err != nil {
		return 0, false, err
	}
	return supervise.StopRecordedPlugin(ctx, stateDir, SocketDir(stateDir), name, log)
}

// RemoveOwnRecord is for the PTY plugin exiting by itself with no host:
// it removes its reattach record of plugin name in stateDir, and its
// socket, when the record still names this process (pid and instance
// secret); see supervise.RemoveOwnRecord.
func RemoveOwnRecord(stateDir, name, secret string) (removed bool, err error) {
	return supervise.RemoveOwnRecord(stateDir, SocketDir(stateDir), name, os.Getpid(), secret)
}

// Config configures a host.
type Config struct {
	// Listen is the public listener's address.
	Listen string
	// Token is the access token clients must present.
	Token string
	// StateDir holds state.db (created with mode 0700).
	StateDir string
	// TokenFile is where the access token is kept (default
	// <state-dir>/token).
	TokenFile string
	// TokenCreated says the token file was made by this start (so the
	// state dir is new: a missing state.db is no loss to warn of).
	TokenCreated bool
	// TransportSettings are passed whole to every transport plugin:
	// MaxConnections, TLSCert and TLSKey (the public listener serves
	// HTTPS/WSS), PingInterval and PeerTimeout, AllowOrigins and
	// AllowHosts (AllowHosts also guards the admin listener).
	TransportSettings
	// OrphanGrace is how long a session with no viewer stays parked before
	// it is reaped; 0 keeps it forever.
	OrphanGrace time.Duration
	// SessionTTL: a parked, idle live session older than this is
	// persisted and released (0 = never).
	SessionTTL time.Duration
	// MaxLiveSessions caps the live sessions; only parked idle ones are
	// evicted, oldest first (0 = no cap).
	MaxLiveSessions int
	// JournalPerSession and JournalTotal bound the event journal kept in
	// state.db: events per session, and events in all (0 = defaults).
	JournalPerSession, JournalTotal int
	// JournalBytes bounds the bytes of each session's journal
	// (--journal-bytes-per-session; 0 = the default, 64 MiB).
	JournalBytes int64
	// Pprof also serves /debug/pprof on the admin listener.
	Pprof bool
	// Agents builds each live session's agent (echo, exec, or your own);
	// ignored when ACPAgent is set.
	Agents agent.Factory
	// ACPAgent, when set, is the command line of an ACP agent (--agent
	// acp): the host starts it once on stdio, supervises it, and every
	// session is a session of it.
	ACPAgent []string
	// AgentCwd is the working directory of the ACP agent and of sessions
	// made without one (default: the host's).
	AgentCwd string
	// Transport is the primary transport plugin, built-in or external,
	// serving Listen under the name PrimaryTransport.
	Transport PluginSpec
	// Transports are more transport plugins to run beside it from the
	// start, each under its own name (more can be loaded at runtime
	// through the control socket).
	Transports []TransportSpec
	// RestartLimit is how many times in a row a transport plugin may fail
	// (crash within a minute of starting, or fail to start again) before
	// it is marked failed and no longer restarted (0 = restart forever).
	RestartLimit int
	// PluginStartTimeout bounds a plugin's go-plugin handshake (0: 15s).
	PluginStartTimeout time.Duration
	// HealthInterval and HealthTimeout: every plugin is pinged this often,
	// and one that does not answer in time is killed and restarted with
	// reason unresponsive (0 interval: no pings).
	HealthInterval, HealthTimeout time.Duration
	// PTY is the PTY backend plugin to run and its configuration; a zero
	// Spec.Path switches /api/pty off (4404).
	PTY PTYConfig
	// StopPTYs stops the PTY plugin (and its PTYs) at shutdown instead
	// of leaving it running for the next host, see the README).
	StopPTYs bool
	// Reload, when it delivers, swaps every transport plugin for a fresh
	// process, like `tether plugins reload NAME` (tether serve sends
	// SIGHUP's here).
	Reload <-chan struct{}
	// PublicURL is the host's URL as its users reach it (behind a
	// reverse proxy, say): the base of the URLs tether token create and
	// tether share print. Empty: the listener's own.
	PublicURL string
	// NotifyWebhooks are the URLs of --notify-webhook: each is sent
	// every notification (docs/NOTIFICATIONS.md).
	NotifyWebhooks []string
	// NotifySecret signs the webhooks' bodies (--notify-secret-file);
	// nil: unsigned.
	NotifySecret []byte
	// NotifyPush turns on Web Push for the page (--notify-push): VAPID
	// keys in the state dir, push.* on /api/ws, pushes of what happens
	// while nobody is connected (docs/NOTIFICATIONS.md, "Web Push").
	NotifyPush bool
	// NotifyPushSubject is the VAPID subject (--notify-push-subject): a
	// mailto: address or an https:// URL; empty: PublicURL when it is
	// https://, else mailto:tether@localhost.
	NotifyPushSubject string
	// NotifyPushInsecure lets push endpoints be http:// on loopback
	// (--notify-push-insecure-endpoints): for tests only.
	NotifyPushInsecure bool
	// Notifiers are notifier plugins (--plugin notify:NAME=PATH), each
	// sent every notification like a webhook.
	Notifiers []PluginSpec
	// AdminListen, if set, serves /metrics, /healthz and (with Pprof)
	// /debug/pprof, behind the access token and the Host check.
	AdminListen string
	// Cluster, when set, joins the host to a cluster sharing one session
	// table on NATS JetStream (cluster.go); nil: a single host on SQLite.
	Cluster *ClusterConfig
	// Version is reported in gateway.ready.
	Version string
	// Stdout receives the "tether listening on" line.
	Stdout io.Writer
	Log    zerolog.Logger
}

// PTYConfig configures the PTY backend.
type PTYConfig struct {
	Spec PluginSpec
	contract.BackendConfig
}

// defaultMaxConnections is a transport's bound on open connections when
// MaxConnections is 0.
const defaultMaxConnections = 20000

// shutdownBudget is how long a shutdown may take in all (the host exits
// within 5 s).
const shutdownBudget = 4 * time.Second

// Run starts the host and serves until ctx is done, then shuts down:
// clients are closed with 1001, sessions are persisted with reason
// shutdown, and plugins are stopped (the PTY plugin is left running for
// the next host unless StopPTYs).
//
// The host's parts, in start order, are listed in parts.go; they are
// stopped in reverse under one deadline (shutdownBudget), and a part
// that overruns it is named in the log.
func Run(ctx context.Context, cfg Config) error {
	h := &hostParts{cfg: cfg, m: metrics.New(), primaryFailed: make(chan string, 1)}
	h.m.BuildInfo.WithLabelValues(cfg.Version, runtime.Version()).Set(1)
	l := lifecycle{parts: h.parts(), budget: shutdownBudget, log: cfg.Log}
	return l.run(ctx, func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			cfg.Log.Info().Msg("shutting down")
			return nil
		case last := <-h.primaryFailed:
			err := fmt.Errorf("transport %s failed %d times in a row (last: %s): %w", PrimaryTransport, cfg.RestartLimit, last, ErrPrimaryFailed)
			cfg.Log.Error().Err(err).Msg("shutting down: the primary transport keeps failing and nothing serves --listen")
			return err
		}
	})
}

// reloadOnSignal swaps every transport for a fresh process each time
// cfg.Reload delivers (SIGHUP), until the returned stop is called (it
// waits for a reload in flight; calling it again is a no-op).
func reloadOnSignal(ctx context.Context, cfg Config, ts *supervise.Transports) (stop func()) {
	if cfg.Reload == nil {
		return func() {}
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-rctx.Done():
				return
			case <-cfg.Reload:
			}
			for _, sup := range ts.List() {
				cfg.Log.Info().Str("plugin", sup.Name()).Msg("reload requested (SIGHUP)")
				if _, err := sup.Reload(rctx, nil); err != nil {
					cfg.Log.Error().Err(err).Str("plugin", sup.Name()).Msg("reload failed; the running plugin keeps serving")
				}
			}
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}

// warnIfHistoryMissing warns when state.db is missing or empty on a state
// dir that was used before (it has a token file): the host starts with no
// history, and the operator should know that it was not found.
func warnIfHistoryMissing(cfg Config, dbPath string) {
	if _, err := os.Stat(tokenFileOf(cfg)); err != nil || cfg.TokenCreated {
		return // a new state dir
	}
	fi, err := os.Stat(dbPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
		cfg.Log.Warn().Str("file", dbPath).Msg("state.db not found on a state dir used before: starting with no history (restore it from a backup to get the sessions back)")
	case err == nil && fi.Size() == 0:
		cfg.Log.Warn().Str("file", dbPath).Msg("state.db is empty on a state dir used before: starting with no history (restore it from a backup to get the sessions back)")
	}
}

// tokenFileOf is the token file of cfg: TokenFile, else <state-dir>/token.
func tokenFileOf(cfg Config) string {
	if cfg.TokenFile != "" {
		return cfg.TokenFile
	}
	return filepath.Join(cfg.StateDir, "token")
}

// agentCwd is the working directory of sessions made without one.
func agentCwd(dir string) string {
	if dir != "" {
		return dir
	}
	wd, err := os.Getwd()
	if err != nil {
		return "/"
	}
	return wd
}
