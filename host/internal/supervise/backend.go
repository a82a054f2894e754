package supervise

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/ptyroute"
)

var (
	// errNotProven: a recorded plugin did not prove its instance secret.
	errNotProven = errors.New("instance secret not proven")
	// ErrNotServing: the PTY backend plugin is stopped or restarting, so
	// there is nothing to ask.
	ErrNotServing = errors.New("not serving (stopped or restarting)")
)

// MaxSocketPath is the longest Unix socket path this host creates (the
// kernel's limit is 108 bytes with the terminating NUL; BSDs have 104).
const MaxSocketPath = 103

// Backend runs the PTY backend plugin on the one loop so that it
// outlives the host: it starts it in a session of its own, with its gRPC
// socket in <state-dir>/plugins and a reattach record next to it; a host
// starting on the same state dir reattaches to it. It streams the
// plugin's output into the router, restarts it with capped backoff when
// it dies (its PTYs die with it: their sockets are closed with 1012 and
// reattach to fresh PTYs, with reset replays), and at shutdown leaves it
// running unless told to stop it.
type Backend struct {
	core
	cfg       contract.BackendConfig
	stateDir  string
	socketDir string
	router    *ptyroute.Router

	// spec is the binary a fresh process runs; guarded by core.mu.
	spec PluginSpec

	rebuilds rebuildCount
}

// rebuildCount makes the plugins' screen rebuild counts one count that
// never decreases: a plugin's count starts at 0 with its process, so the
// last one seen of each earlier process is kept.
type rebuildCount struct {
	mu       sync.Mutex // guards the fields below
	instance string     // the plugin process the count is of
	last     int64      // its count as last seen
	before   int64      // the last counts of the earlier processes
}

// seen takes plugin instance's count n and returns the total.
func (c *rebuildCount) seen(instance string, n int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if instance != c.instance {
		c.before += c.last
		c.instance, c.last = instance, 0
	}
	c.last = max(c.last, n)
	return c.before + c.last
}

// total returns the total without a new count.
func (c *rebuildCount) total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.before + c.last
}

// bgen is one backend plugin process, started or reattached.
type bgen struct {
	genState
	instance   string
	reattached bool
	rec        ReattachRecord // zero when none could be written
	ctx        context.Context
	cancel     context.CancelFunc // ends its output stream
	sink       contract.OutputSink
}

func (g *bgen) state() *genState { return &g.genState }

// NewBackend returns the supervisor of the PTY backend spec, configured
// with cfg, routing through router.
func NewBackend(opts Options, spec PluginSpec, cfg contract.BackendConfig, router *ptyroute.Router) *Backend {
	b := &Backend{cfg: cfg, stateDir: opts.StateDir, socketDir: opts.SocketDir, router: router, spec: spec}
	b.core = core{
		name: spec.Name,
		what: "pty backend",

		healthInterval: opts.HealthInterval,
		healthTimeout:  opts.HealthTimeout,
		metrics:        opts.Metrics,
		log:            opts.Log,
		launch:         func() (gen, error) { return b.launch() },
		activated:      func(g gen) { b.router.SetBackend(g.(*bgen).proc.be) },
		crashed: func(g gen, err error) {
			// Its PTYs are gone: their sockets reattach to fresh ones.
			bg := g.(*bgen)
			b.router.SetBackend(nil)
			b.router.CloseAll(contract.CloseServiceRestart, "pty backend restarting")
			bg.cancel()
			b.kill(bg)
		},
	}
	return b
}

// Name is the backend's plugin name.
func (b *Backend) Name() string { return b.name }

// serve streams g's output into the router until the stream ends. An end
// nobody asked for means the plugin died (or its stream broke, and then
// it is killed).
func (g *bgen) serve(context.Context) error {
	return g.proc.be.Output(g.ctx, g.sink)
}

func (b *Backend) pluginsDir() string { return filepath.Join(b.stateDir, "plugins") }

func (b *Backend) recordPath() string { return recordPath(b.stateDir, b.name) }

// Start reattaches to the plugin a previous host left running on the
// state dir, or starts a fresh one.
func (b *Backend) Start(ctx context.Context) error {
	b.init(ctx)
	if err := os.MkdirAll(b.pluginsDir(), 0o700); err != nil {
		b.cancel()
		return fmt.Errorf("plugin %s: %w", b.name, err)
	}
	g := b.reattach(ctx)
	if g == nil {
		var err error
		if g, err = b.launch(); err != nil {
			b.cancel()
			return err
		}
	}
	if !b.activate(g) {
		b.kill(g)
		b.cancel()
		return ErrStopping
	}
	return nil
}

// reattach looks for the record a previous host left, decides whether it
// names our live plugin (judgeRecord), and reattaches to it within
// reattachBudget: gRPC over the recorded socket, then Start with this
// host's configuration. It returns nil when there is nothing to reattach
// to; a stale record is removed (with its socket) first, never trusted.
func (b *Backend) reattach(ctx context.Context) *bgen {
	bctx, cancel := context.WithTimeout(ctx, reattachBudget)
	defer cancel()
	path := b.recordPath()
	rec, found, err := readRecord(path)
	if !found {
		if err != nil {
			b.log.Warn().Err(err).Str("plugin", b.name).Msg("reading the reattach record")
		}
		return nil
	}
	// Cleanup must finish even if the host is told to stop meanwhile.
	cleanupCtx := context.WithoutCancel(ctx)
	if err != nil {
		b.cleanupStale(cleanupCtx, path, rec, err.Error())
		return nil
	}
	if ok, reason := judgeRecord(rec, readProc(rec.Pid)); !ok {
		b.cleanupStale(cleanupCtx, path, rec, reason)
		return nil
	}
	g, err := b.connect(bctx, rec)
	if err != nil {
		// It is the process the record names (pid and start time match),
		// but it does not answer within the budget, or cannot prove the
		// record's secret (a plugin of another tether version, or one
		// whose record has no secret). Nobody can reach its PTYs any
		// more, and a second plugin beside it would only hide it: stop
		// it, its PTYs with it, then start a fresh one.
		b.log.Error().Err(err).Str("plugin", b.name).Int("pid", rec.Pid).
			Msg("the recorded plugin is alive but cannot be reattached; stopping it and its PTYs")
		if !stopRecorded(cleanupCtx, rec, b.log) {
			b.log.Warn().Str("plugin", b.name).Int("pid", rec.Pid).Msg("the recorded plugin was gone before it could be stopped")
		}
		b.cleanupStale(cleanupCtx, path, rec, "cannot be reattached")
		return nil
	}
	return g
}

// cleanupStale removes a stale record and its socket.
func (b *Backend) cleanupStale(_ context.Context, path string, rec ReattachRecord, reason string) {
	b.log.Warn().Str("plugin", b.name).Int("pid", rec.Pid).Str("reason", reason).Str("record", path).
		Msg("stale reattach record removed; starting a fresh plugin")
	if err := removeRecord(path, rec, b.socketDir); err != nil {
		b.log.Warn().Err(err).Str("plugin", b.name).Msg("removing the stale reattach record")
	}
}

// connect reattaches to the live plugin of rec.
func (b *Backend) connect(ctx context.Context, rec ReattachRecord) (*bgen, error) {
	proc, err := reattachPlugin(rec, b.name, contract.KindBackend)
	if err != nil {
		return nil, err
	}
	cfg := b.cfg
	cfg.Instance = contract.NewInstanceID()
	cfg.Challenge = contract.RandomHex(16)
	info, err := proc.be.Start(ctx, cfg)
	if err != nil {
		proc.release()
		return nil, fmt.Errorf("plugin %s: Start after reattach: %w", b.name, err)
	}
	if rec.Secret == "" || !hmac.Equal([]byte(info.Proof), []byte(contract.Prove(rec.Secret, cfg.Challenge))) {
		proc.release()
		return nil, fmt.Errorf("plugin %s: pid %d did not prove the record's instance secret (another tether version, or an older record): %w", b.name, rec.Pid, errNotProven)
	}
	// Writers of the previous host's sockets are still attached in the
	// plugin: detach them (a compare-and-swap on their identity, so a
	// client that reattached meanwhile is untouched) so their PTYs'
	// detached TTL runs again.
	ptys, err := proc.be.List(ctx)
	if err != nil {
		proc.release()
		return nil, fmt.Errorf("plugin %s: List after reattach: %w", b.name, err)
	}
	for _, p := range ptys {
		if !p.Writer.IsZero() {
			if err := proc.be.Detach(ctx, p.Token, p.Writer); err != nil && !errors.Is(err, contract.ErrStaleTransport) && !errors.Is(err, contract.ErrNotFound) {
				b.log.Debug().Err(err).Str("plugin", b.name).Msg("detaching a writer of the previous host")
			}
		}
	}
	g := b.newGen(proc, cfg.Instance, info.Version, rec)
	g.reattached = true
	if started, ok := procStartTime(rec.Started); ok {
		g.started = started
	}
	b.log.Info().Str("plugin", b.name).Str("instance", cfg.Instance).Int("pid", rec.Pid).
		Str("version", info.Version).Int("ptys", len(ptys)).Str("address", rec.Address).Msg("plugin reattached")
	return g, nil
}

// envScreenModel is the PTY plugin's switch for its screen models
// (plugins/pty New; "off" for benchmarks only), passed on from the
// host's environment.
const envScreenModel = "TETHER_PTY_SCREEN_MODEL"

// launch starts a fresh plugin process and writes its reattach record.
func (b *Backend) launch() (*bgen, error) {
	env := []string{EnvPluginStateDir + "=" + b.stateDir}
	if b.socketDir != "" {
		// go-plugin's server makes its Unix socket there (0700), not in
		// a temporary directory.
		env = append(env, plugin.EnvUnixSocketDir+"="+b.socketDir)
	}
	secret := contract.RandomHex(32)
	env = append(env, contract.EnvPluginSecret+"="+secret)
	if v, ok := os.LookupEnv(envScreenModel); ok {
		env = append(env, envScreenModel+"="+v) // a TETHER_ variable: passed on by name
	}
	proc, err := startPlugin(b.spec, contract.KindBackend, procOptions{Env: env, Setsid: true, Metrics: b.metrics, BinDir: filepath.Join(b.stateDir, "plugins", "bin")}, b.log)
	if err != nil {
		return nil, err
	}
	cfg := b.cfg
	cfg.Instance = contract.NewInstanceID()
	sctx, cancel := context.WithTimeout(b.ctx, startRPCTimeout)
	defer cancel()
	info, err := proc.be.Start(sctx, cfg)
	if err != nil {
		proc.client.Kill()
		return nil, fmt.Errorf("plugin %s (%s): start: %w", b.name, b.spec.Path, err)
	}
	var rec ReattachRecord
	started, err := procStartTicks(proc.pid)
	if err == nil && proc.addr != nil {
		rec = ReattachRecord{Protocol: string(plugin.ProtocolGRPC), Network: proc.addr.Network(), Address: proc.addr.String(), Pid: proc.pid, Started: started, Secret: secret, Argv: proc.argv}
		err = writeRecord(b.recordPath(), rec)
	}
	if err != nil {
		rec = ReattachRecord{}
		b.log.Warn().Err(err).Str("plugin", b.name).Msg("no reattach record: the PTY plugin stops with this host")
	}
	g := b.newGen(proc, cfg.Instance, info.Version, rec)
	b.log.Info().Str("plugin", b.name).Str("instance", cfg.Instance).Int("pid", proc.pid).
		Str("version", info.Version).Str("path", b.spec.Path).Msg("plugin started")
	return g, nil
}

func (b *Backend) newGen(proc *pluginProc, instance, version string, rec ReattachRecord) *bgen {
	g := &bgen{
		genState: genState{proc: proc, version: version, started: time.Now(), done: make(chan struct{})},
		instance: instance,
		rec:      rec,
		sink:     b.router.OnOutput,
	}
	g.ctx, g.cancel = context.WithCancel(b.ctx)
	return g
}

// kill stops g's process (gracefully first: the plugin then kills its
// PTYs' process groups) and removes its reattach record.
func (b *Backend) kill(g *bgen) {
	g.proc.client.Kill()
	if g.rec.Pid != 0 {
		if err := removeRecord(b.recordPath(), g.rec, b.socketDir); err != nil {
			b.log.Warn().Err(err).Str("plugin", b.name).Msg("removing the reattach record")
		}
	}
}

// current is the serving process, or nil.
func (b *Backend) currentGen() *bgen {
	g, _ := b.current().(*bgen)
	return g
}

// StopPTYs is `tether plugins stop pty`: it closes every PTY (their
// sockets get their last bytes and 4410), stops the plugin and removes
// its record. /api/pty then answers 1011 until `tether plugins reload
// pty` starts a fresh plugin; the next host starts a fresh one too.
func (b *Backend) StopPTYs(ctx context.Context) (PluginStatus, error) {
	if err := b.acquire(ctx); err != nil {
		return PluginStatus{}, err
	}
	defer b.release()
	b.mu.Lock()
	g, _ := b.cur.(*bgen)
	b.cur = nil
	b.core.state = stateStopped
	b.mu.Unlock()
	if g == nil {
		return b.Status(), nil
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
	b.router.WaitIdle(ctx, time.Second)
	b.router.SetBackend(nil)
	g.cancel()
	<-g.done
	b.kill(g)
	b.router.CloseAll(contract.CloseProcessExited, "pty plugin stopped")
	b.log.Info().Str("plugin", b.name).Int("pid", g.proc.pid).Int("ptys", n).Msg("pty plugin stopped on request")
	return b.Status(), nil
}

// Reload is `tether plugins reload pty`: it starts a fresh plugin when
// it is stopped. A running one holds the PTYs and is not swapped.
func (b *Backend) Reload(ctx context.Context, spec *PluginSpec) (PluginStatus, error) {
	if err := b.acquire(ctx); err != nil {
		return PluginStatus{}, err
	}
	defer b.release()
	b.mu.Lock()
	running := b.cur != nil
	b.mu.Unlock()
	if running {
		return PluginStatus{}, fmt.Errorf("plugin %s is running and holds the PTYs; stop it first with `tether plugins stop %s`", b.name, b.name)
	}
	if spec != nil {
		b.mu.Lock()
		b.spec.Path, b.spec.Args, b.spec.SHA256 = spec.Path, spec.Args, spec.SHA256
		b.mu.Unlock()
	}
	g, err := b.launch()
	if err != nil {
		return PluginStatus{}, err
	}
	if !b.activate(g) {
		b.kill(g)
		return PluginStatus{}, ErrStopping
	}
	return b.Status(), nil
}

// Stop ends the supervisor at host shutdown. With keep the plugin is left
// running for the next host (only the connection to it is closed: no
// Kill, which would shut it down); else it is stopped with its PTYs and
// its record removed.
func (b *Backend) Stop(ctx context.Context, keep bool) {
	b.mu.Lock()
	b.stopping = true
	b.mu.Unlock()
	acquired := b.acquire(ctx) == nil
	b.mu.Lock()
	g, _ := b.cur.(*bgen)
	b.core.state = stateStopped
	b.mu.Unlock()
	b.router.SetBackend(nil)
	if g != nil {
		g.retired.Store(true)
	}
	b.finish()
	if acquired {
		b.release()
	}
	if g == nil {
		return
	}
	if keep && g.rec.Pid != 0 {
		g.proc.release()
		b.log.Info().Str("plugin", b.name).Int("pid", g.proc.pid).Str("record", b.recordPath()).
			Msg("pty plugin left running for the next host")
		return
	}
	b.kill(g)
	b.log.Info().Str("plugin", b.name).Int("pid", g.proc.pid).Msg("pty plugin stopped")
}

// ReattachedNow reports whether the plugin serving now was reattached.
func (b *Backend) ReattachedNow() bool {
	g := b.currentGen()
	return g != nil && g.reattached
}

// Status describes the backend plugin for `tether plugins list`.
func (b *Backend) Status() PluginStatus {
	b.mu.Lock()
	path := b.spec.Path
	b.mu.Unlock()
	st, cur := b.statusBase(contract.KindBackend, path)
	if g, _ := cur.(*bgen); g != nil {
		st.Reattached = g.reattached
		st.Connections = b.router.ConnCount()
		st.PTYs = b.Stats().PTYs
	}
	return st
}

// List describes every PTY of the serving plugin (`tether ptys`); it
// fails when no plugin serves (stopped, or restarting).
func (b *Backend) List(ctx context.Context) ([]contract.PTYInfo, error) {
	g := b.currentGen()
	if g == nil {
		return nil, fmt.Errorf("plugin %s: %w", b.name, ErrNotServing)
	}
	return g.proc.be.List(ctx)
}

// Stats asks the backend how many PTYs are live (-1 when it cannot
// tell) and how often the screen models of its PTYs, gone ones included,
// were rebuilt (over every plugin process this host has run).
func (b *Backend) Stats() metrics.PTYStats {
	g := b.currentGen()
	if g == nil {
		return metrics.PTYStats{ScreenRebuilds: b.rebuilds.total()}
	}
	ctx, cancel := context.WithTimeout(g.ctx, time.Second)
	defer cancel()
	ptys, err := g.proc.be.List(ctx)
	if err != nil {
		return metrics.PTYStats{PTYs: -1, ScreenRebuilds: b.rebuilds.total()}
	}
	n, err := g.proc.be.ScreenRebuilds(ctx)
	if err != nil {
		return metrics.PTYStats{PTYs: len(ptys), ScreenRebuilds: b.rebuilds.total()}
	}
	return metrics.PTYStats{PTYs: len(ptys), ScreenRebuilds: b.rebuilds.seen(g.instance, n)}
}

// stopRecorded stops the plugin process rec names, after checking (again,
// right before each signal) that rec still names it: SIGTERM (the plugin
// kills its PTYs and exits), then SIGKILL after a second.
func stopRecorded(ctx context.Context, rec ReattachRecord, log zerolog.Logger) bool {
	ours := func() bool { ok, _ := judgeRecord(rec, readProc(rec.Pid)); return ok }
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

// StopRecordedPlugin stops the plugin named name that a host left running
// on stateDir, when no host is running there to do it: it checks that the
// reattach record still names the live process it recorded (its pid and
// start time: the check a starting host makes), stops it, and removes the
// record once the process is gone (never while it lives).
// It reports whether a plugin was stopped; a stale record is removed.
func StopRecordedPlugin(ctx context.Context, stateDir, sockDir, name string, log zerolog.Logger) (pid int, stopped bool, err error) {
	path := recordPath(stateDir, name)
	rec, found, err := readRecord(path)
	if !found {
		return 0, false, err
	}
	if err != nil {
		return 0, false, errors.Join(err, removeRecord(path, rec, sockDir))
	}
	if ok, _ := judgeRecord(rec, readProc(rec.Pid)); !ok {
		return rec.Pid, false, removeRecord(path, rec, sockDir)
	}
	stopped = stopRecorded(ctx, rec, log)
	// The record of a plugin that is still alive (it did not stop in
	// time) stays: it is the only way to find it.
	if alive, _ := judgeRecord(rec, readProc(rec.Pid)); alive {
		return rec.Pid, false, fmt.Errorf("plugin %s (pid %d) did not stop; its record %s is kept", name, rec.Pid, path)
	}
	return rec.Pid, stopped, removeRecord(path, rec, sockDir)
}
