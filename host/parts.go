package host

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/acpagent"
	"github.com/tether-agent/tether/host/internal/acpgw"
	"github.com/tether-agent/tether/host/internal/cluster"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/notify"
	"github.com/tether-agent/tether/host/internal/prompt"
	"github.com/tether-agent/tether/host/internal/ptyroute"
	"github.com/tether-agent/tether/host/internal/rpc"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/host/internal/supervise"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

// hostParts is a running host: what its parts make and share. Each field
// is set by the start of the part that makes it and read only by the
// parts after it (and by their stops, which run before its own).
type hostParts struct {
	cfg           Config
	m             *metrics.Metrics
	primaryFailed chan string // the primary transport failed for good (Options.PrimaryFailed)

	sockDir string
	lock    *stateLock
	ctlLn   *net.UnixListener
	st      store.Backend
	node    *cluster.Node // nil on a single host
	creds   *access.Book
	outbox  *notify.Outbox  // nil: no notifier
	push    *notify.WebPush // nil: no --notify-push
	// notifyPlugins are the notifier plugins' supervisors.
	notifyPlugins []*supervise.Notifier
	// notifyStore keeps the outbox when it is not the store's (a
	// cluster member's, in the state dir); nil otherwise.
	notifyStore *store.Store
	// stopUpkeep ends the credentials' upkeep (keepCredentials).
	stopUpkeep func(context.Context)
	agents     agent.Factory
	table      *session.Table
	endpoints  map[string]link.Endpoint
	gw         *rpc.Gateway
	acpGW      *acpgw.Gateway
	ln         *net.TCPListener // the public listener when the host binds it
	opts       supervise.Options
	router     *ptyroute.Router
	backend    *supervise.Backend
	ts         *supervise.Transports
	sup        *supervise.Transport // the primary transport
	ctl        *controlServer
	acp        *acpagent.Factory // --agent acp's agent
	// stopReloads ends the reloads on SIGHUP.
	stopReloads func()
	publicURL   string
	urlWritten  bool // the URL file is ours to remove
	stopAdmin   func()
	adminAddr   string
	serving     bool // the listening line is out
}

// parts are the host's parts in start order; the stop runs them in
// reverse. Some parts only stop (nil start): they hold the place of a
// step of the shutdown. The stop's order is therefore, read bottom-up:
// no more admin requests, URL file, reloads or control requests; stop
// accepting; drain the cluster's legs; interrupt the runs while their
// viewers are still connected and persist the sessions; close every
// socket with 1001 and stop the transport plugins; let go of (or stop)
// the PTY plugin; close the gateways, the ACP agent, the store (leaving
// the cluster) and the control socket; unlock the state dir.
func (h *hostParts) parts() []part {
	return []part{
		{name: "state dir", start: h.startStateDir, stop: h.stopStateDir},            // judged, locked (one host per state dir), socket dir
		{name: "control socket", start: h.listenControl, stop: h.closeControlSocket}, // bound now, served by "control server"
		{name: "store", start: h.openStore, stop: h.closeStore},                      // state.db, or the cluster joined and its store
		{name: "credentials", start: h.openCredentials, stop: h.stopCredentials},     // the access token, scoped credentials, page sign-ins; their upkeep
		{name: "notifications", start: h.startNotify, stop: h.stopNotify},            // the outbox and its notifiers (notify.go)
		{name: "acp agent", start: h.startACPAgent, stop: h.closeACPAgent},           // --agent acp only
		{name: "gateway", start: h.startGateway, stop: h.closeGateway},               // the session table, /api/ws, /acp
		{name: "public listener", start: h.listenPublic, stop: h.closePublic},        // a TCP --listen, lent to every transport process
		{name: "pty backend", start: h.startBackend, stop: h.stopBackend},            // /api/pty: the PTY plugin, reattached or started
		{name: "primary transport", start: h.loadPrimary, stop: h.stopTransports},    // serves --listen; its stop stops every transport
		{name: "added transports", start: h.loadAdded},                               // --plugin transport:NAME=PATH
		{name: "sessions", stop: h.persistSessions},                                  // stop only: interrupt the runs, persist
		{name: "cluster", start: h.serveCluster, stop: h.drainCluster},               // a cluster member: heartbeat counts, relay
		{name: "intake", stop: h.drainTransports},                                    // stop only: no new connections
		{name: "control server", start: h.serveControl, stop: h.closeControl},        // tether plugins, tether ptys
		{name: "reloads", start: h.startReloads, stop: h.endReloads},                 // SIGHUP
		{name: "url file", start: h.writeURL, stop: h.removeURL},                     // <state-dir>/url for client commands
		{name: "admin listener", start: h.serveAdmin, stop: h.closeAdmin},            // --admin-listen
		{name: "listening line", start: h.announce},                                  // "tether listening on …": the start is done
	}
}

// startStateDir judges the state dir, takes its lock (one host per state
// dir: a second one is refused before touching its database or its
// plugins) and makes the socket dir. Nothing in the state dir is read or
// written before it is judged: ours, closed to others, no link anywhere
// (tether serve judged it already, before its token file; judging again
// costs a short walk).
func (h *hostParts) startStateDir(context.Context) error {
	if err := PrepareStateDir(h.cfg.StateDir, h.cfg.Log); err != nil {
		return err
	}
	lock, err := lockStateDir(h.cfg.StateDir)
	if err != nil {
		return err
	}
	if afterLock != nil {
		afterLock()
	}
	h.sockDir = SocketDir(h.cfg.StateDir)
	if err := makeSocketDir(h.sockDir, h.cfg.Log); err != nil {
		lock.unlock()
		return err
	}
	if h.privateSockDir() {
		h.cfg.Log.Info().Str("dir", h.sockDir).Msg("state dir too long for Unix socket paths; sockets are kept in a private directory")
	}
	h.lock = lock
	return nil
}

// privateSockDir reports whether the sockets are kept out of the state
// dir, in a directory of their own.
func (h *hostParts) privateSockDir() bool {
	return h.sockDir != filepath.Join(h.cfg.StateDir, "plugins")
}

// stopStateDir removes a private socket dir, unless a PTY plugin left
// running for the next host still has its socket there (Remove takes
// only an empty directory), and unlocks the state dir.
func (h *hostParts) stopStateDir(context.Context) error {
	if h.privateSockDir() {
		_ = os.Remove(h.sockDir)
	}
	h.lock.unlock()
	return nil
}

func (h *hostParts) listenControl(context.Context) (err error) {
	h.ctlLn, err = listenControl(h.sockDir)
	return err
}

// closeControlSocket closes the control socket when no control server
// took it (a start that failed before it).
func (h *hostParts) closeControlSocket(context.Context) error {
	if h.ctl == nil {
		return h.ctlLn.Close()
	}
	return nil
}

// openStore opens state.db, or joins the cluster and opens its store.
func (h *hostParts) openStore(ctx context.Context) (err error) {
	h.st, h.node, err = openStore(ctx, h.cfg)
	if st, ok := h.st.(*store.Store); ok {
		h.m.SetWriteSource(func() metrics.WriteStats {
			w := st.WriteStats()
			return metrics.WriteStats{Commits: w.Commits, Writes: w.Writes, Abandoned: w.Abandoned, MaxGroup: w.MaxGroup}
		})
	}
	return err
}

// closeStore closes state.db, or leaves the cluster (closing its store).
func (h *hostParts) closeStore(ctx context.Context) error {
	if h.node != nil {
		leaveCluster(ctx, h.node)
		return nil
	}
	return h.st.Close()
}

func (h *hostParts) openCredentials(ctx context.Context) (err error) {
	if h.creds, err = openCredentials(ctx, h.cfg, h.st, h.node); err != nil {
		return err
	}
	h.stopUpkeep = keepCredentials(h.creds, h.cfg.Log)
	return nil
}

// stopCredentials ends the credentials' upkeep, storing their last use
// once more within ctx.
func (h *hostParts) stopCredentials(ctx context.Context) error {
	h.stopUpkeep(ctx)
	return nil
}

// startACPAgent starts --agent acp's agent: every session is a session
// of it. It is closed after the gateways, once the table's shutdown
// interrupted its runs (which are then cancelled at the agent).
func (h *hostParts) startACPAgent(ctx context.Context) error {
	h.agents = h.cfg.Agents
	if len(h.cfg.ACPAgent) == 0 {
		return nil
	}
	f := acpagent.New(acpagent.Config{Argv: h.cfg.ACPAgent, Cwd: h.cfg.AgentCwd, Version: h.cfg.Version, Log: h.cfg.Log, Metrics: h.m,
		HealthInterval: h.cfg.HealthInterval, HealthTimeout: h.cfg.HealthTimeout})
	if err := f.Start(ctx); err != nil {
		return err
	}
	h.agents, h.acp = f, f
	return nil
}

func (h *hostParts) closeACPAgent(context.Context) error {
	if h.acp != nil {
		h.acp.Close()
	}
	return nil
}

// startGateway makes the session table and the endpoints that serve the
// transports' connections: the JSON-RPC gateway and /acp.
func (h *hostParts) startGateway(context.Context) error {
	cfg, node := h.cfg, h.node
	h.table = session.NewTable(session.Config{
		Store:    h.st,
		Owners:   nodeOwners(node),
		Host:     nodeID(node),
		Instance: nodeInstance(node),

		OwnersTimeout: nodeOwnersTimeout(node),
		Agents:        h.agents,
		OrphanGrace:   cfg.OrphanGrace,
		Log:           cfg.Log,
		Metrics:       h.m,
		SessionTTL:    cfg.SessionTTL,
		MaxLive:       cfg.MaxLiveSessions,
		Retention:     store.Retention{PerSession: cfg.JournalPerSession, Total: cfg.JournalTotal, PerSessionBytes: cfg.JournalBytes},
		Notify:        h.notifyFunc(),
	})
	h.gw = rpc.New(h.table, h.st, cfg.Version, cfg.Log, h.m)
	h.gw.SetCredentials(h.creds)
	if h.push != nil {
		h.gw.SetPush(h.push)
	}
	if node != nil {
		h.gw.SetRemote(clusterRemote{node}) // before any connection
	}
	var caps prompt.Caps // echo and exec: text and resource links
	if h.acp != nil {
		caps = h.acp.PromptCapabilities
	}
	h.gw.SetPromptCaps(caps)
	h.acpGW = acpgw.New(acpgw.Config{Table: h.table, Store: h.st, Cwd: agentCwd(cfg.AgentCwd), Version: cfg.Version, Log: cfg.Log, Metrics: h.m, PromptCaps: caps})
	h.acpGW.SetCredentials(h.creds)
	if node != nil {
		h.acpGW.SetRemote(clusterACP{node}) // before any connection
	}
	h.endpoints = map[string]link.Endpoint{wire.PathRPC: h.gw, wire.PathACP: h.acpGW}
	return nil
}

func (h *hostParts) closeGateway(context.Context) error {
	h.acpGW.Close()
	h.gw.Close()
	return nil
}

// listenPublic binds a TCP public listener: it is the host's own, and
// every transport plugin process inherits it, so it stays bound across
// plugin crashes and swaps. Bound before any plugin is touched: a taken
// port fails the start first.
func (h *hostParts) listenPublic(context.Context) error {
	if !supervise.HostListens(h.cfg.Listen) {
		return nil
	}
	l, err := net.Listen("tcp", h.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", h.cfg.Listen, err)
	}
	h.ln = l.(*net.TCPListener)
	return nil
}

func (h *hostParts) closePublic(context.Context) error {
	if h.ln != nil {
		_ = h.ln.Close()
	}
	return nil
}

// startBackend starts (or reattaches) the PTY plugin, unless /api/pty
// is off.
func (h *hostParts) startBackend(ctx context.Context) error {
	h.opts = h.supervise()
	if h.cfg.PTY.Spec.Path == "" {
		return nil
	}
	bc := h.cfg.PTY.BackendConfig
	h.router = ptyroute.New(h.cfg.Log, h.m, bc.MaxCols, bc.MaxRows)
	h.router.SetCredentials(h.creds)
	h.router.SetOnExit(h.ptyExitFunc())
	if h.node != nil {
		h.router.SetRemote(clusterPTYs{h.node})
	}
	h.endpoints["/api/pty"] = h.router
	backend := supervise.NewBackend(h.opts, h.cfg.PTY.Spec, bc, h.router)
	if err := backend.Start(ctx); err != nil {
		return err
	}
	h.backend = backend
	h.m.SetPTYSource(backend.Stats)
	return nil
}

// stopBackend lets the sockets' detaches reach the plugin (the sockets
// are closed by now), then lets go of the plugin for the next host, or
// stops it with --stop-ptys. A host that failed to start does not leave
// behind a plugin it started itself.
func (h *hostParts) stopBackend(ctx context.Context) error {
	if h.backend == nil {
		return nil
	}
	h.router.Wait()
	h.backend.Stop(ctx, !h.cfg.StopPTYs && (h.serving || h.backend.ReattachedNow()))
	return nil
}

// supervise is the plugins' options; the primary transport failing for
// good ends the host (exit status 3), so that a service manager
// restarts it whole.
func (h *hostParts) supervise() supervise.Options {
	cfg := h.cfg
	return supervise.Options{
		PrimaryFailed: func(lastErr string) {
			select {
			case h.primaryFailed <- lastErr:
			default:
			}
		},
		StateDir:          cfg.StateDir,
		SocketDir:         h.sockDir,
		Credentials:       h.creds,
		TransportSettings: cfg.TransportSettings,
		Endpoints:         h.endpoints,
		RestartLimit:      cfg.RestartLimit,
		StartTimeout:      cfg.PluginStartTimeout,
		HealthInterval:    cfg.HealthInterval,
		HealthTimeout:     cfg.HealthTimeout,
		Metrics:           h.m,
		Log:               cfg.Log,
	}
}

// loadPrimary starts the primary transport, serving --listen.
func (h *hostParts) loadPrimary(ctx context.Context) (err error) {
	h.ts = supervise.NewTransports(h.opts)
	primary := h.cfg.Transport
	primary.Name = PrimaryTransport
	h.sup, err = h.ts.Load(ctx, TransportSpec{PluginSpec: primary, Listen: h.cfg.Listen}, h.ln)
	return err
}

// loadAdded starts the transports added beside the primary; the primary
// transport's stop stops them too.
func (h *hostParts) loadAdded(ctx context.Context) error {
	for _, t := range h.cfg.Transports {
		if _, err := h.ts.Load(ctx, t, nil); err != nil {
			return err
		}
	}
	return nil
}

// stopTransports closes every socket with 1001 and stops the transport
// plugins.
func (h *hostParts) stopTransports(ctx context.Context) error {
	h.ts.Stop(ctx)
	return nil
}

// sessionsReserve is the part of the stop's deadline the sessions'
// shutdown leaves to the parts stopped after it (the transports and the
// PTY plugin), when persisting cannot finish (a cluster without quorum).
const sessionsReserve = shutdownBudget / 4

// persistSessions interrupts the runs while their viewers are still
// connected (they get message.complete "interrupted") and persists the
// sessions with reason shutdown.
func (h *hostParts) persistSessions(ctx context.Context) error {
	ctx, cancel := shortened(ctx, sessionsReserve)
	defer cancel()
	if err := h.table.Shutdown(ctx); err != nil {
		return fmt.Errorf("sessions did not all persist in time: %w", err)
	}
	return nil
}

// serveCluster makes the serving host a cluster member.
func (h *hostParts) serveCluster(context.Context) error {
	if h.node == nil {
		return nil
	}
	return serveCluster(h.node, h.m, h.table, h.backend, h.endpoints, h.sup.Addr())
}

// drainCluster closes the legs other hosts relay here with 1001.
func (h *hostParts) drainCluster(context.Context) error {
	if h.node != nil {
		h.node.Drain(1001, "host shutting down")
	}
	return nil
}

// drainTransports stops accepting new connections.
func (h *hostParts) drainTransports(context.Context) error {
	h.ts.Drain()
	return nil
}

func (h *hostParts) serveControl(context.Context) error {
	h.ctl = newControlServer(h.ctlLn, h.notifyControl(controlHandler(h.ts, h.backend)), h.cfg.Log)
	return nil
}

func (h *hostParts) closeControl(context.Context) error {
	h.ctl.Close()
	return nil
}

// startReloads swaps every transport for a fresh process each time
// Config.Reload delivers (SIGHUP).
func (h *hostParts) startReloads(ctx context.Context) error {
	h.stopReloads = reloadOnSignal(ctx, h.cfg, h.ts)
	return nil
}

// endReloads waits for a reload in flight.
func (h *hostParts) endReloads(context.Context) error {
	h.stopReloads()
	return nil
}

// writeURL records the public URL in the state dir, so that client
// commands given only the state dir reach this host (recorded before the
// listening line, which a client may act on at once).
func (h *hostParts) writeURL(context.Context) error {
	scheme := "http"
	if h.cfg.TLSCert != "" {
		scheme = "https"
	}
	h.publicURL = scheme + "://" + access.BrowserAddr(h.sup.Addr())
	h.gw.SetPageURL(cmp.Or(h.cfg.PublicURL, h.publicURL))
	if h.outbox != nil {
		h.outbox.SetLinkBase(cmp.Or(h.cfg.PublicURL, h.publicURL))
	}
	if !supervise.HostListens(h.cfg.Listen) {
		return nil
	}
	if err := writeURL(h.cfg.StateDir, h.publicURL); err != nil {
		h.cfg.Log.Warn().Err(err).Msg("client commands need --url to reach this host")
		return nil
	}
	h.urlWritten = true
	return nil
}

func (h *hostParts) removeURL(context.Context) error {
	if h.urlWritten {
		removeURL(h.cfg.StateDir, h.publicURL)
	}
	return nil
}

// serveAdmin serves --admin-listen: /metrics, /healthz, /debug/pprof.
func (h *hostParts) serveAdmin(context.Context) (err error) {
	if h.cfg.AdminListen != "" {
		h.stopAdmin, h.adminAddr, err = serveAdmin(h.cfg, h.creds, h.m)
	}
	return err
}

func (h *hostParts) closeAdmin(context.Context) error {
	if h.stopAdmin != nil {
		h.stopAdmin()
	}
	return nil
}

// announce prints the listening line (and the admin line), which ends
// the start.
func (h *hostParts) announce(context.Context) error {
	cfg := h.cfg
	fmt.Fprintf(cfg.Stdout, "tether listening on %s/?token=%s\n", h.publicURL, cfg.Token)
	if h.adminAddr != "" {
		fmt.Fprintf(cfg.Stdout, "tether admin on http://%s\n", access.BrowserAddr(h.adminAddr))
	}
	h.serving = true
	cfg.Log.Info().Str("addr", h.sup.Addr()).Msg("tether serving")
	if asked, applied := cmp.Or(cfg.MaxConnections, defaultMaxConnections), h.sup.MaxConnections(); applied > 0 && applied < asked {
		cfg.Log.Info().Int("asked", asked).Int("applied", applied).Msgf("open connections are bounded at %d, not the %d asked, to stay under the transport's limit of open files (raise it with ulimit -n, or LimitNOFILE= under systemd)", applied, asked)
	}
	if cfg.TokenCreated {
		cfg.Log.Info().Str("file", tokenFileOf(cfg)).Msg("new access token created")
	}
	return nil
}
