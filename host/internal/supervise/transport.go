package supervise

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/wire"
)

// retireTimeout bounds stopping a swapped-out transport: its Stop (close
// grace of its sockets included) and its exit.
const retireTimeout = 5 * time.Second

// listenFD is the Listen value of every transport the host starts on its
// own listener: inherited as fd 3 (the first of exec.Cmd.ExtraFiles).
const listenFD = "fd:3"

// Close reasons of a stopped transport's sockets.
const (
	ReasonShutdown = "host shutting down"
	reasonUnloaded = "transport unloaded"
	reasonSwapped  = "transport plugin swapped"
)

// Options are what every supervisor needs of the host's configuration.
type Options struct {
	// StateDir is the host's state directory.
	StateDir string
	// SocketDir is where plugins make their go-plugin Unix sockets (0700):
	// <state-dir>/plugins, or a private directory when that path is too
	// long for a socket.
	SocketDir string
	// Credentials are the credentials each transport link's access
	// checks accept.
	Credentials *access.Book
	// TransportSettings are what every transport is started with.
	TransportSettings
	// Endpoints serve the transports' connections, by path.
	Endpoints map[string]link.Endpoint
	// RestartLimit is how many times in a row a transport may fail before
	// it is marked failed (0 = restart forever).
	RestartLimit int
	// StartTimeout bounds a plugin's go-plugin handshake (0: 15s).
	StartTimeout time.Duration
	// HealthInterval and HealthTimeout: every plugin is pinged this often;
	// one that does not answer in time is killed and restarted (0: never).
	HealthInterval, HealthTimeout time.Duration
	// PrimaryFailed, if set, is called when the primary transport is
	// marked failed (it failed RestartLimit times in a row): the host
	// must not go on running without it.
	PrimaryFailed func(lastErr string)
	Metrics       *metrics.Metrics
	Log           zerolog.Logger
}

// TransportSettings are the transports' settings in the host's
// configuration, passed along whole (host.Config, Options) to each
// transport process's StartRequest and its link's access checks.
type TransportSettings struct {
	// MaxConnections bounds each transport's open connections (0: the
	// transport's default, 20000); past it a new connection gets HTTP 503.
	MaxConnections int
	// TLSCert and TLSKey are PEM files: with them the primary transport
	// (the public listener) serves HTTPS/WSS ("": plain HTTP).
	TLSCert, TLSKey string
	// PingInterval and PeerTimeout tune a transport's liveness checks of
	// its clients (0 = the transport's defaults, 20s and 60s).
	PingInterval, PeerTimeout time.Duration
	// AllowOrigins are extra accepted Origins.
	AllowOrigins []string
	// AllowHosts are extra accepted Host names ("NAME" with any port or
	// none, "NAME:PORT" exactly), e.g. behind a reverse proxy.
	AllowHosts []string
	// AuthProxy, when set, is a reverse proxy whose user header names
	// who its requests are (--auth-proxy-header, --auth-proxy-from,
	// --auth-proxy-users).
	AuthProxy *access.Proxy
	// GRPCLinkOnly offers no transport process a data plane
	// (--plugin-data-plane=false): every link's batches travel on its
	// gRPC stream.
	GRPCLinkOnly bool
}

// startRequest is the StartRequest of a process of the transport named
// name: only the primary transport serves TLS.
func (s TransportSettings) startRequest(name, instance, listen string) contract.StartRequest {
	req := contract.StartRequest{
		Instance:       instance,
		Listen:         listen,
		PingInterval:   s.PingInterval,
		PeerTimeout:    s.PeerTimeout,
		MaxConnections: s.MaxConnections,
		PageAuth:       true,
	}
	if name == PrimaryTransport {
		req.TLSCertFile, req.TLSKeyFile = s.TLSCert, s.TLSKey
	}
	return req
}

// HostListens reports whether the host binds a transport's address
// itself: a TCP host:port with a numeric port. Anything else ("unix:PATH"
// for a transport that speaks over a Unix socket, say) is passed to the
// transport as it is, and the transport binds it.
func HostListens(listen string) bool {
	_, port, err := net.SplitHostPort(listen)
	if err != nil || port == "" {
		return false
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Transport runs one transport plugin under its name on the one loop. For
// a TCP listen address the listener is the host's: every plugin process
// it starts inherits a duplicate of it and accepts on it, so the port
// stays bound and connections queue in its backlog while a crashed plugin
// is restarted, and two processes accept side by side during a swap. (Any
// other address is the transport's to bind; a swap then needs the new
// process to bind beside the old one.) It links each process (a crash
// parks its sockets' sessions: the link detaches them), swaps in a fresh
// process on reload, and stops it.
type Transport struct {
	core
	opts   Options
	listen string           // the configured address
	ln     *net.TCPListener // the host's listener for it (stop closes it); nil: the transport binds listen
	addr   string           // the bound address; set by the first start when ln is nil
	ids    *instanceIDs
	// maxConns is the bound on open connections the first process
	// applies (StartResponse.MaxConnections); set by the first start.
	maxConns int

	// spec is the binary the next process runs; guarded by core.mu.
	spec PluginSpec
}

// tgen is one transport plugin process and its link.
type tgen struct {
	genState
	link     *link.Link
	instance string
	refused  atomic.Uint64 // the process's Refused503 last read
}

func (g *tgen) state() *genState { return &g.genState }

// serve runs g's link until it ends; the go-plugin client's context,
// which ends the link's stream, is the death signal. The process is
// killed after.
func (g *tgen) serve(ctx context.Context) error {
	err := g.link.Run(ctx)
	g.proc.client.Kill()
	g.proc.removeSocket()
	return err
}

// newTransport returns the supervisor of transport ts, serving on ln
// when the host holds its listener (a TCP address; nil otherwise).
func newTransport(opts Options, ts TransportSpec, ln *net.TCPListener, ids *instanceIDs) *Transport {
	t := &Transport{opts: opts, listen: ts.Listen, ln: ln, ids: ids, spec: ts.PluginSpec}
	if ln != nil {
		t.addr = ln.Addr().String()
	}
	t.core = core{
		name:  ts.Name,
		what:  "transport plugin",
		limit: opts.RestartLimit,

		healthInterval: opts.HealthInterval,
		healthTimeout:  opts.HealthTimeout,
		metrics:        opts.Metrics,
		log:            opts.Log,
		launch: func() (gen, error) {
			t.mu.Lock()
			spec := t.spec
			t.mu.Unlock()
			return t.launchSpec(spec)
		},
	}
	if ts.Name == PrimaryTransport {
		t.core.failed = opts.PrimaryFailed
	}
	t.core.pinged = t.collectStats
	return t
}

// collectStats reads a transport process's counters after a health ping
// and adds its new refusals (past --max-connections) to the host's
// counter: each process counts from zero.
func (t *Transport) collectStats(ctx context.Context, g gen) {
	tg := g.(*tgen)
	st, err := tg.proc.tr.Stats(ctx)
	if err != nil {
		return // a transport without counters, or one that is going away
	}
	if prev := tg.refused.Swap(st.Refused503); st.Refused503 > prev {
		t.metrics.TransportRefused.WithLabelValues(t.name).Add(float64(st.Refused503 - prev))
	}
	t.metrics.TransportConns.WithLabelValues(t.name).Set(float64(st.Connections))
}

// Name is the transport's name.
func (t *Transport) Name() string { return t.name }

// Addr is the address the transport serves.
func (t *Transport) Addr() string { return t.addr }

// MaxConnections is the bound on open connections the transport's first
// process applies (0: none reported).
func (t *Transport) MaxConnections() int { return t.maxConns }

// start launches the first plugin process and keeps it running.
func (t *Transport) start(ctx context.Context) error {
	t.init(ctx)
	t.metrics.PluginReloads.WithLabelValues(t.name) // exists from the start, at 0
	g, err := t.launchSpec(t.spec)
	if err != nil {
		t.cancel()
		return err
	}
	if !t.activate(g) {
		g.proc.client.Kill()
		t.cancel()
		return ErrStopping
	}
	return nil
}

// launchSpec starts one plugin process on the shared listener and makes
// its link (not yet running).
func (t *Transport) launchSpec(spec PluginSpec) (*tgen, error) {
	opts := procOptions{Env: []string{EnvPluginStateDir + "=" + t.opts.StateDir}, StartTimeout: t.opts.StartTimeout, Metrics: t.metrics, BinDir: filepath.Join(t.opts.StateDir, "plugins", "bin")}
	if t.opts.SocketDir != "" {
		// go-plugin's server makes its socket there, not in /tmp.
		opts.Env = append(opts.Env, plugin.EnvUnixSocketDir+"="+t.opts.SocketDir)
	}
	listen := t.listen
	if t.addr != "" {
		listen = t.addr // a restart binds the address the first start got
	}
	if t.ln != nil {
		f, err := t.ln.File() // a duplicate; the child inherits it as fd 3
		if err != nil {
			return nil, fmt.Errorf("plugin %s: sharing the listener: %w", spec.Name, err)
		}
		defer f.Close() // the child has its own copy once started
		opts.ExtraFiles = []*os.File{f}
		listen = listenFD
	}
	// The link's data plane: a socket pair, the plugin's end inherited
	// after the listener. Without one the link runs over gRPC.
	var dpHost net.Conn
	var dpName string
	if !t.opts.GRPCLinkOnly {
		host, pf, err := contract.NewDataPlanePair()
		if err != nil {
			t.log.Warn().Err(err).Str("plugin", spec.Name).Msg("no data plane for the transport's link; it runs over gRPC")
		} else {
			defer pf.Close() // the child has its own copy once started
			opts.ExtraFiles = append(opts.ExtraFiles, pf)
			dpHost, dpName = host, fmt.Sprintf("fd:%d", 2+len(opts.ExtraFiles))
		}
	}
	proc, err := startPlugin(spec, contract.KindTransport, opts, t.log)
	if err != nil {
		if dpHost != nil {
			dpHost.Close()
		}
		return nil, err
	}
	if dpHost != nil {
		proc.tr.OfferDataPlane(dpHost, dpName)
	}
	instance := t.ids.next(spec.Name)
	sctx, cancel := context.WithTimeout(t.ctx, startRPCTimeout)
	defer cancel()
	resp, err := proc.tr.Start(sctx, t.opts.startRequest(t.name, instance, listen))
	if err != nil {
		proc.client.Kill()
		if t.ln != nil {
			return nil, fmt.Errorf("plugin %s (%s): start on the host's listener %s, inherited as Listen %q (a transport must serve fd:N): %w", spec.Name, spec.Path, t.addr, listen, err)
		}
		return nil, &listenError{fmt.Errorf("plugin %s (%s): start listening on %s: %w", spec.Name, spec.Path, listen, err)}
	}
	if t.addr == "" {
		t.addr = resp.Addr // only the first start, before anything runs concurrently
	}
	if t.maxConns == 0 {
		t.maxConns = resp.MaxConnections // likewise
	}
	g := &tgen{
		genState: genState{proc: proc, version: resp.Version, started: time.Now(), done: make(chan struct{})},
		link: link.New(link.Config{
			Name:      spec.Name,
			Instance:  instance,
			Transport: proc.tr,
			Endpoints: t.opts.Endpoints,
			Access: &access.Access{Book: t.opts.Credentials, Cookie: access.CookieName(t.addr), Bound: t.addr,
				AllowHosts: t.opts.AllowHosts, AllowOrigins: t.opts.AllowOrigins,
				Secure: t.name == PrimaryTransport && t.opts.TLSCert != "", Proxy: t.opts.AuthProxy},
			Metrics: t.metrics,
			Log:     t.log,
		}),
		instance: instance,
	}
	t.log.Debug().Str("plugin", spec.Name).Str("instance", instance).Int("pid", proc.pid).
		Str("version", resp.Version).Str("path", spec.Path).Int("max_connections", resp.MaxConnections).
		Str("data_plane", cmp.Or(proc.tr.DataPlane(), "grpc")).Msg("plugin started")
	return g, nil
}

// listenError is a launch that failed in the transport's Start, binding
// an address of its own: the plugin itself answered the handshake.
type listenError struct{ err error }

func (e *listenError) Error() string { return e.err.Error() }
func (e *listenError) Unwrap() error { return e.err }

// Reload (SIGHUP, `tether plugins reload NAME`) starts a fresh plugin
// process (from spec when given, else the current one's binary), links
// it, and retires the old one: it stops accepting, closes its sockets
// with 1012 (their sessions are parked; clients reconnect and resume) and
// exits. The listener stays open throughout, so no connection is refused.
// If the new process fails to start, the old one keeps serving and the
// error is returned.
func (t *Transport) Reload(ctx context.Context, spec *PluginSpec) (PluginStatus, error) {
	if err := t.acquire(ctx); err != nil {
		return PluginStatus{}, err
	}
	defer t.release()
	if t.isStopping() {
		return PluginStatus{}, ErrStopping
	}
	t.mu.Lock()
	next := t.spec
	t.mu.Unlock()
	if spec != nil {
		next = *spec
		next.Name = t.name
	}
	g, err := t.launchSpec(next)
	var lerr *listenError
	if errors.As(err, &lerr) {
		// The address is the transport's own (not a TCP address the host
		// holds and hands over), and the running process holds it, so a
		// new one cannot bind it beside the old one: stop the old one
		// first (its sockets get 1012, their sessions are parked), then
		// start the new one. Clients see a short gap and resume.
		t.mu.Lock()
		old, _ := t.cur.(*tgen)
		t.mu.Unlock()
		if old != nil {
			t.log.Info().Err(err).Str("plugin", t.name).Msg("the new transport process cannot bind beside the old one; stopping the old one first")
			t.retire(old, wire.CloseServiceRestart, reasonSwapped)
			t.mu.Lock()
			if t.cur == gen(old) {
				t.cur, t.core.state = nil, stateRestarting
			}
			t.mu.Unlock()
			if g, err = t.launchSpec(next); err != nil {
				// Down now: the restart loop brings the previous binary
				// back (this swap holds the operation slot, so stop has
				// not begun waiting).
				t.wg.Add(1)
				go func() {
					defer t.wg.Done()
					t.restart()
				}()
				return PluginStatus{}, fmt.Errorf("%w (the old process was stopped to free the address; the previous binary is being restarted)", err)
			}
		}
	}
	if err != nil {
		return PluginStatus{}, err
	}
	t.mu.Lock()
	old, _ := t.cur.(*tgen)
	t.spec = next
	t.streak, t.backoff = 0, 0 // a reload gives a failed plugin a fresh start
	t.mu.Unlock()
	if !t.activate(g) {
		g.proc.client.Kill()
		return PluginStatus{}, ErrStopping
	}
	t.metrics.PluginReloads.WithLabelValues(t.name).Inc()
	if old != nil {
		t.retire(old, wire.CloseServiceRestart, reasonSwapped)
	}
	t.log.Info().Str("plugin", t.name).Int("pid", g.proc.pid).Str("path", next.Path).Msg("transport plugin swapped")
	return t.Status(), nil
}

// retire stops a swapped-out process: Stop closes its listener (its
// duplicate; the host's stays open) and every socket with code, and
// reports them closed on the link; then the link ends and serve kills
// the process.
func (t *Transport) retire(g *tgen, code int, reason string) {
	g.retired.Store(true)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.ctx), retireTimeout)
	defer cancel()
	if err := g.proc.tr.Stop(ctx, contract.StopRequest{Code: code, Reason: reason}); err != nil {
		t.log.Debug().Err(err).Str("plugin", t.name).Msg("stopping the old transport")
	}
	select {
	case <-g.done:
	case <-ctx.Done():
		g.proc.client.Kill() // its link then ends, and watch finishes
	}
}

// drain makes the serving link refuse new connections (with 1001).
func (t *Transport) drain() {
	if g, _ := t.current().(*tgen); g != nil {
		g.link.Drain(wire.CloseGoingAway, ReasonShutdown)
	}
}

// stop closes every client socket with code (1001 at shutdown, 1012 when
// the transport is unloaded: their sessions are parked, never closed),
// stops the plugin, waits for it and lets go of the listener. It waits
// for a swap or launch in flight first, within ctx.
func (t *Transport) stop(ctx context.Context, code int, reason string) {
	t.mu.Lock()
	t.stopping = true
	t.mu.Unlock()
	acquired := t.acquire(ctx) == nil
	t.mu.Lock()
	g, _ := t.cur.(*tgen)
	t.core.state = stateStopped
	t.mu.Unlock()
	if g != nil {
		g.retired.Store(true)
		g.link.Drain(code, reason)
		select {
		case <-g.link.CloseAll(code, reason):
		case <-ctx.Done():
		}
		if err := g.proc.tr.Stop(ctx, contract.StopRequest{Code: code, Reason: reason}); err != nil {
			t.log.Debug().Err(err).Str("plugin", t.name).Msg("stopping transport")
		}
		// The link ends by itself once the plugin has reported every
		// socket closed; cut it only when out of time.
		select {
		case <-g.done:
		case <-ctx.Done():
		}
	}
	t.finish()
	if t.ln != nil {
		_ = t.ln.Close()
	}
	if acquired {
		t.release()
	}
}

// Status describes the transport plugin for `tether plugins list`.
func (t *Transport) Status() PluginStatus {
	t.mu.Lock()
	path := t.spec.Path
	t.mu.Unlock()
	st, cur := t.statusBase(contract.KindTransport, path)
	st.Addr = t.addr
	if g, _ := cur.(*tgen); g != nil {
		st.Connections = g.link.ConnCount()
	}
	return st
}
