package host

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/acpagent"
	"github.com/tether-agent/tether/host/internal/acpgw"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/ptyroute"
	"github.com/tether-agent/tether/host/internal/rpc"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/host/internal/supervise"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/internal/statedir"
	"github.com/tether-agent/tether/wire"
)

// PluginSpec says how to run a plugin process: its name, executable,
// arguments and optional expected sha256.
type PluginSpec = supervise.PluginSpec

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
	// TLSCert and TLSKey are PEM files: with them the public listener
	// serves HTTPS/WSS.
	TLSCert, TLSKey string
	// MaxConnections bounds each transport's open connections (0: its
	// default, 20000); past it a new connection gets HTTP 503.
	MaxConnections int
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
	// AllowOrigins are extra accepted Origins.
	AllowOrigins []string
	// AllowHosts are extra accepted Host names ("NAME" with any port or
	// none, "NAME:PORT" exactly), e.g. behind a reverse proxy.
	AllowHosts []string
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
	// AdminListen, if set, serves /metrics, /healthz and (with Pprof)
	// /debug/pprof, behind the access token and the Host check.
	AdminListen string
	// PingInterval and PeerTimeout tune the transport's liveness checks
	// (0 = the transport's defaults, 20s and 60s).
	PingInterval, PeerTimeout time.Duration
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
// Start order: the state dir and its control socket (refusing a second
// host), the database, the table and the gateway, the public listener,
// the PTY backend, the transports, the control server, then the admin
// listener; shutdown runs in reverse.
func Run(ctx context.Context, cfg Config) error {
	// Nothing in the state dir is read or written before it is judged:
	// ours, closed to others, no link anywhere (tether serve judged it
	// already, before its token file; judging again costs a short walk).
	if err := PrepareStateDir(cfg.StateDir, cfg.Log); err != nil {
		return err
	}
	// One host per state dir: refuse to start beside a running host
	// before touching its database or its plugins.
	lock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return err
	}
	defer lock.unlock()
	if afterLock != nil {
		afterLock()
	}
	sockDir := SocketDir(cfg.StateDir)
	if err := makeSocketDir(sockDir, cfg.Log); err != nil {
		return err
	}
	if sockDir != filepath.Join(cfg.StateDir, "plugins") {
		cfg.Log.Info().Str("dir", sockDir).Msg("state dir too long for Unix socket paths; sockets are kept in a private directory")
		// Removed at exit, unless a PTY plugin left running for the next
		// host still has its socket there (Remove takes only an empty
		// directory). Deferred first, so it runs last.
		defer os.Remove(sockDir)
	}
	ctlLn, err := listenControl(sockDir)
	if err != nil {
		return err
	}
	defer ctlLn.Close() // until the control server owns it
	st, node, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	if node != nil {
		defer leaveCluster(node) // after the table's shutdown
	}
	creds, err := openCredentials(ctx, cfg, st, node)
	if err != nil {
		return err
	}

	m := metrics.New()
	m.BuildInfo.WithLabelValues(cfg.Version, runtime.Version()).Set(1)
	agents := cfg.Agents
	if len(cfg.ACPAgent) > 0 {
		// Closed after the table's shutdown (deferred first): the runs it
		// interrupts are cancelled at the agent.
		f := acpagent.New(acpagent.Config{Argv: cfg.ACPAgent, Cwd: cfg.AgentCwd, Version: cfg.Version, Log: cfg.Log, Metrics: m,
			HealthInterval: cfg.HealthInterval, HealthTimeout: cfg.HealthTimeout})
		if err := f.Start(ctx); err != nil {
			return err
		}
		defer f.Close()
		agents = f
	}
	table := session.NewTable(session.Config{
		Store:    st,
		Owners:   nodeOwners(node),
		Host:     nodeID(node),
		Instance: nodeInstance(node),

		OwnersTimeout: nodeOwnersTimeout(node),
		Agents:        agents,
		OrphanGrace:   cfg.OrphanGrace,
		Log:           cfg.Log,
		Metrics:       m,
		SessionTTL:    cfg.SessionTTL,
		MaxLive:       cfg.MaxLiveSessions,
		Retention:     store.Retention{PerSession: cfg.JournalPerSession, Total: cfg.JournalTotal, PerSessionBytes: cfg.JournalBytes},
	})
	gw := rpc.New(table, st, cfg.Version, cfg.Log, m)
	gw.SetCredentials(creds)
	upkeepCtx, stopUpkeep := context.WithCancel(ctx)
	waitUpkeep := keepCredentials(upkeepCtx, creds, cfg.Log)
	defer func() { stopUpkeep(); waitUpkeep() }()
	if node != nil {
		gw.SetRemote(clusterRemote{node}) // before any connection
	}
	defer gw.Close()
	acpGW := acpgw.New(acpgw.Config{Table: table, Store: st, Cwd: agentCwd(cfg.AgentCwd), Version: cfg.Version, Log: cfg.Log, Metrics: m})
	acpGW.SetCredentials(creds)
	defer acpGW.Close()
	endpoints := map[string]link.Endpoint{wire.PathRPC: gw, wire.PathACP: acpGW}

	// A TCP public listener is the host's own: every transport plugin
	// process inherits it, so it stays bound across plugin crashes and
	// swaps. Bound first: a taken port fails the start before any plugin
	// is touched.
	var ln *net.TCPListener
	if supervise.HostListens(cfg.Listen) {
		l, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
		}
		defer l.Close()
		ln = l.(*net.TCPListener)
	}

	// The primary transport failing for good ends the host (exit status
	// 3), so that a service manager restarts it whole.
	primaryFailed := make(chan string, 1)
	opts := supervise.Options{
		PrimaryFailed: func(lastErr string) {
			select {
			case primaryFailed <- lastErr:
			default:
			}
		},
		StateDir:     cfg.StateDir,
		SocketDir:    sockDir,
		Credentials:  creds,
		AllowOrigins: cfg.AllowOrigins,
		AllowHosts:   cfg.AllowHosts,
		Endpoints:    endpoints,
		RestartLimit: cfg.RestartLimit,
		StartTimeout: cfg.PluginStartTimeout,

		HealthInterval: cfg.HealthInterval,
		HealthTimeout:  cfg.HealthTimeout,
		MaxConnections: cfg.MaxConnections,
		TLSCert:        cfg.TLSCert,
		TLSKey:         cfg.TLSKey,
		PingInterval:   cfg.PingInterval,
		PeerTimeout:    cfg.PeerTimeout,
		Metrics:        m,
		Log:            cfg.Log,
	}
	var router *ptyroute.Router
	var backend *supervise.Backend
	serving := false // the listening line is out
	if cfg.PTY.Spec.Path != "" {
		router = ptyroute.New(cfg.Log, m, cfg.PTY.BackendConfig.MaxCols, cfg.PTY.BackendConfig.MaxRows)
		router.SetCredentials(creds)
		if node != nil {
			router.SetRemote(clusterPTYs{node})
		}
		endpoints["/api/pty"] = router
		backend = supervise.NewBackend(opts, cfg.PTY.Spec, cfg.PTY.BackendConfig, router)
		if err := backend.Start(ctx); err != nil {
			return err
		}
		m.SetPTYSource(backend.Stats)
		defer func() {
			// The sockets are closed by now; let their detaches reach
			// the plugin before letting go of it. A host that failed to
			// start does not leave behind a plugin it started itself.
			router.Wait()
			sctx, cancel := context.WithTimeout(context.Background(), shutdownBudget/2)
			defer cancel()
			backend.Stop(sctx, !cfg.StopPTYs && (serving || backend.ReattachedNow()))
		}()
	}
	ts := supervise.NewTransports(opts)
	primary := cfg.Transport
	primary.Name = PrimaryTransport
	sup, err := ts.Load(ctx, TransportSpec{PluginSpec: primary, Listen: cfg.Listen}, ln)
	if err != nil {
		return err
	}
	for _, t := range cfg.Transports {
		if _, err := ts.Load(ctx, t, nil); err != nil {
			ts.Stop(context.Background())
			return err
		}
	}
	if node != nil {
		if err := serveCluster(node, m, table, backend, endpoints, sup.Addr()); err != nil {
			ts.Stop(context.Background())
			return err
		}
	}
	ctl := newControlServer(ctlLn, controlHandler(ts, backend), cfg.Log)
	defer ctl.Close()
	stopReloads := reloadOnSignal(ctx, cfg, ts)
	defer stopReloads()
	scheme := "http"
	if cfg.TLSCert != "" {
		scheme = "https"
	}
	publicURL := scheme + "://" + access.BrowserAddr(sup.Addr())
	if cfg.PublicURL != "" {
		gw.SetPageURL(cfg.PublicURL)
	} else {
		gw.SetPageURL(publicURL)
	}
	if supervise.HostListens(cfg.Listen) {
		// Client commands given only the state dir reach this host (recorded
		// before the listening line, which a client may act on at once).
		if err := writeURL(cfg.StateDir, publicURL); err != nil {
			cfg.Log.Warn().Err(err).Msg("client commands need --url to reach this host")
		} else {
			defer removeURL(cfg.StateDir, publicURL)
		}
	}
	if cfg.AdminListen != "" {
		stopAdmin, addr, err := serveAdmin(cfg, creds, m)
		if err != nil {
			ts.Stop(context.Background())
			return err
		}
		defer stopAdmin()
		fmt.Fprintf(cfg.Stdout, "tether listening on %s/?token=%s\n", publicURL, cfg.Token)
		fmt.Fprintf(cfg.Stdout, "tether admin on http://%s\n", access.BrowserAddr(addr))
	} else {
		fmt.Fprintf(cfg.Stdout, "tether listening on %s/?token=%s\n", publicURL, cfg.Token)
	}
	serving = true
	cfg.Log.Info().Str("addr", sup.Addr()).Msg("tether serving")
	if asked, applied := cmp.Or(cfg.MaxConnections, defaultMaxConnections), sup.MaxConnections(); applied > 0 && applied < asked {
		cfg.Log.Info().Int("asked", asked).Int("applied", applied).Msgf("open connections are bounded at %d, not the %d asked, to stay under the transport's limit of open files (raise it with ulimit -n, or LimitNOFILE= under systemd)", applied, asked)
	}
	if cfg.TokenCreated {
		cfg.Log.Info().Str("file", tokenFileOf(cfg)).Msg("new access token created")
	}

	var runErr error
	select {
	case <-ctx.Done():
		cfg.Log.Info().Msg("shutting down")
	case last := <-primaryFailed:
		runErr = fmt.Errorf("transport %s failed %d times in a row (last: %s): %w", PrimaryTransport, cfg.RestartLimit, last, ErrPrimaryFailed)
		cfg.Log.Error().Err(runErr).Msg("shutting down: the primary transport keeps failing and nothing serves --listen")
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownBudget)
	defer cancel()
	// No more control requests or reloads; stop accepting; interrupt
	// runs while their viewers are still connected (they get
	// message.complete "interrupted") and persist; then close every
	// socket with 1001 and stop the transport plugins. The PTY plugin is
	// let go (or stopped) last, by the deferred calls.
	ctl.Close()
	stopReloads()
	ts.Drain()
	if node != nil {
		node.Drain(1001, "host shutting down")
	}
	if err := table.Shutdown(sctx); err != nil {
		cfg.Log.Error().Err(err).Msg("sessions did not all persist in time")
	}
	ts.Stop(sctx)
	return runErr
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
