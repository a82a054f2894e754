package supervise

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/ptyroute"
	"github.com/tether-agent/tether/wire"
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
			b.router.CloseAll(wire.CloseServiceRestart, "pty backend restarting")
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
