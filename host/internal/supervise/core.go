package supervise

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/metrics"
)

// Plugin states, as `tether plugins list` shows them.
const (
	stateStarting   = "starting"
	stateRunning    = "running"
	stateRestarting = "restarting" // died; waiting for the next attempt
	stateStopped    = "stopped"
	// stateFailed: a plugin that failed its restart limit times in a row
	// (crashed soon after starting, or failed to start) is not restarted
	// again until it is reloaded.
	stateFailed = "failed"
)

// Restart backoff: the first restart of a crashed plugin is tried at once,
// the next after backoffMin, each further one doubles the wait up to
// backoffMax, and a plugin that ran for backoffResetAfter starts over.
const (
	backoffMin        = 100 * time.Millisecond
	backoffMax        = 5 * time.Second
	backoffResetAfter = time.Minute
)

// startRPCTimeout bounds a plugin's Start call.
const startRPCTimeout = 10 * time.Second

// ErrStopping: the host is shutting down; no plugin is started or swapped.
var ErrStopping = errors.New("host shutting down")

// gen is one plugin process a supervisor serves, started or reattached.
type gen interface {
	// serve runs the process's link or output stream until it ends (the
	// process died, or ctx is done, or it was retired).
	serve(ctx context.Context) error
	// state is what every process has.
	state() *genState
}

// genState is the part of a process the loop reads.
type genState struct {
	proc    *pluginProc
	version string
	started time.Time
	retired atomic.Bool   // stopped or swapped out on purpose: its end is no crash
	done    chan struct{} // closed once serve returned (and the strategy cleaned up)
	// unresponsive: the health check killed it for not answering.
	unresponsive atomic.Bool
}

// Restart reasons, the reason label of tether_plugin_restarts_total and
// PluginStatus.LastReason.
const (
	// ReasonCrashed: the process exited or its connection broke.
	ReasonCrashed = "crashed"
	// ReasonUnresponsive: the process was alive but did not answer the
	// health ping in time, so it was killed.
	ReasonUnresponsive = "unresponsive"
)

// core is the one supervisor loop both kinds of plugin run under: it
// activates a process, serves it on a watch goroutine, and when it ends
// unasked counts the crash and restarts a fresh process after a capped
// exponential backoff, until limit failures in a row (if limit > 0) mark
// it failed. What differs per kind — how a process starts, what its
// crash tears down, what it serves — is in the callbacks.
type core struct {
	name    string
	what    string // "transport plugin", "pty backend": for logs
	limit   int    // failures in a row that make it failed; 0: never
	metrics *metrics.Metrics
	log     zerolog.Logger
	// launch starts a fresh process (not yet active).
	launch func() (gen, error)
	// activated runs when g becomes the serving process.
	activated func(g gen)
	// crashed runs after g ended unasked, before the restart: it tears
	// down what g served and stops its process for good.
	crashed func(g gen, err error)
	// failed, if set, runs once the plugin is marked failed.
	failed func(lastErr string)
	// pinged, if set, runs after each health ping g answered.
	pinged func(ctx context.Context, g gen)
	// healthInterval and healthTimeout: every healthInterval the serving
	// process is pinged; one that does not answer within healthTimeout
	// is killed and restarted. A zero interval pings never.
	healthInterval, healthTimeout time.Duration

	ctx    context.Context // the supervisor's life; ends every serve
	cancel context.CancelFunc
	wg     sync.WaitGroup // watch goroutines (and the restarts they run)
	ops    chan struct{}  // one launch, swap or stop at a time

	mu         sync.Mutex // guards the fields below
	stopping   bool       // stop has begun: nothing is activated any more
	cur        gen        // the process serving; nil while restarting or stopped
	state      string
	restarts   int
	streak     int // failures in a row: crashes of short-lived processes and failed starts
	lastErr    string
	lastReason string
	backoff    time.Duration
}

func (c *core) init(ctx context.Context) {
	c.ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	c.ops = make(chan struct{}, 1)
	c.state = stateStarting
	for _, r := range []string{ReasonCrashed, ReasonUnresponsive} {
		c.metrics.PluginRestarts.WithLabelValues(c.name, r) // exists from the start, at 0
	}
}

func (c *core) acquire(ctx context.Context) error {
	select {
	case c.ops <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *core) release() { <-c.ops }

// activate makes g the serving process and watches it. Once stop has
// begun it reports false and the caller stops g.
func (c *core) activate(g gen) bool {
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		return false
	}
	c.cur = g
	c.state = stateRunning
	c.wg.Add(1) // under mu: never after stop's Wait began
	health := c.healthInterval > 0
	if health {
		c.wg.Add(1)
	}
	c.mu.Unlock()
	if c.activated != nil {
		c.activated(g)
	}
	go c.watch(g)
	if health {
		go c.health(g)
	}
	return true
}

// health pings g every healthInterval until it ends. A process that is
// alive but does not answer within healthTimeout (stopped, deadlocked,
// swapped out of memory) is killed: its serve then ends, and watch
// restarts it like a crashed one, with reason unresponsive. A ping that
// fails at once (the connection broke) proves nothing the serve will not
// tell on its own.
func (c *core) health(g gen) {
	defer c.wg.Done()
	st := g.state()
	tick := time.NewTicker(c.healthInterval)
	defer tick.Stop()
	for {
		select {
		case <-st.done:
			return
		case <-c.ctx.Done():
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.healthTimeout)
		err := pingPlugin(ctx, st.proc)
		timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded)
		if err == nil && c.pinged != nil {
			c.pinged(ctx, g)
		}
		cancel()
		if err == nil || !timedOut || st.retired.Load() {
			continue
		}
		st.unresponsive.Store(true)
		c.log.Error().Str("plugin", c.name).Int("pid", st.proc.pid).Str("timeout", c.healthTimeout.String()).
			Msg(c.what + " did not answer its health ping in time; killing it to restart it")
		st.proc.killNow()
		return
	}
}

// current returns the serving process, or nil.
func (c *core) current() gen {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// isStopping reports whether stop has begun.
func (c *core) isStopping() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopping
}

// watch serves g until it ends. An end nobody asked for is a crash: it
// is counted, torn down (crashed) and a fresh process started after the
// backoff — unless that makes the failures in a row reach the limit.
func (c *core) watch(g gen) {
	defer c.wg.Done()
	st := g.state()
	err := g.serve(c.ctx)
	if st.proc.logw != nil {
		defer st.proc.logw.close()
	}
	if st.retired.Load() || c.ctx.Err() != nil {
		close(st.done)
		return
	}
	c.mu.Lock()
	if c.cur != g || c.stopping { // replaced by a swap, or shutting down
		c.mu.Unlock()
		close(st.done)
		return
	}
	c.cur = nil
	c.restarts++
	reason := ReasonCrashed
	c.lastErr = errText(err, "plugin exited")
	if st.unresponsive.Load() {
		reason = ReasonUnresponsive
		c.lastErr = fmt.Sprintf("unresponsive: no answer to the health ping within %s (killed)", c.healthTimeout)
	}
	c.lastReason = reason
	if time.Since(st.started) > backoffResetAfter {
		c.backoff, c.streak = 0, 0
	}
	failed := c.failedLocked()
	c.mu.Unlock()
	c.metrics.PluginRestarts.WithLabelValues(c.name, reason).Inc()
	if c.crashed != nil {
		c.crashed(g, err)
	}
	close(st.done)
	if failed {
		c.log.Error().Err(err).Str("plugin", c.name).Int("pid", st.proc.pid).Int("in_a_row", c.limit).
			Msg(c.what + " keeps failing; marked failed, not restarted (tether plugins reload to try again)")
		c.markedFailed()
		return
	}
	c.log.Warn().Err(err).Str("plugin", c.name).Int("pid", st.proc.pid).Msg(c.what + " ended; restarting")
	c.restart()
}

// failedLocked counts one more failure in a row and reports whether that
// makes the plugin failed (it is then marked so, and not restarted);
// else it is marked restarting.
func (c *core) failedLocked() bool {
	c.streak++
	if c.limit > 0 && c.streak >= c.limit {
		c.state = stateFailed
		c.lastErr = fmt.Sprintf("%s (failed %d times in a row; not restarted until reloaded)", c.lastErr, c.streak)
		return true
	}
	c.state = stateRestarting
	return false
}

// restart starts a new process after the backoff, until one starts or
// something else (a swap, a stop, the host's shutdown) made it moot.
func (c *core) restart() {
	for {
		c.mu.Lock()
		d := c.backoff
		c.backoff = min(max(2*d, backoffMin), backoffMax)
		c.mu.Unlock()
		t := time.NewTimer(d)
		select {
		case <-c.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if c.acquire(c.ctx) != nil {
			return
		}
		done := c.tryRestart()
		c.release()
		if done {
			return
		}
	}
}

// tryRestart makes one restart attempt; it reports whether the restart
// loop is done (started, moot, or failed for good).
func (c *core) tryRestart() bool {
	c.mu.Lock()
	moot := c.cur != nil || c.stopping || c.state == stateStopped
	c.mu.Unlock()
	if moot {
		return true
	}
	g, err := c.launch()
	if err != nil {
		c.mu.Lock()
		c.lastErr = err.Error()
		failed := c.failedLocked()
		c.mu.Unlock()
		c.log.Error().Err(err).Str("plugin", c.name).Bool("failed", failed).Msg("restarting " + c.what)
		if failed {
			c.markedFailed()
		}
		return failed
	}
	if !c.activate(g) {
		g.state().proc.client.Kill() // stop began meanwhile
	}
	return true
}

// markedFailed tells failed that the plugin was marked failed.
func (c *core) markedFailed() {
	if c.failed == nil {
		return
	}
	c.mu.Lock()
	last := c.lastErr
	c.mu.Unlock()
	c.failed(last)
}

// finish cancels the supervisor's life and waits for its watches.
func (c *core) finish() {
	c.cancel()
	c.wg.Wait()
}

// statusBase fills the fields every plugin's status has.
func (c *core) statusBase(kind, path string) (PluginStatus, gen) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := PluginStatus{
		Name:       c.name,
		Kind:       kind,
		State:      c.state,
		Restarts:   c.restarts,
		LastError:  c.lastErr,
		LastReason: c.lastReason,
		Path:       path,
	}
	if c.cur != nil {
		s := c.cur.state()
		st.Pid = s.proc.pid
		st.Version = s.version
		st.Started = s.started
	}
	return st, c.cur
}

// errText is err's text, or def for nil.
func errText(err error, def string) string {
	if err == nil {
		return def
	}
	return err.Error()
}
