package host

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

// Plugin states, as `tether plugins list` shows them.
const (
	stateStarting   = "starting"
	stateRunning    = "running"
	stateRestarting = "restarting" // died; waiting for the next attempt
	stateStopped    = "stopped"
	// stateFailed: a transport that failed RestartLimit times in a row
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

// Timeouts of plugin operations.
const (
	// startRPCTimeout bounds a plugin's Start call.
	startRPCTimeout = 10 * time.Second
	// retireTimeout bounds stopping a swapped-out transport: its Stop
	// (close grace of its sockets included) and its exit.
	retireTimeout = 5 * time.Second
)

// errStopping: the host is shutting down; no plugin is started or swapped.
var errStopping = errors.New("host shutting down")

// listenFD is the Listen value of every transport the host starts on its
// own listener: inherited as fd 3 (the first of exec.Cmd.ExtraFiles).
const listenFD = "fd:3"

// hostListens reports whether the host binds --listen itself: a TCP
// host:port with a numeric port. Anything else ("unix:PATH" for a
// transport that speaks over a Unix socket, say) is passed to the
// transport as it is, and the transport binds it.
func hostListens(listen string) bool {
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

// supervisor runs one transport plugin under its name. For a TCP listen
// address the listener is the host's: every plugin process the supervisor
// starts inherits a duplicate of it and accepts on it, so the port stays
// bound and connections queue in its backlog while a crashed plugin is
// restarted, and two processes accept side by side during a swap. (Any
// other address is the transport's to bind; a swap then needs the new
// process to bind beside the old one.) It links each process, restarts a
// crashed one with capped exponential backoff (its sockets' sessions are
// parked by the link) until it failed RestartLimit times in a row, swaps
// in a fresh process on reload, and stops it.
type supervisor struct {
	cfg     Config
	name    string
	listen  string           // the configured address
	ln      *net.TCPListener // the host's listener for it (stop closes it); nil: the transport binds listen
	addr    string           // the bound address; set by the first start when ln is nil
	gw      *Gateway
	pty     *PTYRouter
	metrics *Metrics
	ids     *instanceIDs
	log     zerolog.Logger

	ctx    context.Context // the supervisor's life; ends every link
	cancel context.CancelFunc
	wg     sync.WaitGroup // watch goroutines (and the restarts they run)
	ops    chan struct{}  // one launch, swap or stop at a time

	mu       sync.Mutex // guards the fields below
	stopping bool       // stop has begun: nothing is activated any more
	spec     PluginSpec
	cur      *tgen // the process serving; nil while restarting
	state    string
	restarts int
	streak   int // failures in a row: crashes of short-lived processes and failed starts
	lastErr  string
	backoff  time.Duration
}

// tgen is one transport plugin process and its link.
type tgen struct {
	proc     *pluginProc
	link     *Link
	instance string
	version  string
	started  time.Time
	retired  atomic.Bool   // swapped out or stopped: its end is no crash
	done     chan struct{} // closed once its link ended and it was killed
}

// newSupervisor returns the supervisor of transport ts, serving on ln
// when the host holds its listener (a TCP address; nil otherwise).
func newSupervisor(cfg Config, ts TransportSpec, ln *net.TCPListener, gw *Gateway, pty *PTYRouter, m *Metrics, ids *instanceIDs) *supervisor {
	addr := ""
	if ln != nil {
		addr = ln.Addr().String()
	}
	return &supervisor{
		cfg:     cfg,
		name:    ts.Name,
		listen:  ts.Listen,
		ln:      ln,
		addr:    addr,
		gw:      gw,
		pty:     pty,
		metrics: m,
		ids:     ids,
		log:     cfg.Log,
		ops:     make(chan struct{}, 1),
		spec:    ts.PluginSpec,
		state:   stateStarting,
	}
}

func (s *supervisor) acquire(ctx context.Context) error {
	select {
	case s.ops <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *supervisor) release() { <-s.ops }

// start launches the first plugin process and keeps it running.
func (s *supervisor) start(ctx context.Context) error {
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	g, err := s.launch(s.spec)
	if err != nil {
		s.cancel()
		return err
	}
	if !s.activate(g) {
		s.cancel()
		return errStopping
	}
	return nil
}

// launch starts one plugin process on the shared listener and makes its
// link (not yet running).
func (s *supervisor) launch(spec PluginSpec) (*tgen, error) {
	opts := procOptions{Env: []string{EnvPluginStateDir + "=" + s.cfg.StateDir}, StartTimeout: s.cfg.PluginStartTimeout}
	listen := s.listen
	if s.addr != "" {
		listen = s.addr // a restart binds the address the first start got
	}
	if s.ln != nil {
		f, err := s.ln.File() // a duplicate; the child inherits it as fd 3
		if err != nil {
			return nil, fmt.Errorf("plugin %s: sharing the listener: %w", spec.Name, err)
		}
		defer f.Close() // the child has its own copy once started
		opts.ExtraFiles = []*os.File{f}
		listen = listenFD
	}
	proc, err := startPlugin(spec, contract.KindTransport, opts, s.log)
	if err != nil {
		return nil, err
	}
	instance := s.ids.next(spec.Name)
	sctx, cancel := context.WithTimeout(s.ctx, startRPCTimeout)
	defer cancel()
	resp, err := proc.tr.Start(sctx, contract.StartRequest{
		Instance:     instance,
		Listen:       listen,
		PingInterval: s.cfg.PingInterval,
		PeerTimeout:  s.cfg.PeerTimeout,
	})
	if err != nil {
		proc.client.Kill()
		if s.ln != nil {
			return nil, fmt.Errorf("plugin %s (%s): start on the host's listener %s, inherited as Listen %q (a transport must serve fd:N): %w", spec.Name, spec.Path, s.addr, listen, err)
		}
		return nil, &listenError{fmt.Errorf("plugin %s (%s): start listening on %s: %w", spec.Name, spec.Path, listen, err)}
	}
	if s.addr == "" {
		s.addr = resp.Addr // only the first start, before anything runs concurrently
	}
	access := &Access{Token: s.cfg.Token, Bound: s.addr, AllowOrigins: s.cfg.AllowOrigins}
	g := &tgen{
		proc:     proc,
		link:     NewLink(spec.Name, instance, proc.tr, s.gw, s.pty, access, s.log),
		instance: instance,
		version:  resp.Version,
		started:  time.Now(),
		done:     make(chan struct{}),
	}
	s.log.Info().Str("plugin", spec.Name).Str("instance", instance).Int("pid", proc.pid).
		Str("version", resp.Version).Str("path", spec.Path).Msg("plugin started")
	return g, nil
}

// listenError is a launch that failed in the transport's Start, binding
// an address of its own: the plugin itself answered the handshake.
type listenError struct{ err error }

func (e *listenError) Error() string { return e.err.Error() }
func (e *listenError) Unwrap() error { return e.err }

// activate makes g the serving process and runs its link. Once stop has
// begun it kills g instead and reports false.
func (s *supervisor) activate(g *tgen) bool {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		g.proc.client.Kill()
		return false
	}
	s.cur = g
	s.state = stateRunning
	s.wg.Add(1) // under mu: never after stop's Wait began
	s.mu.Unlock()
	go s.watch(g)
	return true
}

// isStopping reports whether stop has begun.
func (s *supervisor) isStopping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopping
}

// watch serves g's link until it ends; the go-plugin client's context,
// which ends the link's stream, is the death signal. An end nobody asked
// for is a crash: g's sessions are parked (the link detached its
// sockets) and a new process is started after the backoff.
func (s *supervisor) watch(g *tgen) {
	defer s.wg.Done()
	err := g.link.Run(s.ctx)
	g.proc.client.Kill()
	close(g.done)
	if g.retired.Load() || s.ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	if s.cur != g || s.stopping { // replaced by a swap, or shutting down
		s.mu.Unlock()
		return
	}
	s.cur = nil
	s.restarts++
	s.lastErr = errText(err, "plugin exited")
	if time.Since(g.started) > backoffResetAfter {
		s.backoff, s.streak = 0, 0
	}
	failed := s.failedLocked()
	s.mu.Unlock()
	s.metrics.PluginRestarts.WithLabelValues(s.name).Inc()
	if failed {
		s.log.Error().Err(err).Str("plugin", s.name).Int("pid", g.proc.pid).Int("in_a_row", s.cfg.RestartLimit).
			Msg("transport plugin keeps failing; marked failed, not restarted (tether plugins reload to try again)")
		return
	}
	s.log.Warn().Err(err).Str("plugin", s.name).Int("pid", g.proc.pid).Msg("transport plugin ended; restarting")
	s.restart()
}

// failedLocked counts one more failure in a row and reports whether that
// makes the plugin failed (it is then marked so, and not restarted);
// else it is marked restarting.
func (s *supervisor) failedLocked() bool {
	s.streak++
	if limit := s.cfg.RestartLimit; limit > 0 && s.streak >= limit {
		s.state = stateFailed
		s.lastErr = fmt.Sprintf("%s (failed %d times in a row; not restarted until reloaded)", s.lastErr, s.streak)
		return true
	}
	s.state = stateRestarting
	return false
}

// restart starts a new process after the backoff, until one starts or
// something else (a swap, the host's shutdown) made it moot.
func (s *supervisor) restart() {
	restartLoop(s.ctx, &s.mu, &s.backoff, s.acquire, s.release, func() bool {
		s.mu.Lock()
		moot, spec := s.cur != nil || s.stopping, s.spec
		s.mu.Unlock()
		if moot {
			return true
		}
		g, err := s.launch(spec)
		if err != nil {
			s.mu.Lock()
			s.lastErr = err.Error()
			failed := s.failedLocked()
			s.mu.Unlock()
			s.log.Error().Err(err).Str("plugin", s.name).Bool("failed", failed).Msg("restarting transport plugin")
			return failed
		}
		s.activate(g) // kills it if stop began meanwhile
		return true
	})
}

// restartLoop is the supervisors' shared retry: wait out the backoff
// (doubling it up to backoffMax, under mu), take the supervisor's
// operation lock, and try; stop when try reports done or ctx ends.
func restartLoop(ctx context.Context, mu *sync.Mutex, backoff *time.Duration, acquire func(context.Context) error, release func(), try func() (done bool)) {
	for {
		mu.Lock()
		d := *backoff
		*backoff = min(max(2*d, backoffMin), backoffMax)
		mu.Unlock()
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if acquire(ctx) != nil {
			return
		}
		done := try()
		release()
		if done {
			return
		}
	}
}

// swap starts a fresh plugin process (from spec when given, else the
// current one's), links it, and retires the old one: it stops accepting,
// closes its sockets with 1012 (their sessions are parked; clients
// reconnect and resume) and exits. The listener stays open throughout, so
// no connection is refused. If the new process fails to start, the old
// one keeps serving and the error is returned.
func (s *supervisor) swap(ctx context.Context, spec *PluginSpec) (PluginStatus, error) {
	if err := s.acquire(ctx); err != nil {
		return PluginStatus{}, err
	}
	defer s.release()
	if s.isStopping() {
		return PluginStatus{}, errStopping
	}
	s.mu.Lock()
	next := s.spec
	s.mu.Unlock()
	if spec != nil {
		next = *spec
		next.Name = s.name
	}
	g, err := s.launch(next)
	var lerr *listenError
	if errors.As(err, &lerr) {
		// The address is the transport's own (not a TCP address the host
		// holds and hands over), and the running process holds it, so a
		// new one cannot bind it beside the old one: stop the old one
		// first (its sockets get 1012, their sessions are parked), then
		// start the new one. Clients see a short gap and resume.
		s.mu.Lock()
		old := s.cur
		s.mu.Unlock()
		if old != nil {
			s.log.Info().Err(err).Str("plugin", s.name).Msg("the new transport process cannot bind beside the old one; stopping the old one first")
			s.retire(old, contract.CloseServiceRestart, "transport plugin swapped")
			s.mu.Lock()
			if s.cur == old {
				s.cur, s.state = nil, stateRestarting
			}
			s.mu.Unlock()
			if g, err = s.launch(next); err != nil {
				// Down now: the restart loop brings the previous binary
				// back (this swap holds the operation lock, so stop has
				// not begun waiting).
				s.wg.Add(1)
				go func() {
					defer s.wg.Done()
					s.restart()
				}()
				return PluginStatus{}, fmt.Errorf("%w (the old process was stopped to free the address; the previous binary is being restarted)", err)
			}
		}
	}
	if err != nil {
		return PluginStatus{}, err
	}
	s.mu.Lock()
	old := s.cur
	s.spec = next
	s.streak, s.backoff = 0, 0 // a reload gives a failed plugin a fresh start
	s.mu.Unlock()
	if !s.activate(g) {
		return PluginStatus{}, errStopping
	}
	s.metrics.PluginReloads.WithLabelValues(s.name).Inc()
	if old != nil {
		s.retire(old, contract.CloseServiceRestart, "transport plugin swapped")
	}
	s.log.Info().Str("plugin", s.name).Int("pid", g.proc.pid).Str("path", next.Path).Msg("transport plugin swapped")
	return s.status(), nil
}

// retire stops a swapped-out process: Stop closes its listener (its
// duplicate; the host's stays open) and every socket with code, and
// reports them closed on the link; then the link ends and watch kills
// the process.
func (s *supervisor) retire(g *tgen, code int, reason string) {
	g.retired.Store(true)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), retireTimeout)
	defer cancel()
	if err := g.proc.tr.Stop(ctx, contract.StopRequest{Code: code, Reason: reason}); err != nil {
		s.log.Debug().Err(err).Str("plugin", s.name).Msg("stopping the old transport")
	}
	select {
	case <-g.done:
	case <-ctx.Done():
		g.proc.client.Kill() // its link then ends, and watch finishes
	}
}

// reload is SIGHUP's and `tether plugins reload NAME`'s swap.
func (s *supervisor) reload(ctx context.Context, spec *PluginSpec) (PluginStatus, error) {
	return s.swap(ctx, spec)
}

// drain makes the serving link refuse new connections (with 1001).
func (s *supervisor) drain() {
	s.mu.Lock()
	g := s.cur
	s.mu.Unlock()
	if g != nil {
		g.link.Drain(contract.CloseGoingAway, reasonShutdown)
	}
}

// Close reasons of a stopped transport's sockets.
const (
	reasonShutdown = "host shutting down"
	reasonUnloaded = "transport unloaded"
)

// stop closes every client socket with code (1001 at shutdown, 1012 when
// the transport is unloaded: their sessions are parked, never closed),
// stops the plugin, waits for it and lets go of the listener. It waits
// for a swap or launch in flight first, within ctx.
func (s *supervisor) stop(ctx context.Context, code int, reason string) {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	acquired := s.acquire(ctx) == nil
	s.mu.Lock()
	g := s.cur
	s.state = stateStopped
	s.mu.Unlock()
	if g != nil {
		g.retired.Store(true)
		g.link.Drain(code, reason)
		select {
		case <-g.link.CloseAll(code, reason):
		case <-ctx.Done():
		}
		if err := g.proc.tr.Stop(ctx, contract.StopRequest{Code: code, Reason: reason}); err != nil {
			s.log.Debug().Err(err).Str("plugin", s.name).Msg("stopping transport")
		}
		// The link ends by itself once the plugin has reported every
		// socket closed; cut it only when out of time.
		select {
		case <-g.done:
		case <-ctx.Done():
		}
	}
	s.cancel()
	s.wg.Wait()
	if s.ln != nil {
		_ = s.ln.Close()
	}
	if acquired {
		s.release()
	}
}

// status describes the transport plugin for `tether plugins list`.
func (s *supervisor) status() PluginStatus {
	s.mu.Lock()
	st := PluginStatus{
		Name:      s.name,
		Kind:      contract.KindTransport,
		State:     s.state,
		Restarts:  s.restarts,
		LastError: s.lastErr,
		Path:      s.spec.Path,
		Addr:      s.addr,
	}
	g := s.cur
	s.mu.Unlock()
	if g != nil {
		st.Pid = g.proc.pid
		st.Version = g.version
		st.Started = g.started
		st.Connections = g.link.connCount()
	}
	return st
}

// connCount is the number of connections the link has admitted and not
// yet seen closed.
func (l *Link) connCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// errText is err's text, or def for nil.
func errText(err error, def string) string {
	if err == nil {
		return def
	}
	return err.Error()
}
