package supervise

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-plugin"

	"github.com/tether-agent/tether/contract"
)

// ErrNotifierDown: the notifier plugin is not running (restarting, or
// failed); the host's outbox retries the notification later.
var ErrNotifierDown = errors.New("notifier plugin not running")

// Notifier supervises one notifier plugin (--plugin notify:NAME=PATH):
// started with the host, restarted when it crashes or stops answering
// its health ping, like every plugin. Notify goes to the process serving
// now; while there is none it fails with ErrNotifierDown, and the
// outbox keeps the notification for a later attempt.
type Notifier struct {
	core
	spec PluginSpec
	opts Options
}

// ngen is one notifier process.
type ngen struct {
	genState
}

func (g *ngen) state() *genState { return &g.genState }

// serve waits for the process to exit (or the supervisor's end).
func (g *ngen) serve(ctx context.Context) error {
	select {
	case <-g.proc.nt.Exited():
		return errors.New("plugin exited")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// NewNotifier returns the supervisor of the notifier plugin spec.
func NewNotifier(opts Options, spec PluginSpec) *Notifier {
	n := &Notifier{spec: spec, opts: opts}
	n.core = core{
		name:           spec.Name,
		what:           "notify plugin",
		healthInterval: opts.HealthInterval,
		healthTimeout:  opts.HealthTimeout,
		metrics:        opts.Metrics,
		log:            opts.Log,
		launch:         func() (gen, error) { return n.launch() },
		crashed: func(g gen, _ error) {
			g.state().proc.client.Kill()
			g.state().proc.removeSocket()
		},
	}
	return n
}

// Name is the plugin's name.
func (n *Notifier) Name() string { return n.name }

func (n *Notifier) launch() (*ngen, error) {
	opts := procOptions{Env: []string{EnvPluginStateDir + "=" + n.opts.StateDir}, StartTimeout: n.opts.StartTimeout, Metrics: n.metrics,
		BinDir: filepath.Join(n.opts.StateDir, "plugins", "bin")}
	if n.opts.SocketDir != "" {
		opts.Env = append(opts.Env, plugin.EnvUnixSocketDir+"="+n.opts.SocketDir)
	}
	proc, err := startPlugin(n.spec, contract.KindNotify, opts, n.log)
	if err != nil {
		return nil, err
	}
	n.log.Debug().Str("plugin", n.name).Int("pid", proc.pid).Str("path", n.spec.Path).Msg("plugin started")
	return &ngen{genState: genState{proc: proc, started: time.Now(), done: make(chan struct{})}}, nil
}

// Start starts the plugin.
func (n *Notifier) Start(ctx context.Context) error {
	n.init(ctx)
	g, err := n.launch()
	if err != nil {
		n.cancel()
		return err
	}
	if !n.activate(g) {
		g.proc.client.Kill()
		n.cancel()
		return ErrStopping
	}
	return nil
}

// Notify sends one notification through the process serving now.
func (n *Notifier) Notify(ctx context.Context, id string, body []byte) (string, error) {
	g, _ := n.current().(*ngen)
	if g == nil {
		return "", fmt.Errorf("plugin %s: %w", n.name, ErrNotifierDown)
	}
	return g.proc.nt.Notify(ctx, id, body)
}

// Status is the plugin's status, as tether plugins would list it.
func (n *Notifier) Status() PluginStatus {
	st, _ := n.statusBase(contract.KindNotify, n.spec.Path)
	return st
}

// Stop stops the plugin for good.
func (n *Notifier) Stop(ctx context.Context) {
	n.mu.Lock()
	n.stopping = true
	n.mu.Unlock()
	acquired := n.acquire(ctx) == nil
	n.mu.Lock()
	g, _ := n.cur.(*ngen)
	n.core.state = stateStopped
	n.cur = nil
	n.mu.Unlock()
	if g != nil {
		g.retired.Store(true)
	}
	n.finish()
	if acquired {
		n.release()
	}
	if g != nil {
		g.proc.client.Kill()
		g.proc.removeSocket()
	}
}
