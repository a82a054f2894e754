package pty

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// Version is the version of this backend, reported by Start.
const Version = "0.1.0"

// Defaults for zero BackendConfig fields: those of tether serve's --pty-*
// flags (the flags table of docs/OPERATIONS.md).
const (
	DefaultTTL         = 30 * time.Minute
	DefaultMaxSessions = 16
	DefaultBuffer      = 1 << 20
	DefaultScrollback  = 1000
	// DefaultMaxCols and DefaultMaxRows are the largest PTY size a
	// resize or a new PTY may ask for (--pty-max-size).
	DefaultMaxCols = 1000
	DefaultMaxRows = 1000
	// DefaultIdleExit is how long a backend lives on with no host linked
	// and no PTY left (see Idle).
	DefaultIdleExit = 50 * time.Second
)

// Size of a new PTY when the attach gives none.
const (
	DefaultCols = 80
	DefaultRows = 24
)

// maxBuffer bounds BackendConfig.Buffer.
const maxBuffer = 1 << 30

// maxScrollback bounds BackendConfig.Scrollback.
const maxScrollback = 1 << 20

// maxSize bounds BackendConfig.MaxCols and MaxRows (wire.MaxSize: the
// largest a resize escape can ask for).
const maxSize = 10000

// Backend is the PTY keep-alive backend (docs/PROTOCOL.md §13). The zero
// value is not usable; call New.
type Backend struct {
	log      zerolog.Logger
	outWake  chan struct{} // wakes the Output sender; capacity 1
	reapWake chan struct{} // wakes the reaper; capacity 1
	stopCh   chan struct{} // closed by Shutdown: ends the reaper
	wg       sync.WaitGroup

	// testHookStream, when set, is called once an Output stream is
	// registered (its cursors taken).
	testHookStream func()
	// testHookDrainWait, when set before PTYs are spawned, is called each
	// time a drain waits for the Output stream.
	testHookDrainWait func()
	// testNoFeed, when set before PTYs are spawned, leaves their screen
	// models unfed until a snapshot (the benchmarks' baseline).
	testNoFeed bool

	// rebuilds counts the screen model rebuilds of every PTY, those gone
	// since included (see ScreenRebuilds).
	rebuilds atomic.Int64

	// secret is the instance secret the host gave this process (see
	// SetSecret); constant after it.
	secret string

	mu         sync.Mutex // guards the fields below
	cfg        contract.BackendConfig
	started    bool
	stopped    bool
	shutDone   chan struct{}            // closed when the first Shutdown returns
	ptys       map[string]*ptyRec       // live PTYs by attach token
	spawning   map[string]chan struct{} // tokens being spawned; closed when done
	all        map[*ptyRec]struct{}     // every PTY whose exit is not yet streamed
	streamDone chan struct{}            // non-nil while Output runs; closed when it returns
}

var _ contract.Backend = (*Backend)(nil)
var _ contract.ScreenRebuildCounter = (*Backend)(nil)

// New returns an unstarted Backend that logs to log.
//
// With TETHER_PTY_SCREEN_MODEL=off in its environment (for benchmarks
// only: bench/ measures the data path with the model on and off) the
// screen models are left unfed until a snapshot, which then rebuilds its
// model from the ring's tail.
func New(log zerolog.Logger) *Backend {
	b := &Backend{
		log:        log,
		outWake:    make(chan struct{}, 1),
		reapWake:   make(chan struct{}, 1),
		stopCh:     make(chan struct{}),
		ptys:       make(map[string]*ptyRec),
		spawning:   make(map[string]chan struct{}),
		all:        make(map[*ptyRec]struct{}),
		testNoFeed: os.Getenv(envScreenModel) == "off",
	}
	if b.testNoFeed {
		log.Warn().Msg("pty screen models off (" + envScreenModel + "=off, for benchmarks): snapshots are rebuilt from the ring's tail")
	}
	return b
}

// envScreenModel switches the screen models off when "off" (see New).
const envScreenModel = "TETHER_PTY_SCREEN_MODEL"

// SetSecret sets the instance secret Start proves to a host's Challenge
// (contract.Prove). Call it once, before serving.
func (b *Backend) SetSecret(secret string) { b.secret = secret }

// Idle reports whether no host is linked (no Output stream) and no PTY
// is live or being spawned, and how long an idle backend should live on
// (the last Start's IdleExit). A plugin process with no host and nothing
// left to keep exits once it has been idle that long.
func (b *Backend) Idle() (idle bool, exitAfter time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.streamDone == nil && len(b.ptys) == 0 && len(b.spawning) == 0, cmp.Or(b.cfg.IdleExit, DefaultIdleExit)
}

// Start implements contract.Backend. Zero fields of cfg take the package
// defaults; an empty Argv runs $SHELL, else /bin/sh. A later Start replaces
// the configuration: TTL and MaxSessions apply at once, Argv and Buffer to
// PTYs spawned after it, and so does Scrollback. The first Start starts
// the reaper.
func (b *Backend) Start(_ context.Context, cfg contract.BackendConfig) (contract.BackendInfo, error) {
	switch {
	case cfg.TTL < 0, cfg.MaxSessions < 0, cfg.Buffer < 0, cfg.Scrollback < contract.NoScrollback, cfg.IdleExit < 0:
		return contract.BackendInfo{}, fmt.Errorf("start: negative setting: %w", contract.ErrInvalidArgument)
	case cfg.Buffer > maxBuffer:
		return contract.BackendInfo{}, fmt.Errorf("start: buffer %d over %d: %w", cfg.Buffer, maxBuffer, contract.ErrInvalidArgument)
	case cfg.Scrollback > maxScrollback:
		return contract.BackendInfo{}, fmt.Errorf("start: scrollback %d over %d: %w", cfg.Scrollback, maxScrollback, contract.ErrInvalidArgument)
	case cfg.MaxCols < 0, cfg.MaxRows < 0, cfg.MaxCols > maxSize, cfg.MaxRows > maxSize:
		return contract.BackendInfo{}, fmt.Errorf("start: largest size %dx%d not within 1-%d: %w", cfg.MaxCols, cfg.MaxRows, maxSize, contract.ErrInvalidArgument)
	}
	cfg.Argv = slices.Clone(cfg.Argv)
	if len(cfg.Argv) == 0 {
		cfg.Argv = []string{cmp.Or(os.Getenv("SHELL"), "/bin/sh")}
	}
	cfg.TTL = cmp.Or(cfg.TTL, DefaultTTL)
	cfg.MaxSessions = cmp.Or(cfg.MaxSessions, DefaultMaxSessions)
	cfg.Buffer = cmp.Or(cfg.Buffer, DefaultBuffer)
	cfg.MaxCols = cmp.Or(cfg.MaxCols, DefaultMaxCols)
	cfg.MaxRows = cmp.Or(cfg.MaxRows, DefaultMaxRows)
	switch cfg.Scrollback {
	case 0:
		cfg.Scrollback = DefaultScrollback
	case contract.NoScrollback:
		cfg.Scrollback = 0
	}

	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return contract.BackendInfo{}, fmt.Errorf("start: %w", contract.ErrStopped)
	}
	b.cfg = cfg
	if !b.started {
		b.started = true
		b.wg.Add(1)
		go b.reap()
	}
	b.mu.Unlock()
	wake(b.reapWake)
	b.log.Debug().Str("instance", cfg.Instance).Strs("argv", cfg.Argv).Str("ttl", cfg.TTL.String()).
		Int("max_sessions", cfg.MaxSessions).Int64("buffer", cfg.Buffer).Int("scrollback", cfg.Scrollback).
		Int("max_cols", cfg.MaxCols).Int("max_rows", cfg.MaxRows).Msg("pty backend started")
	info := contract.BackendInfo{Version: Version, Pid: os.Getpid()}
	if b.secret != "" && cfg.Challenge != "" {
		info.Proof = contract.Prove(b.secret, cfg.Challenge)
	}
	return info, nil
}

// Attach implements contract.Backend. It spawns the PTY of req.Token when
// there is none, outside the registry lock; concurrent attaches of a new
// token wait for the one spawn. At the session cap it evicts the PTY
// detached the longest, or fails with contract.ErrRegistryFull when every
// PTY has a writer. A view attach never spawns or evicts: with no live
// PTY it fails with contract.ErrNoSuchTerminal. A reset attach gets a
// snapshot of the screen model, taken after the registry lock is let go.
func (b *Backend) Attach(ctx context.Context, req contract.AttachRequest) (contract.AttachResponse, error) {
	resp, rec, err := b.attach(ctx, req)
	if err != nil || !resp.Reset {
		return resp, err
	}
	if resp.Spawned {
		// A PTY this attach started has shown nothing yet: its snapshot
		// is an empty screen at offset 0, and every byte the program
		// writes — its first prompt, its queries, which this first
		// terminal is the one to answer — follows as live output.
		rec.mu.Lock()
		cols, rows := rec.sizes[0].cols, rec.sizes[0].rows // the size at offset 0
		rec.mu.Unlock()
		resp.Replay, resp.StartOffset, resp.ReplayEnd = nil, 0, 0
		resp.Snapshot, resp.SnapshotBytes, resp.Cols, resp.Rows = true, 0, cols, rows
		return resp, nil
	}
	// Every byte at or past the offset the attach bound the viewer at
	// reaches the Output stream after it; the snapshot stands at that
	// offset or later, so live output from ReplayEnd on is all there.
	snap, off, cols, rows := rec.snapshot()
	resp.Replay, resp.StartOffset, resp.ReplayEnd = snap, off, off
	resp.Snapshot, resp.SnapshotBytes, resp.Cols, resp.Rows = true, int64(len(snap)), cols, rows
	rec.log.Debug().Stringer("viewer", req.Viewer).Int64("replay_end", off).Int("snapshot", len(snap)).Msg("pty snapshot")
	return resp, nil
}

// attach binds req.Viewer to the PTY of req.Token, spawning it if need be,
// and returns the response with the raw replay (none when reset).
func (b *Backend) attach(ctx context.Context, req contract.AttachRequest) (contract.AttachResponse, *ptyRec, error) {
	switch {
	case !validToken(req.Token):
		return contract.AttachResponse{}, nil, fmt.Errorf("attach: malformed token: %w", contract.ErrInvalidArgument)
	case req.Viewer.IsZero():
		return contract.AttachResponse{}, nil, fmt.Errorf("attach: no viewer: %w", contract.ErrInvalidArgument)
	case !validSize(req.Cols, true), !validSize(req.Rows, true):
		return contract.AttachResponse{}, nil, fmt.Errorf("attach: size %dx%d: %w", req.Cols, req.Rows, contract.ErrInvalidArgument)
	}

	b.mu.Lock()
	for {
		switch {
		case b.stopped:
			b.mu.Unlock()
			return contract.AttachResponse{}, nil, fmt.Errorf("attach: %w", contract.ErrStopped)
		case !b.started:
			b.mu.Unlock()
			return contract.AttachResponse{}, nil, fmt.Errorf("attach: %w", contract.ErrNotStarted)
		case req.Cols > b.cfg.MaxCols || req.Rows > b.cfg.MaxRows:
			b.mu.Unlock()
			return contract.AttachResponse{}, nil, fmt.Errorf("attach: size %dx%d over the largest, %dx%d: %w",
				req.Cols, req.Rows, b.cfg.MaxCols, b.cfg.MaxRows, contract.ErrInvalidArgument)
		}
		if rec := b.ptys[req.Token]; rec != nil {
			resp := b.attachLocked(rec, req, false)
			b.mu.Unlock()
			return resp, rec, nil
		}
		spawned := b.spawning[req.Token]
		if spawned == nil && req.View {
			b.mu.Unlock()
			return contract.AttachResponse{}, nil, fmt.Errorf("attach: view of %s: %w", req.Token, contract.ErrNoSuchTerminal)
		}
		if spawned == nil {
			break
		}
		b.mu.Unlock()
		select {
		case <-spawned:
		case <-ctx.Done():
			return contract.AttachResponse{}, nil, fmt.Errorf("attach: %w", ctx.Err())
		}
		b.mu.Lock()
	}

	victims, err := b.makeRoomLocked()
	if err != nil {
		b.mu.Unlock()
		return contract.AttachResponse{}, nil, err
	}
	done := make(chan struct{})
	b.spawning[req.Token] = done
	cfg := b.cfg
	b.wg.Add(1) // the spawn in flight: Shutdown waits for it
	defer b.wg.Done()
	b.mu.Unlock()

	for _, v := range victims {
		v.log.Debug().Msg("pty evicted: session cap reached")
		v.kill()
	}
	rec, err := b.spawn(cfg, req)

	b.mu.Lock()
	delete(b.spawning, req.Token)
	close(done)
	if err != nil {
		b.mu.Unlock()
		return contract.AttachResponse{}, nil, fmt.Errorf("attach: %w", err)
	}
	if b.stopped {
		b.mu.Unlock()
		rec.abort()
		return contract.AttachResponse{}, nil, fmt.Errorf("attach: %w", contract.ErrStopped)
	}
	b.ptys[req.Token] = rec
	b.all[rec] = struct{}{}
	if b.streamDone != nil {
		rec.mu.Lock()
		rec.linkLocked(true, 0) // the stream's cursor for a PTY spawned after it started
		rec.mu.Unlock()
	}
	b.wg.Add(3)
	go b.drain(rec)
	go b.waitExit(rec)
	go b.feed(rec)
	resp := b.attachLocked(rec, req, true)
	b.mu.Unlock()
	rec.log.Debug().Strs("argv", rec.argv).Msg("pty spawned")
	return resp, rec, nil
}

// makeRoomLocked makes room for one more PTY under the session cap: it
// removes the PTYs detached the longest from the registry and returns them
// to be killed, or fails when too few PTYs are detached.
func (b *Backend) makeRoomLocked() ([]*ptyRec, error) {
	need := len(b.ptys) + len(b.spawning) + 1 - b.cfg.MaxSessions
	if need <= 0 {
		return nil, nil
	}
	type cand struct {
		rec      *ptyRec
		detached time.Time
	}
	var cands []cand
	for _, rec := range b.ptys {
		rec.mu.Lock()
		if rec.writer.IsZero() {
			cands = append(cands, cand{rec, rec.detached})
		}
		rec.mu.Unlock()
	}
	if len(cands) < need {
		return nil, fmt.Errorf("attach: %d PTYs at cap %d, %d detached: %w",
			len(b.ptys)+len(b.spawning), b.cfg.MaxSessions, len(cands), contract.ErrRegistryFull)
	}
	slices.SortFunc(cands, func(x, y cand) int { return x.detached.Compare(y.detached) })
	victims := make([]*ptyRec, need)
	for i := range victims {
		victims[i] = cands[i].rec
		delete(b.ptys, victims[i].token)
	}
	return victims, nil
}

// attachLocked binds req.Viewer to rec and answers with the raw replay of
// a resume (none when reset: Attach adds the snapshot). A writer's size
// (req.Cols×req.Rows) resizes a PTY it did not spawn first. The replay and
// ReplayEnd are taken under rec.mu, the lock the drain appends under, so
// every byte at or past ReplayEnd reaches the Output stream after this
// moment.
func (b *Backend) attachLocked(rec *ptyRec, req contract.AttachRequest, spawned bool) contract.AttachResponse {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var superseded contract.TransportID
	if req.View {
		if rec.writer == req.Viewer {
			rec.writer = contract.TransportID{}
			rec.detached = time.Now()
			wake(b.reapWake)
		}
		rec.viewers[req.Viewer] = struct{}{}
	} else {
		delete(rec.viewers, req.Viewer)
		if rec.writer != req.Viewer {
			superseded = rec.writer
		}
		rec.writer = req.Viewer
		rec.detached = time.Time{}
		if !spawned && req.Cols > 0 && req.Rows > 0 {
			// The writer's size, taken before the replay is decided: a
			// snapshot is of the model at this size, and the program's
			// answer to SIGWINCH follows as live output. Under rec.mu,
			// with the writer bound, so no later writer's size is undone.
			if err := rec.setSizeLocked(req.Cols, req.Rows); err != nil {
				rec.log.Debug().Err(err).Int("cols", req.Cols).Int("rows", req.Rows).Msg("pty attach: resize failed")
			}
		}
	}
	start, end := rec.ring.StartOffset(), rec.ring.EndOffset()
	reason := replayReason(req.HasCursor, req.Offset, req.Epoch, rec.epoch, start, end)
	var replay []byte
	if reason == wire.ReasonResume {
		replay, _, _ = rec.ring.Read(req.Offset)
	}
	rec.log.Debug().Stringer("viewer", req.Viewer).Bool("view", req.View).Str("reason", reason).
		Int64("replay_end", end).Int("replay", len(replay)).Msg("pty attached")
	return contract.AttachResponse{
		Epoch:       rec.epoch,
		StartOffset: start,
		ReplayEnd:   end,
		Reset:       reason != wire.ReasonResume,
		Reason:      reason,
		Replay:      replay,
		Superseded:  superseded,
		Spawned:     spawned,
		Pid:         rec.pid,
	}
}

// replayReason decides how an attach with the given cursor replays a PTY
// of epoch whose ring holds [start, end) (docs/PROTOCOL.md §13.3).
func replayReason(hasCursor bool, offset int64, cursorEpoch, epoch string, start, end int64) string {
	switch {
	case !hasCursor:
		return wire.ReasonInitial
	case offset < 0, cursorEpoch == "":
		return wire.ReasonInvalidCursor
	case cursorEpoch != epoch:
		return wire.ReasonEpochMismatch
	case offset < start:
		return wire.ReasonOffsetRolledOut
	case offset > end:
		return wire.ReasonOffsetAhead
	default:
		return wire.ReasonResume
	}
}

// Detach implements contract.Backend. The writer's detach starts the TTL
// clock; a read-only viewer's detach removes it. Anyone else — a
// superseded writer, say — gets contract.ErrStaleTransport and changes
// nothing.
func (b *Backend) Detach(_ context.Context, token string, viewer contract.TransportID) error {
	rec, err := b.lookup("detach", token)
	if err != nil {
		return err
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	switch _, isViewer := rec.viewers[viewer]; {
	case !viewer.IsZero() && rec.writer == viewer:
		rec.writer = contract.TransportID{}
		rec.detached = time.Now()
		wake(b.reapWake)
		rec.log.Debug().Stringer("viewer", viewer).Msg("pty writer detached")
	case isViewer:
		delete(rec.viewers, viewer)
		rec.log.Debug().Stringer("viewer", viewer).Msg("pty viewer detached")
	default:
		return fmt.Errorf("detach %v: %w", viewer, contract.ErrStaleTransport)
	}
	return nil
}

// Write implements contract.Backend. It blocks while the PTY's input queue
// is full (the child is not reading), like a terminal does. A write that
// passed the writer check before a supersede may still reach the child: it
// is ordered before the new attach.
func (b *Backend) Write(_ context.Context, token string, viewer contract.TransportID, data []byte) error {
	rec, err := b.lookup("write", token)
	if err != nil {
		return err
	}
	if !rec.isWriter(viewer) {
		return fmt.Errorf("write %v: %w", viewer, contract.ErrStaleTransport)
	}
	if _, err := rec.master.Write(data); err != nil {
		return fmt.Errorf("write: %w", masterErr(err))
	}
	return nil
}

// Resize implements contract.Backend; the child gets SIGWINCH. A size
// over the configured largest (MaxCols×MaxRows) fails with
// contract.ErrInvalidArgument and changes nothing.
func (b *Backend) Resize(_ context.Context, token string, viewer contract.TransportID, cols, rows int) error {
	if !validSize(cols, false) || !validSize(rows, false) {
		return fmt.Errorf("resize %dx%d: %w", cols, rows, contract.ErrInvalidArgument)
	}
	b.mu.Lock()
	maxCols, maxRows := b.cfg.MaxCols, b.cfg.MaxRows
	rec := b.ptys[token]
	b.mu.Unlock()
	if rec == nil {
		return fmt.Errorf("resize: %w", contract.ErrNotFound)
	}
	if cols > maxCols || rows > maxRows {
		return fmt.Errorf("resize %dx%d: over the largest, %dx%d: %w", cols, rows, maxCols, maxRows, contract.ErrInvalidArgument)
	}
	if !rec.isWriter(viewer) {
		return fmt.Errorf("resize %v: %w", viewer, contract.ErrStaleTransport)
	}
	if err := rec.setSize(cols, rows); err != nil {
		return fmt.Errorf("resize: %w", masterErr(err))
	}
	return nil
}

// Close implements contract.Backend: it removes the PTY from the registry
// at once and kills its process group. Its remaining output and exit
// marker still go out on the Output stream.
func (b *Backend) Close(_ context.Context, token string) error {
	b.mu.Lock()
	rec := b.ptys[token]
	if rec == nil {
		b.mu.Unlock()
		return fmt.Errorf("close: %w", contract.ErrNotFound)
	}
	delete(b.ptys, token)
	b.mu.Unlock()
	rec.log.Debug().Msg("pty closed")
	rec.kill()
	return nil
}

// ScreenRebuilds implements contract.ScreenRebuildCounter: the screen
// model rebuilds of every PTY this process has run.
func (b *Backend) ScreenRebuilds(context.Context) (int64, error) {
	return b.rebuilds.Load(), nil
}

// List implements contract.Backend. It describes the live PTYs, oldest
// first; exited, closed and reaped ones are gone.
func (b *Backend) List(context.Context) ([]contract.PTYInfo, error) {
	b.mu.Lock()
	infos := make([]contract.PTYInfo, 0, len(b.ptys))
	for _, rec := range b.ptys {
		infos = append(infos, rec.info())
	}
	b.mu.Unlock()
	slices.SortFunc(infos, func(x, y contract.PTYInfo) int {
		return cmp.Or(x.Created.Compare(y.Created), cmp.Compare(x.Token, y.Token))
	})
	return infos, nil
}

// Shutdown kills every PTY's process group, waits for every goroutine the
// backend started, then for a running Output stream to deliver the last
// output and exit markers and return. Later calls fail with
// contract.ErrStopped. It is idempotent; later calls wait for the first.
func (b *Backend) Shutdown() {
	b.mu.Lock()
	if b.shutDone != nil {
		done := b.shutDone
		b.mu.Unlock()
		<-done
		return
	}
	b.shutDone = make(chan struct{})
	defer close(b.shutDone)
	b.stopped = true
	close(b.stopCh)
	recs := make([]*ptyRec, 0, len(b.all))
	for rec := range b.all {
		recs = append(recs, rec)
	}
	clear(b.ptys)
	b.mu.Unlock()

	for _, rec := range recs {
		rec.kill()
	}
	b.wg.Wait()

	wake(b.outWake)
	b.mu.Lock()
	stream := b.streamDone
	b.mu.Unlock()
	if stream != nil {
		<-stream
	}
	b.log.Info().Int("ptys", len(recs)).Msg("pty backend stopped")
}

// lookup returns the live PTY of token.
func (b *Backend) lookup(op, token string) (*ptyRec, error) {
	b.mu.Lock()
	rec := b.ptys[token]
	b.mu.Unlock()
	if rec == nil {
		return nil, fmt.Errorf("%s: %w", op, contract.ErrNotFound)
	}
	return rec, nil
}

// reap kills and removes PTYs detached for longer than the TTL. One
// goroutine serves every PTY: it sleeps until the earliest deadline and is
// woken when a PTY detaches or the configuration changes.
func (b *Backend) reap() {
	defer b.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		now := time.Now()
		var victims []*ptyRec
		var next time.Time
		b.mu.Lock()
		ttl := b.cfg.TTL
		for token, rec := range b.ptys {
			rec.mu.Lock()
			if rec.writer.IsZero() {
				if deadline := rec.detached.Add(ttl); !deadline.After(now) {
					victims = append(victims, rec)
					delete(b.ptys, token)
				} else if next.IsZero() || deadline.Before(next) {
					next = deadline
				}
			}
			rec.mu.Unlock()
		}
		b.mu.Unlock()

		for _, rec := range victims {
			rec.log.Debug().Dur("ttl", ttl).Msg("pty reaped: detached too long")
			rec.kill()
		}
		if !next.IsZero() {
			timer.Reset(next.Sub(now))
		}
		select {
		case <-timer.C:
		case <-b.reapWake:
			timer.Stop()
		case <-b.stopCh:
			return
		}
	}
}

// wake signals ch without blocking.
func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// validSize reports whether n is a usable terminal dimension; zero (the
// default) only when zeroOK.
func validSize(n int, zeroOK bool) bool {
	return n > 0 && n <= 0xffff || n == 0 && zeroOK
}

// masterErr maps the errors of a PTY master that is closing to
// contract.ErrExited.
func masterErr(err error) error {
	if errors.Is(err, os.ErrClosed) || isEIO(err) {
		return fmt.Errorf("%w: %w", contract.ErrExited, err)
	}
	return err
}
