package supervise

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/wire"
)

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
	b.router.CloseAll(wire.CloseProcessExited, "pty plugin stopped")
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
