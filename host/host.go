package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/store"
)

// Config configures a host.
type Config struct {
	// Listen is the public listener's address.
	Listen string
	// Token is the access token clients must present.
	Token string
	// StateDir holds state.db (created with mode 0700).
	StateDir string
	// OrphanGrace: see TableConfig.
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
	// AllowOrigins are extra accepted Origins.
	AllowOrigins []string
	// Agents builds each live session's agent.
	Agents contract.AgentFactory
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
	// PTY is the PTY backend plugin to run and its configuration; a zero
	// Spec.Path switches /api/pty off (4404).
	PTY PTYConfig
	// StopPTYs stops the PTY plugin (and its PTYs) at shutdown instead
	// of leaving it running for the next host (SPEC §6.3).
	StopPTYs bool
	// Reload, when it delivers, swaps every transport plugin for a fresh
	// process, like `tether plugins reload NAME` (tether serve sends
	// SIGHUP's here).
	Reload <-chan struct{}
	// AdminListen, if set, serves /metrics and /debug/pprof.
	AdminListen string
	// PingInterval and PeerTimeout tune the transport's liveness checks
	// (0 = the transport's defaults, 20s and 60s).
	PingInterval, PeerTimeout time.Duration
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

// shutdownBudget is how long a shutdown may take in all (SPEC §2: exit
// within 5 s).
const shutdownBudget = 4 * time.Second

// Run starts the host and serves until ctx is done, then shuts down:
// clients are closed with 1001, sessions are persisted with reason
// shutdown, and plugins are stopped.
func Run(ctx context.Context, cfg Config) error {
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if err := os.Chmod(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	// Refuse to start beside a running host before touching its
	// database or its plugins.
	ctlLn, err := listenControl(cfg.StateDir)
	if err != nil {
		return err
	}
	defer ctlLn.Close() // until the control server owns it
	st, err := store.Open(ctx, filepath.Join(cfg.StateDir, "state.db"))
	if err != nil {
		return fmt.Errorf("open state: %w", err)
	}
	defer st.Close()

	metrics := NewMetrics()
	table := NewTable(TableConfig{
		Store:       st,
		Agents:      cfg.Agents,
		OrphanGrace: cfg.OrphanGrace,
		Log:         cfg.Log,
		Metrics:     metrics,
		SessionTTL:  cfg.SessionTTL,
		MaxLive:     cfg.MaxLiveSessions,
		Retention:   store.Retention{PerSession: cfg.JournalPerSession, Total: cfg.JournalTotal},
	})
	gw := NewGateway(table, st, cfg.Version, cfg.Log, metrics)
	defer gw.Close()

	// A TCP public listener is the host's own: every transport plugin
	// process inherits it (see supervisor), so it stays bound across
	// plugin crashes and swaps. Bound first: a taken port fails the
	// start before any plugin is touched.
	var ln *net.TCPListener
	if hostListens(cfg.Listen) {
		l, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
		}
		defer l.Close()
		ln = l.(*net.TCPListener)
	}

	var router *PTYRouter
	var bsup *backendSupervisor
	serving := false // the listening line is out
	if cfg.PTY.Spec.Path != "" {
		router = NewPTYRouter(cfg.Log, metrics)
		bsup = newBackendSupervisor(cfg, router, metrics)
		if err := bsup.start(ctx); err != nil {
			return err
		}
		metrics.SetPTYSource(bsup.ptyCount)
		defer func() {
			// The sockets are closed by now; let their detaches reach
			// the plugin before letting go of it. A host that failed to
			// start does not leave behind a plugin it started itself.
			router.Wait()
			sctx, cancel := context.WithTimeout(context.Background(), shutdownBudget/2)
			defer cancel()
			bsup.stop(sctx, !cfg.StopPTYs && (serving || bsup.reattachedNow()))
		}()
	}
	ts := newTransports(cfg, gw, router, metrics)
	primary := cfg.Transport
	primary.Name = PrimaryTransport
	sup, err := ts.load(ctx, TransportSpec{PluginSpec: primary, Listen: cfg.Listen}, ln)
	if err != nil {
		return err
	}
	for _, t := range cfg.Transports {
		if _, err := ts.load(ctx, t, nil); err != nil {
			ts.stop(context.Background())
			return err
		}
	}
	addr := sup.addr
	ctl := newControlServer(ctlLn, controlHandler(cfg, ts, bsup), cfg.Log)
	defer ctl.Close()
	var reloads sync.WaitGroup
	reloadCtx, stopReloads := context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		stopReloads()
		reloads.Wait()
	}()
	if cfg.Reload != nil {
		reloads.Add(1)
		go func() {
			defer reloads.Done()
			for {
				select {
				case <-reloadCtx.Done():
					return
				case <-cfg.Reload:
				}
				for _, sup := range ts.list() {
					cfg.Log.Info().Str("plugin", sup.name).Msg("reload requested (SIGHUP)")
					if _, err := sup.reload(reloadCtx, nil); err != nil {
						cfg.Log.Error().Err(err).Str("plugin", sup.name).Msg("reload failed; the running plugin keeps serving")
					}
				}
			}
		}()
	}
	var admin *http.Server
	var adminDone chan struct{}
	if cfg.AdminListen != "" {
		ln, err := net.Listen("tcp", cfg.AdminListen)
		if err != nil {
			ts.stop(context.Background())
			return fmt.Errorf("admin listener: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}))
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		admin = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		adminDone = make(chan struct{})
		go func() {
			defer close(adminDone)
			if err := admin.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				cfg.Log.Error().Err(err).Msg("admin listener")
			}
		}()
		defer func() {
			_ = admin.Close()
			<-adminDone
		}()
		fmt.Fprintf(cfg.Stdout, "tether listening on http://%s/?token=%s\n", addr, cfg.Token)
		fmt.Fprintf(cfg.Stdout, "tether admin on http://%s\n", ln.Addr())
	} else {
		fmt.Fprintf(cfg.Stdout, "tether listening on http://%s/?token=%s\n", addr, cfg.Token)
	}
	serving = true
	cfg.Log.Info().Str("addr", addr).Msg("tether serving")

	<-ctx.Done()
	cfg.Log.Info().Msg("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownBudget)
	defer cancel()
	// No more control requests or reloads; stop accepting; interrupt
	// runs while their viewers are still connected (they get
	// message.complete "interrupted") and persist; then close every
	// socket with 1001 and stop the transport plugin. The PTY plugin is
	// let go (or stopped) last, by the deferred calls.
	ctl.Close()
	stopReloads()
	reloads.Wait()
	ts.drain()
	if err := table.Shutdown(sctx); err != nil {
		cfg.Log.Error().Err(err).Msg("sessions did not all persist in time")
	}
	ts.stop(sctx)
	return nil
}

// controlHandler answers the control socket's requests.
func controlHandler(cfg Config, ts *transports, bsup *backendSupervisor) func(context.Context, ControlRequest) (ControlResponse, error) {
	return func(ctx context.Context, req ControlRequest) (ControlResponse, error) {
		var spec *PluginSpec
		if req.Path != "" {
			if !filepath.IsAbs(req.Path) {
				return ControlResponse{}, fmt.Errorf("plugin path %q is not absolute", req.Path)
			}
			spec = &PluginSpec{Name: req.Name, Path: req.Path, SHA256: req.SHA256}
		}
		isPTY := bsup != nil && req.Name == bsup.spec.Name
		var err error
		switch req.Op {
		case OpList:
		case OpReload:
			switch sup := ts.get(req.Name); {
			case sup != nil:
				_, err = sup.reload(ctx, spec)
			case isPTY:
				_, err = bsup.reload(ctx, spec)
			default:
				err = noPlugin(req.Name, ts, bsup)
			}
		case OpStop:
			switch {
			case isPTY:
				_, err = bsup.stopPTYs(ctx)
			case ts.get(req.Name) != nil:
				err = fmt.Errorf("plugin %s is a transport: it is not stopped on its own; unload it (an added transport) or reload it to swap it for a fresh process", req.Name)
			default:
				err = noPlugin(req.Name, ts, bsup)
			}
		case OpLoad:
			switch {
			case req.Kind != contract.KindTransport:
				err = fmt.Errorf("load %s: kind %q cannot be loaded at runtime (only %s)", req.Name, req.Kind, contract.KindTransport)
			case spec == nil:
				err = fmt.Errorf("load %s: a plugin path is required", req.Name)
			default:
				if err = CheckTransportName(req.Name); err == nil {
					_, err = ts.load(ctx, TransportSpec{PluginSpec: *spec, Listen: req.Listen}, nil)
				}
			}
		case OpUnload:
			if isPTY {
				err = fmt.Errorf("plugin %s is the PTY backend: stop it with `tether plugins stop %s`", req.Name, req.Name)
			} else {
				err = ts.unload(ctx, req.Name)
			}
		default:
			err = fmt.Errorf("unknown operation %q (want %s, %s, %s, %s or %s)", req.Op, OpList, OpReload, OpLoad, OpUnload, OpStop)
		}
		if err != nil {
			return ControlResponse{}, err
		}
		ps := make([]PluginStatus, 0, 4)
		for _, sup := range ts.list() {
			ps = append(ps, sup.status())
		}
		if bsup != nil {
			ps = append(ps, bsup.status())
		}
		return ControlResponse{Plugins: ps}, nil
	}
}

// noPlugin is the error for a name no plugin has.
func noPlugin(name string, ts *transports, bsup *backendSupervisor) error {
	var names []string
	for _, sup := range ts.list() {
		names = append(names, sup.name)
	}
	if bsup != nil {
		names = append(names, bsup.spec.Name)
	}
	return fmt.Errorf("no plugin named %q (plugins: %s)", name, strings.Join(names, ", "))
}
