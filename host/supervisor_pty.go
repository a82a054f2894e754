package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

// maxSocketPath is the longest Unix socket path this host creates (the
// kernel's limit is 108 bytes with the terminating NUL; BSDs have 104).
const maxSocketPath = 103

// backendSupervisor runs the PTY backend plugin so that it outlives the
// host (SPEC §6.3): it starts it in a session of its own, with its gRPC
// socket in <state-dir>/plugins and a reattach record next to it; a host
// starting on the same state dir reattaches to it. It streams the
// plugin's output into the router, restarts it with capped backoff when
// it dies (its PTYs die with it: their sockets are closed with 1012 and
// reattach to fresh PTYs, with reset replays), and at shutdown leaves it
// running unless told to stop it.
type backendSupervisor struct {
	spec     PluginSpec
	cfg      contract.BackendConfig
	stateDir string
	router   *PTYRouter
	metrics  *Metrics
	log      zerolog.Logger

	ctx    context.Context // the supervisor's life
	cancel context.CancelFunc
	wg     sync.WaitGroup // watch goroutines (and the restarts they run)
	ops    chan struct{}  // one launch, reattach or stop at a time

	mu       sync.Mutex // guards the fields below
	stopping bool       // stop has begun: nothing is activated any more
	cur      *bgen      // nil while restarting or stopped
	state    string
	restarts int
	lastErr  string
	backoff  time.Duration
}

// bgen is one backend plugin process, started or reattached.
type bgen struct {
	proc       *pluginProc
	instance   string
	version    string
	started    time.Time
	reattached bool
	rec        ReattachRecord // zero when none could be written
	ctx        context.Context
	cancel     context.CancelFunc // ends its output stream
	retired    atomic.Bool        // stopped on purpose: its end is no crash
	done       chan struct{}      // closed when its output stream ended
}

func newBackendSupervisor(cfg Config, router *PTYRouter, m *Metrics) *backendSupervisor {
	return &backendSupervisor{
		spec:     cfg.PTY.Spec,
		cfg:      cfg.PTY.BackendConfig,
		stateDir: cfg.StateDir,
		router:   router,
		metrics:  m,
		log:      cfg.Log,
		ops:      make(chan struct{}, 1),
		state:    stateStarting,
	}
}

func (s *backendSupervisor) acquire(ctx context.Context) error {
	select {
	case s.ops <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *backendSupervisor) release() { <-s.ops }

func (s *backendSupervisor) pluginsDir() string { return filepath.Join(s.stateDir, "plugins") }

func (s *backendSupervisor) recordPath() string { return recordPath(s.stateDir, s.spec.Name) }

// start reattaches to the plugin a previous host left running on the
// state dir, or starts a fresh one.
func (s *backendSupervisor) start(ctx context.Context) error {
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := os.MkdirAll(s.pluginsDir(), 0o700); err != nil {
		s.cancel()
		return fmt.Errorf("plugin %s: %w", s.spec.Name, err)
	}
	g := s.reattach(ctx)
	if g == nil {
		var err error
		if g, err = s.launch(); err != nil {
			s.cancel()
			return err
		}
	}
	if !s.activate(g) {
		s.cancel()
		return errStopping
	}
	return nil
}

// reattach looks for the record a previous host left, decides whether it
// names our live plugin (judgeRecord), and reattaches to it within
// reattachBudget: gRPC over the recorded socket, then Start with this
// host's configuration. It returns nil when there is nothing to reattach
// to; a stale record is removed (with its socket) first, never trusted.
func (s *backendSupervisor) reattach(ctx context.Context) *bgen {
	bctx, cancel := context.WithTimeout(ctx, reattachBudget)
	defer cancel()
	path := s.recordPath()
	rec, found, err := readRecord(path)
	if !found {
		if err != nil {
			s.log.Warn().Err(err).Str("plugin", s.spec.Name).Msg("reading the reattach record")
		}
		return nil
	}
	// Cleanup must finish even if the host is told to stop meanwhile.
	cleanupCtx := context.WithoutCancel(ctx)
	if err != nil {
		s.cleanupStale(cleanupCtx, path, rec, err.Error())
		return nil
	}
	if ok, reason := judgeRecord(rec, readProc(rec.Pid), identityFor(s.spec.Path)); !ok {
		s.cleanupStale(cleanupCtx, path, rec, reason)
		return nil
	}
	g, err := s.connect(bctx, rec)
	if err != nil {
		// It is our plugin (pid, start time and program match), but it
		// does not answer within the budget. That is no proof that it
		// died; but nobody can reach its PTYs any more, and a second
		// plugin beside it would only hide it: stop it, then start a
		// fresh one.
		s.log.Error().Err(err).Str("plugin", s.spec.Name).Int("pid", rec.Pid).
			Msg("recorded plugin is alive but does not answer; stopping it")
		stopRecorded(cleanupCtx, rec, identityFor(s.spec.Path), s.log)
		s.cleanupStale(cleanupCtx, path, rec, "unresponsive")
		return nil
	}
	return g
}

// cleanupStale removes a stale record and its socket.
func (s *backendSupervisor) cleanupStale(_ context.Context, path string, rec ReattachRecord, reason string) {
	s.log.Warn().Str("plugin", s.spec.Name).Int("pid", rec.Pid).Str("reason", reason).Str("record", path).
		Msg("stale reattach record removed; starting a fresh plugin")
	if err := removeRecord(path, rec); err != nil {
		s.log.Warn().Err(err).Str("plugin", s.spec.Name).Msg("removing the stale reattach record")
	}
}

// connect reattaches to the live plugin of rec.
func (s *backendSupervisor) connect(ctx context.Context, rec ReattachRecord) (*bgen, error) {
	proc, err := reattachPlugin(rec, s.spec.Name, contract.KindBackend)
	if err != nil {
		return nil, err
	}
	cfg := s.cfg
	cfg.Instance = contract.NewInstanceID()
	info, err := proc.be.Start(ctx, cfg)
	if err != nil {
		proc.release()
		return nil, fmt.Errorf("plugin %s: Start after reattach: %w", s.spec.Name, err)
	}
	// Writers of the previous host's sockets are still attached in the
	// plugin: detach them (a compare-and-swap on their identity, so a
	// client that reattached meanwhile is untouched) so their PTYs'
	// detached TTL runs again.
	ptys, err := proc.be.List(ctx)
	if err != nil {
		proc.release()
		return nil, fmt.Errorf("plugin %s: List after reattach: %w", s.spec.Name, err)
	}
	for _, p := range ptys {
		if !p.Writer.IsZero() {
			if err := proc.be.Detach(ctx, p.Token, p.Writer); err != nil && !errors.Is(err, contract.ErrStaleTransport) && !errors.Is(err, contract.ErrNotFound) {
				s.log.Debug().Err(err).Str("plugin", s.spec.Name).Msg("detaching a writer of the previous host")
			}
		}
	}
	g := s.newGen(proc, cfg.Instance, info.Version, rec)
	g.reattached = true
	if started, ok := procStartTime(rec.Started); ok {
		g.started = started
	}
	s.log.Info().Str("plugin", s.spec.Name).Str("instance", cfg.Instance).Int("pid", rec.Pid).
		Str("version", info.Version).Int("ptys", len(ptys)).Str("address", rec.Address).Msg("plugin reattached")
	return g, nil
}

// launch starts a fresh plugin process and writes its reattach record.
func (s *backendSupervisor) launch() (*bgen, error) {
	env := []string{EnvPluginStateDir + "=" + s.stateDir}
	if len(filepath.Join(s.pluginsDir(), "plugin0123456789")) <= maxSocketPath {
		// go-plugin's server makes its Unix socket there, in the 0700
		// state dir, instead of a temporary directory.
		env = append(env, plugin.EnvUnixSocketDir+"="+s.pluginsDir())
	} else {
		s.log.Warn().Str("dir", s.pluginsDir()).Msg("state dir too long for a Unix socket path; the plugin's socket goes to the temporary directory")
	}
	proc, err := startPlugin(s.spec, contract.KindBackend, procOptions{Env: env, Setsid: true}, s.log)
	if err != nil {
		return nil, err
	}
	cfg := s.cfg
	cfg.Instance = contract.NewInstanceID()
	sctx, cancel := context.WithTimeout(s.ctx, startRPCTimeout)
	defer cancel()
	info, err := proc.be.Start(sctx, cfg)
	if err != nil {
		proc.client.Kill()
		return nil, fmt.Errorf("plugin %s (%s): start: %w", s.spec.Name, s.spec.Path, err)
	}
	var rec ReattachRecord
	started, err := procStartTicks(proc.pid)
	if err == nil && proc.addr != nil {
		rec = ReattachRecord{Protocol: string(plugin.ProtocolGRPC), Network: proc.addr.Network(), Address: proc.addr.String(), Pid: proc.pid, Started: started}
		err = writeRecord(s.recordPath(), rec)
	}
	if err != nil {
		rec = ReattachRecord{}
		s.log.Warn().Err(err).Str("plugin", s.spec.Name).Msg("no reattach record: the PTY plugin stops with this host")
	}
	g := s.newGen(proc, cfg.Instance, info.Version, rec)
	s.log.Info().Str("plugin", s.spec.Name).Str("instance", cfg.Instance).Int("pid", proc.pid).
		Str("version", info.Version).Str("path", s.spec.Path).Msg("plugin started")
	return g, nil
}

func (s *backendSupervisor) newGen(proc *pluginProc, instance, version string, rec ReattachRecord) *bgen {
	g := &bgen{proc: proc, instance: instance, version: version, started: time.Now(), rec: rec, done: make(chan struct{})}
	g.ctx, g.cancel = context.WithCancel(s.ctx)
	return g
}

// activate makes g the serving backend and streams its output. Once
// stop has begun it stops g instead and reports false.
func (s *backendSupervisor) activate(g *bgen) bool {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		s.kill(g)
		return false
	}
	s.cur = g
	s.state = stateRunning
	s.wg.Add(1) // under mu: never after stop's Wait began
	s.mu.Unlock()
	go s.watch(g)
	s.router.SetBackend(g.proc.be)
	return true
}

// watch streams g's output into the router until the stream ends. An end
// nobody asked for means the plugin died (or its stream broke, and then
// it is killed): its PTYs are gone, their sockets are closed with 1012,
// and a fresh plugin is started after the backoff.
func (s *backendSupervisor) watch(g *bgen) {
	defer s.wg.Done()
	err := g.proc.be.Output(g.ctx, s.router.onOutput)
	close(g.done)
	if g.retired.Load() || g.ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	if s.cur != g {
		s.mu.Unlock()
		return
	}
	s.cur = nil
	s.state = stateRestarting
	s.restarts++
	s.lastErr = errText(err, "output stream ended")
	if time.Since(g.started) > backoffResetAfter {
		s.backoff = 0
	}
	s.mu.Unlock()
	s.router.SetBackend(nil)
	s.router.closeAll(contract.CloseServiceRestart, "pty backend restarting")
	s.metrics.PluginRestarts.WithLabelValues(s.spec.Name).Inc()
	s.log.Warn().Err(err).Str("plugin", s.spec.Name).Int("pid", g.proc.pid).Msg("pty backend ended; restarting")
	g.cancel()
	s.kill(g)
	s.restart()
}

// restart starts a fresh plugin after the backoff, until one starts or
// it became moot (stopped on purpose, host shutting down).
func (s *backendSupervisor) restart() {
	restartLoop(s.ctx, &s.mu, &s.backoff, s.acquire, s.release, func() bool {
		s.mu.Lock()
		moot := s.cur != nil || s.state == stateStopped || s.stopping
		s.mu.Unlock()
		if moot {
			return true
		}
		g, err := s.launch()
		if err != nil {
			s.mu.Lock()
			s.lastErr = err.Error()
			s.mu.Unlock()
			s.log.Error().Err(err).Str("plugin", s.spec.Name).Msg("restarting pty backend")
			return false
		}
		s.activate(g) // stops it if stop began meanwhile
		return true
	})
}

// kill stops g's process (gracefully first: the plugin then kills its
// PTYs' process groups) and removes its reattach record.
func (s *backendSupervisor) kill(g *bgen) {
	g.proc.client.Kill()
	if g.rec.Pid != 0 {
		if err := removeRecord(s.recordPath(), g.rec); err != nil {
			s.log.Warn().Err(err).Str("plugin", s.spec.Name).Msg("removing the reattach record")
		}
	}
}

// stopPTYs is `tether plugins stop pty`: it closes every PTY (their
// sockets get their last bytes and 4410), stops the plugin and removes
// its record. /api/pty then answers 1011 until `tether plugins reload
// pty` starts a fresh plugin; the next host starts a fresh one too.
func (s *backendSupervisor) stopPTYs(ctx context.Context) (PluginStatus, error) {
	if err := s.acquire(ctx); err != nil {
		return PluginStatus{}, err
	}
	defer s.release()
	s.mu.Lock()
	g := s.cur
	s.cur = nil
	s.state = stateStopped
	s.mu.Unlock()
	if g == nil {
		return s.status(), nil
	}
	g.retired.Store(true)
	n := 0
	if ptys, err := g.proc.be.List(ctx); err == nil {
		for _, p := range ptys {
			if err := g.proc.be.Close(ctx, p.Token); err == nil {
				n++
			}
		}
	}
	// Their exit markers come on the output stream, after their last
	// bytes; give them a moment to reach the sockets.
	s.router.waitIdle(ctx, time.Second)
	s.router.SetBackend(nil)
	g.cancel()
	<-g.done
	s.kill(g)
	s.router.closeAll(contract.CloseProcessExited, "pty plugin stopped")
	s.log.Info().Str("plugin", s.spec.Name).Int("pid", g.proc.pid).Int("ptys", n).Msg("pty plugin stopped on request")
	return s.status(), nil
}

// reload is `tether plugins reload pty`: it starts a fresh plugin when
// it is stopped. A running one holds the PTYs and is not swapped.
func (s *backendSupervisor) reload(ctx context.Context, spec *PluginSpec) (PluginStatus, error) {
	if err := s.acquire(ctx); err != nil {
		return PluginStatus{}, err
	}
	defer s.release()
	s.mu.Lock()
	running := s.cur != nil
	s.mu.Unlock()
	if running {
		return PluginStatus{}, fmt.Errorf("plugin %s is running and holds the PTYs; stop it first with `tether plugins stop %s`", s.spec.Name, s.spec.Name)
	}
	if spec != nil {
		s.mu.Lock()
		s.spec.Path, s.spec.Args, s.spec.SHA256 = spec.Path, spec.Args, spec.SHA256
		s.mu.Unlock()
	}
	g, err := s.launch()
	if err != nil {
		return PluginStatus{}, err
	}
	if !s.activate(g) {
		return PluginStatus{}, errStopping
	}
	return s.status(), nil
}

// stop ends the supervisor at host shutdown. With keep the plugin is left
// running for the next host (only the connection to it is closed: no
// Kill, which would shut it down); else it is stopped with its PTYs and
// its record removed.
func (s *backendSupervisor) stop(ctx context.Context, keep bool) {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	acquired := s.acquire(ctx) == nil
	s.mu.Lock()
	g := s.cur
	s.state = stateStopped
	s.mu.Unlock()
	s.router.SetBackend(nil)
	if g != nil {
		g.retired.Store(true)
	}
	s.cancel()
	s.wg.Wait()
	if acquired {
		s.release()
	}
	if g == nil {
		return
	}
	if keep && g.rec.Pid != 0 {
		g.proc.release()
		s.log.Info().Str("plugin", s.spec.Name).Int("pid", g.proc.pid).Str("record", s.recordPath()).
			Msg("pty plugin left running for the next host")
		return
	}
	s.kill(g)
	s.log.Info().Str("plugin", s.spec.Name).Int("pid", g.proc.pid).Msg("pty plugin stopped")
}

// reattachedNow reports whether the plugin serving now was reattached.
func (s *backendSupervisor) reattachedNow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur != nil && s.cur.reattached
}

// status describes the backend plugin for `tether plugins list`.
func (s *backendSupervisor) status() PluginStatus {
	s.mu.Lock()
	st := PluginStatus{
		Name:      s.spec.Name,
		Kind:      contract.KindBackend,
		State:     s.state,
		Restarts:  s.restarts,
		LastError: s.lastErr,
		Path:      s.spec.Path,
	}
	g := s.cur
	s.mu.Unlock()
	if g != nil {
		st.Pid = g.proc.pid
		st.Version = g.version
		st.Started = g.started
		st.Reattached = g.reattached
		st.Connections = s.router.connCount()
		st.PTYs = s.ptyCount()
	}
	return st
}

// ptyCount asks the backend how many PTYs are live (-1 when it cannot
// tell).
func (s *backendSupervisor) ptyCount() int {
	s.mu.Lock()
	g := s.cur
	s.mu.Unlock()
	if g == nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(g.ctx, time.Second)
	defer cancel()
	ptys, err := g.proc.be.List(ctx)
	if err != nil {
		return -1
	}
	return len(ptys)
}

// stopRecorded stops the plugin process rec names, after checking (again,
// right before each signal) that rec still names it: SIGTERM (the plugin
// kills its PTYs and exits), then SIGKILL after a second.
func stopRecorded(ctx context.Context, rec ReattachRecord, id pluginIdentity, log zerolog.Logger) bool {
	ours := func() bool { ok, _ := judgeRecord(rec, readProc(rec.Pid), id); return ok }
	if !ours() {
		return false
	}
	_ = syscall.Kill(rec.Pid, syscall.SIGTERM)
	// Poll for its exit: another process's end has no channel to wait on.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if !ours() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ours() {
		log.Warn().Int("pid", rec.Pid).Msg("plugin did not exit on SIGTERM; killing it")
		_ = syscall.Kill(rec.Pid, syscall.SIGKILL)
	}
	return true
}

// waitIdle waits, up to d, until no socket is routed to a PTY (their
// PTYs' exit markers closed them); it polls, since the sockets close on
// the output stream's goroutine.
func (r *PTYRouter) waitIdle(ctx context.Context, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil && r.connCount() > 0 {
		time.Sleep(10 * time.Millisecond)
	}
}

// connCount is the number of sockets attached (or attaching) to PTYs.
func (r *PTYRouter) connCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns)
}

// StopRecordedPlugin stops the plugin named name that a host left running
// on stateDir, when no host is running there to do it: it checks that the
// reattach record still names a live plugin process of this binary (the
// same check a starting host makes), stops it, and removes the record.
// It reports whether a plugin was stopped; a stale record is removed.
func StopRecordedPlugin(ctx context.Context, stateDir, name string, log zerolog.Logger) (pid int, stopped bool, err error) {
	path := recordPath(stateDir, name)
	rec, found, err := readRecord(path)
	if !found {
		return 0, false, err
	}
	if err != nil {
		return 0, false, errors.Join(err, removeRecord(path, rec))
	}
	id := identityFor("")
	if ok, _ := judgeRecord(rec, readProc(rec.Pid), id); !ok {
		return rec.Pid, false, removeRecord(path, rec)
	}
	stopped = stopRecorded(ctx, rec, id, log)
	return rec.Pid, stopped, removeRecord(path, rec)
}
