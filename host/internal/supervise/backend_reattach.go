package supervise

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-plugin"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/internal/umask"
)

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
	if m, ok := umask.Child(); ok {
		// The plugin runs with the host's umask (077); its PTYs' shells
		// get the user's.
		env = append(env, contract.EnvPluginUmask+"="+umask.Format(m))
	}
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
	b.log.Debug().Str("plugin", b.name).Str("instance", cfg.Instance).Int("pid", proc.pid).
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
