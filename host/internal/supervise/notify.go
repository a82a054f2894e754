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
	spec PluginSpec // guarded by mu (set by Reload)
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
	n.mu.Lock()
	spec := n.spec
	n.mu.Unlock()
	proc, err := startPlugin(spec, contract.KindNotify, opts, n.log)
	if err != nil {
		return nil, err
	}
	n.log.Debug().Str("plugin", n.name).Int("pid", proc.pid).Str("path", spec.Path).Msg("plugin started")
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

// Reload (`tether plugins reload NAME`) starts a fresh process (of spec
// when given, else the current binary), makes it the one notifications
// go to, and kills the old one; a notification the old one was sending
// fails and the outbox sends it again. It also brings back a plugin
// marked failed. If the new process fails to start, the old one keeps
// serving and the error is returned.
func (n *Notifier) Reload(ctx context.Context, spec *PluginSpec) (PluginStatus, error) {
	if err := n.acquire(ctx); err != nil {
		return PluginStatus{}, err
	}
	defer n.release()
	if n.isStopping() {
		return PluginStatus{}, ErrStopping
	}
	n.mu.Lock()
	prev := n.spec
	if spec != nil {
		n.spec = *spec
		n.spec.Name = n.name
	}
	n.mu.Unlock()
	g, err := n.launch()
	n.mu.Lock()
	if err != nil {
		n.spec = prev
		n.mu.Unlock()
		return PluginStatus{}, err
	}
	old, _ := n.cur.(*ngen)
	n.streak, n.backoff = 0, 0 // a reload gives a failed plugin a fresh start
	n.mu.Unlock()
	if old != nil {
		old.retired.Store(true) // its end is no crash
	}
	if !n.activate(g) {
		g.proc.client.Kill()
		return PluginStatus{}, ErrStopping
	}
	n.metrics.PluginReloads.WithLabelValues(n.name).Inc()
	if old != nil {
		old.proc.client.Kill()
		old.proc.removeSocket()
	}
	n.log.Info().Str("plugin", n.name).Int("pid", g.proc.pid).Msg("notify plugin swapped")
	return n.Status(), nil
}

// Status is the plugin's status, as tether plugins would list it.
func (n *Notifier) Status() PluginStatus {
	n.mu.Lock()
	path := n.spec.Path
	n.mu.Unlock()
	st, _ := n.statusBase(contract.KindNotify, path)
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
