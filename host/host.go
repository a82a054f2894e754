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
	"sync"
	"sync/atomic"
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
	// Transport is the built-in or external transport plugin to run.
	Transport PluginSpec
	// PTY is the PTY backend plugin to run and its configuration; a zero
	// Spec.Path switches /api/pty off (4404).
	PTY PTYConfig
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

	var router *PTYRouter
	var bsup *backendSupervisor
	if cfg.PTY.Spec.Path != "" {
		router = NewPTYRouter(cfg.Log, metrics)
		bsup = &backendSupervisor{spec: cfg.PTY.Spec, cfg: cfg.PTY.BackendConfig, router: router, metrics: metrics, log: cfg.Log}
		if err := bsup.start(ctx); err != nil {
			return err
		}
		defer func() {
			bsup.stop()
			router.Wait()
		}()
	}
	sup := &supervisor{spec: cfg.Transport, cfg: cfg, gw: gw, pty: router, metrics: metrics, log: cfg.Log}
	addr, err := sup.start(ctx)
	if err != nil {
		return err
	}
	var admin *http.Server
	var adminDone chan struct{}
	if cfg.AdminListen != "" {
		ln, err := net.Listen("tcp", cfg.AdminListen)
		if err != nil {
			sup.stop(context.Background())
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
	cfg.Log.Info().Str("addr", addr).Msg("tether serving")

	<-ctx.Done()
	cfg.Log.Info().Msg("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownBudget)
	defer cancel()
	// Stop accepting; interrupt runs while their viewers are still
	// connected (they get message.complete "interrupted") and persist;
	// then close every socket with 1001 and stop the plugin.
	sup.drain()
	if err := table.Shutdown(sctx); err != nil {
		cfg.Log.Error().Err(err).Msg("sessions did not all persist in time")
	}
	sup.stop(sctx)
	return nil
}

// supervisor runs the transport plugin: it starts it, links it, restarts
// it with capped exponential backoff when it dies, and stops it.
type supervisor struct {
	spec    PluginSpec
	cfg     Config
	gw      *Gateway
	pty     *PTYRouter
	metrics *Metrics
	log     zerolog.Logger

	addr     string // bound address, fixed after the first start
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	done     chan struct{} // closed when loop returns
	stopping atomic.Bool

	mu   sync.Mutex // guards the fields below
	proc *pluginProc
	link *Link
}

// drain makes the current link refuse new connections.
func (s *supervisor) drain() {
	s.mu.Lock()
	link := s.link
	s.mu.Unlock()
	if link != nil {
		link.Drain()
	}
}

// start launches the plugin the first time and keeps it running.
func (s *supervisor) start(ctx context.Context) (string, error) {
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	proc, link, err := s.launch(s.cfg.Listen)
	if err != nil {
		s.cancel()
		return "", err
	}
	s.done = make(chan struct{})
	s.wg.Add(1)
	go s.loop(proc, link)
	return s.addr, nil
}

// launch starts one plugin process, binds its listener and makes its link.
func (s *supervisor) launch(listen string) (*pluginProc, *Link, error) {
	proc, err := startPlugin(s.spec, contract.KindTransport, s.log)
	if err != nil {
		return nil, nil, err
	}
	instance := contract.NewInstanceID()
	sctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	resp, err := proc.tr.Start(sctx, contract.StartRequest{
		Instance:     instance,
		Listen:       listen,
		PingInterval: s.cfg.PingInterval,
		PeerTimeout:  s.cfg.PeerTimeout,
	})
	if err != nil {
		proc.client.Kill()
		return nil, nil, fmt.Errorf("start %s listener on %s: %w", s.spec.Name, listen, err)
	}
	s.addr = resp.Addr
	access := &Access{Token: s.cfg.Token, Bound: resp.Addr, AllowOrigins: s.cfg.AllowOrigins}
	link := NewLink(s.spec.Name, instance, proc.tr, s.gw, s.pty, access, s.log)
	s.mu.Lock()
	s.proc = proc
	s.link = link
	s.mu.Unlock()
	s.log.Info().Str("plugin", s.spec.Name).Str("instance", instance).Int("pid", proc.client.ReattachConfig().Pid).Str("version", resp.Version).Msg("plugin started")
	return proc, link, nil
}

// loop serves a link and restarts the plugin when it ends unasked.
func (s *supervisor) loop(proc *pluginProc, link *Link) {
	defer s.wg.Done()
	defer close(s.done)
	backoff := 100 * time.Millisecond
	for {
		started := time.Now()
		err := link.Run(s.ctx)
		if s.ctx.Err() != nil || s.stopping.Load() {
			proc.client.Kill()
			return
		}
		proc.client.Kill()
		s.log.Warn().Err(err).Str("plugin", s.spec.Name).Msg("transport plugin ended; restarting")
		s.metrics.PluginRestarts.WithLabelValues(s.spec.Name).Inc()
		if time.Since(started) > time.Minute {
			backoff = 100 * time.Millisecond
		}
		for {
			t := time.NewTimer(backoff)
			select {
			case <-s.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(backoff*2, 5*time.Second)
			var lerr error
			proc, link, lerr = s.launch(s.addr)
			if lerr == nil {
				break
			}
			s.log.Error().Err(lerr).Str("plugin", s.spec.Name).Msg("restarting transport plugin")
		}
	}
}

// stop closes every client socket with 1001, ends the link and kills the
// plugin process.
func (s *supervisor) stop(ctx context.Context) {
	s.stopping.Store(true)
	s.mu.Lock()
	proc, link := s.proc, s.link
	s.mu.Unlock()
	if link != nil {
		link.Drain()
		select {
		case <-link.CloseAll(contract.CloseGoingAway, "host shutting down"):
		case <-ctx.Done():
		}
	}
	if proc != nil {
		if err := proc.tr.Stop(ctx, contract.StopRequest{Code: contract.CloseGoingAway, Reason: "host shutting down"}); err != nil {
			s.log.Debug().Err(err).Msg("stopping transport")
		}
		// The link ends by itself once the plugin has reported every
		// socket closed; cut it only when out of time.
		select {
		case <-s.done:
		case <-ctx.Done():
		}
	}
	s.cancel()
	s.wg.Wait()
	if proc != nil {
		proc.client.Kill()
	}
}

// backendSupervisor runs the PTY backend plugin: it starts it, streams its
// output into the router, and restarts it with capped backoff when it dies
// (its PTYs die with it: their sockets are closed with 1012 and reattach
// to fresh PTYs, with reset replays).
type backendSupervisor struct {
	spec    PluginSpec
	cfg     contract.BackendConfig
	router  *PTYRouter
	metrics *Metrics
	log     zerolog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex // guards proc
	proc *pluginProc
}

func (s *backendSupervisor) start(ctx context.Context) error {
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	proc, err := s.launch()
	if err != nil {
		s.cancel()
		return err
	}
	s.wg.Add(1)
	go s.loop(proc)
	return nil
}

func (s *backendSupervisor) launch() (*pluginProc, error) {
	proc, err := startPlugin(s.spec, contract.KindBackend, s.log)
	if err != nil {
		return nil, err
	}
	cfg := s.cfg
	cfg.Instance = contract.NewInstanceID()
	sctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	info, err := proc.be.Start(sctx, cfg)
	if err != nil {
		proc.client.Kill()
		return nil, fmt.Errorf("start %s backend: %w", s.spec.Name, err)
	}
	s.mu.Lock()
	s.proc = proc
	s.mu.Unlock()
	s.router.SetBackend(proc.be)
	s.log.Info().Str("plugin", s.spec.Name).Str("instance", cfg.Instance).Int("pid", proc.client.ReattachConfig().Pid).Str("version", info.Version).Msg("plugin started")
	return proc, nil
}

func (s *backendSupervisor) loop(proc *pluginProc) {
	defer s.wg.Done()
	backoff := 100 * time.Millisecond
	for {
		err := proc.be.Output(s.ctx, s.router.onOutput)
		if s.ctx.Err() != nil {
			return
		}
		proc.client.Kill()
		s.router.SetBackend(nil)
		s.router.closeAll(contract.CloseServiceRestart, "pty backend restarting")
		s.log.Warn().Err(err).Str("plugin", s.spec.Name).Msg("pty backend ended; restarting")
		s.metrics.PluginRestarts.WithLabelValues(s.spec.Name).Inc()
		for {
			t := time.NewTimer(backoff)
			select {
			case <-s.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(backoff*2, 5*time.Second)
			var lerr error
			if proc, lerr = s.launch(); lerr == nil {
				break
			}
			s.log.Error().Err(lerr).Str("plugin", s.spec.Name).Msg("restarting pty backend")
		}
	}
}

// stop ends the output stream and the plugin process (and with it its
// PTYs: keeping them for the next host is the lifecycle issue's work).
func (s *backendSupervisor) stop() {
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	proc := s.proc
	s.mu.Unlock()
	if proc != nil {
		proc.client.Kill()
	}
}
