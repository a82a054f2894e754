package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/notify"
	"github.com/tether-agent/tether/host/internal/ownership"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

// runStaleAfter is how long a parked session's run may go without progress
// before the reaper interrupts it.
const runStaleAfter = 10 * time.Minute

// defaultOwnersTimeout bounds one call to the ownership store unless
// Config.OwnersTimeout says otherwise.
const defaultOwnersTimeout = 5 * time.Second

// maxKeyDraws bounds how often a create draws a new stored key after the
// one it drew was already taken.
const maxKeyDraws = 4

// Config configures a Table.
type Config struct {
	Store  store.Backend
	Agents agent.Factory
	// Owners records key ownership; nil means a new ownership.Mem.
	Owners ownership.Store
	// OwnersTimeout bounds one call to Owners (default 5s). A cluster
	// host keeps it well under its TTL: a bind waiting on an unreachable
	// store holds its session's slot, and the host must let go of its
	// sessions before the TTL.
	OwnersTimeout time.Duration
	// Host is this host's name in the ownership entries ("" on a single
	// host).
	Host string
	// Instance names this host's process in the ownership entries (""
	// on a single host).
	Instance string
	// OrphanGrace is how long a session with no viewer stays parked
	// before it is reaped; 0 keeps it forever.
	OrphanGrace time.Duration
	// RingSize is the number of events kept in memory per session for
	// session.events.since (default 4096); older ones come from the
	// journal.
	RingSize int
	// Retention bounds the event journal in the store.
	Retention store.Retention
	// SessionTTL releases parked, idle sessions idle for longer (0 = never).
	SessionTTL time.Duration
	// MaxLive caps the live sessions (0 = no cap): making room evicts the
	// oldest parked idle session; with none, create and resume fail.
	MaxLive int
	Log     zerolog.Logger
	Metrics *metrics.Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Notify, when set, is told of each permission request and each run
	// that completed or failed (notice.go); it is called with no lock
	// held and must not block.
	Notify func(notify.Event)
}

// Table is the authoritative table of live sessions: a map under one
// mutex. Every path that removes a viewer, parks, reaps or closes a
// session goes through release.
type Table struct {
	store  store.Backend
	agents agent.Factory
	owners ownership.Store
	host   string
	// instance is Config.Instance.
	instance string
	// ownersTimeout is Config.OwnersTimeout.
	ownersTimeout time.Duration
	grace         time.Duration
	ring          int
	log           zerolog.Logger
	metrics       *metrics.Metrics
	notify        func(notify.Event) // Config.Notify; nil: none
	now           func() time.Time
	newKey        func(time.Time) string // store.NewKey; tests replace it
	journal       *journal
	ttl           time.Duration
	maxLive       int
	sweep         chan struct{} // closed to stop the idle sweeper
	sweeper       sync.WaitGroup
	// faultLogged is when a failed write was last logged (unix ns), for
	// storeFault's rate limit.
	faultLogged atomic.Int64

	wg sync.WaitGroup // teardowns and runs in flight

	mu    sync.Mutex // guards the fields below
	byID  map[string]*Session
	byKey map[string]*Session
	order []*Session // creation order, for active_list
	// claims holds, by key, the sessions built and waiting for the
	// ownership store to record them; a resume of that key waits.
	claims map[string]*claim
	// releasing holds sessions removed from the table whose teardown is
	// still persisting, by key; a resume of that key waits for them.
	releasing map[string]*Session
	closed    bool
}

// claim is a session being registered: done is closed when it is in the
// table or was given up.
type claim struct {
	done chan struct{}
	// held is set, before done is closed, when the claim came to nothing
	// because another host holds the key: the resumes waiting for it are
	// answered the same at once instead of each claiming again.
	held error
}

// NewTable returns an empty table. It sets cfg.Store's write-fault hook
// (store.OnWriteFault) to count and log every failed write of that store
// in cfg.Metrics, whoever makes it: one table per store.
func NewTable(cfg Config) *Table {
	if cfg.Owners == nil {
		cfg.Owners = ownership.NewMem()
	}
	if cfg.RingSize <= 0 {
		cfg.RingSize = 4096
	}
	if cfg.OwnersTimeout <= 0 {
		cfg.OwnersTimeout = defaultOwnersTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	t := &Table{
		store:    cfg.Store,
		agents:   cfg.Agents,
		owners:   cfg.Owners,
		host:     cfg.Host,
		instance: cfg.Instance,

		ownersTimeout: cfg.OwnersTimeout,
		grace:         cfg.OrphanGrace,
		ring:          cfg.RingSize,
		log:           cfg.Log,
		metrics:       cfg.Metrics,
		notify:        cfg.Notify,
		now:           cfg.Now,
		newKey:        store.NewKey,
		journal:       newJournal(cfg.Store, cfg.Retention, cfg.Log, cfg.Metrics),
		ttl:           cfg.SessionTTL,
		maxLive:       cfg.MaxLive,
		sweep:         make(chan struct{}),
		byID:          make(map[string]*Session),
		byKey:         make(map[string]*Session),
		claims:        make(map[string]*claim),
		releasing:     make(map[string]*Session),
	}
	t.journal.overloaded = t.interruptAll
	if cfg.Store != nil {
		cfg.Store.OnWriteFault(t.storeFault)
	}
	if t.ttl > 0 {
		t.sweeper.Add(1)
		go t.sweepIdle()
	}
	return t
}

// interruptAll interrupts every run in flight: the journal cannot store
// what they stream, and its withheld backlog is at its bound.
func (t *Table) interruptAll() {
	t.mu.Lock()
	all := make([]*Session, len(t.order))
	copy(all, t.order)
	t.mu.Unlock()
	n := 0
	for _, s := range all {
		if s.Interrupt() {
			n++
		}
	}
	if n > 0 {
		t.log.Error().Int("runs", n).Msg("runs interrupted: the database cannot be written and the withheld events reached their bound")
	}
}

// storeFault counts and logs one write to the database that failed with
// a storage fault, whoever made it (the journal's commits, the direct
// writes of create, prompt.submit, resume and recover, the gateways'):
// tether_store_errors_total counts each; the error log is rate-limited to
// one line per faultLogEvery. The store calls it (see
// store.OnWriteFault); it takes no lock.
func (t *Table) storeFault(err error) {
	t.metrics.StoreErrors.Inc()
	now := time.Now().UnixNano()
	last := t.faultLogged.Load()
	if now-last < int64(faultLogEvery) || !t.faultLogged.CompareAndSwap(last, now) {
		return
	}
	t.log.Error().Err(err).Msg("cannot write the database (disk full, I/O error or read-only); writes fail with storage unavailable (5003) until it can")
}

// storageErr maps a failed call to the store: a write that ran out of
// time in the writer's queue (store.ErrOverloaded), or a write of the
// host's own store that ran out of time otherwise, becomes ErrOverloaded
// (5003 with a retry hint: nothing was written); a storage fault (a
// write the database refused, or a cluster store that did not answer)
// ErrStorageUnavailable (5003), anything else other.
func storageErr(op string, err error, other error) error {
	switch {
	case errors.Is(err, store.ErrOverloaded):
		return fmt.Errorf("%s: %w: %w", op, err, ErrOverloaded)
	case errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, store.ErrUnavailable):
		// A cluster's store says ErrUnavailable when it does not know
		// whether a write was made; SQLite's rolled back.
		return fmt.Errorf("%s: %w: %w", op, err, ErrOverloaded)
	case errors.Is(err, store.ErrUnavailable):
		return fmt.Errorf("%s: %v: %w", op, err, ErrStorageUnavailable)
	}
	return fmt.Errorf("%s: %v: %w", op, err, other)
}

// resumeStorageErr is storageErr for a resume: a shared store that did
// not answer (store.ErrUnreachable) is ErrStoreUnreachable, to be tried
// again like an owner that cannot be reached, not a storage fault.
func resumeStorageErr(op string, err error, other error) error {
	if errors.Is(err, store.ErrUnreachable) {
		return fmt.Errorf("%s: %v: %w", op, err, ErrStoreUnreachable)
	}
	return storageErr(op, err, other)
}

// reachable is a store shared by a cluster's hosts (the cluster's
// jsstore.Store), which can say whether its servers answer now.
type reachable interface {
	Reachable(ctx context.Context) error
}

// storeReachable asks a shared store, within the ownership bound,
// whether its servers answer now, before a resume reads and writes a
// session's history: while they elect new leaders the resume answers
// ErrStoreUnreachable at once, rather than after each read waited out
// its timeout. A store of the host's own is always reachable.
func (t *Table) storeReachable(ctx context.Context, op string) error {
	r, ok := t.store.(reachable)
	if !ok {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, t.ownersTimeout)
	defer cancel()
	if err := r.Reachable(rctx); err != nil {
		return resumeStorageErr(op, err, ErrBuildFailed)
	}
	return nil
}

// writable reports why a call that must write should be refused now: the
// journal's commits are failing (ErrStorageUnavailable), else nil.
func (t *Table) writable() error {
	if err := t.journal.health(); err != nil {
		if errors.Is(err, store.ErrOverloaded) {
			return fmt.Errorf("%w: %w", err, ErrOverloaded)
		}
		return fmt.Errorf("%v: %w", err, ErrStorageUnavailable)
	}
	return nil
}

// resumeWritable is writable for a resume: commits failing because a
// shared store does not answer make it ErrStoreUnreachable (retry).
func (t *Table) resumeWritable() error {
	if err := t.journal.health(); err != nil {
		return resumeStorageErr("commits failing", err, ErrStorageUnavailable)
	}
	return nil
}

// sweepIdle releases parked idle sessions older than the session TTL.
func (t *Table) sweepIdle() {
	defer t.sweeper.Done()
	every := min(max(t.ttl/4, 50*time.Millisecond), time.Minute)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-t.sweep:
			return
		case <-tick.C:
		}
		now := t.now()
		for _, ref := range t.candidates(func(s *Session) bool { return now.Sub(s.lastActive) > t.ttl }) {
			t.release(ref, IdleReap)
		}
	}
}

// candidates returns, oldest activity first, the parked idle sessions
// (no viewer, no run) for which pick holds, with their generation now.
func (t *Table) candidates(pick func(*Session) bool) []releaseRef {
	t.mu.Lock()
	all := make([]*Session, len(t.order))
	copy(all, t.order)
	t.mu.Unlock()
	type cand struct {
		ref  releaseRef
		last time.Time
	}
	var cs []cand
	for _, s := range all {
		s.mu.Lock()
		if len(s.viewers) == 0 && s.run == nil && !s.closing && pick(s) {
			cs = append(cs, cand{releaseRef{s: s, gen: s.gen}, s.lastActive})
		}
		s.mu.Unlock()
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].last.Before(cs[j].last) })
	out := make([]releaseRef, len(cs))
	for i, c := range cs {
		out[i] = c.ref
	}
	return out
}

// fullLocked reports whether the table is at its cap of live sessions
// (claims included), so that one more does not fit. t.mu is held.
func (t *Table) fullLocked() bool {
	return t.maxLive > 0 && len(t.byID)+len(t.claims) >= t.maxLive
}

// evictOne makes room under the cap of live sessions: it evicts the
// oldest parked idle session, or returns ErrLiveCap when there is none.
// It is called with no lock held; the caller looks again (another
// session may have taken the room meanwhile).
func (t *Table) evictOne() error {
	for _, ref := range t.candidates(func(*Session) bool { return true }) {
		if t.release(ref, Evicted) {
			return nil
		}
	}
	return fmt.Errorf("%d live sessions, none parked and idle: %w", t.maxLive, ErrLiveCap)
}

// CreateOptions are the parameters of session.create.
type CreateOptions struct {
	Title             string
	CloseOnDisconnect bool
	// Parent is the stored key whose display rows form the new session's
	// prefix, or "".
	Parent string
	// ForkCount overrides the number of parent rows in the prefix; -1
	// means all the parent's rows as stored now.
	ForkCount int
	// AgentState is given to the new session's agent (e.g. the working
	// directory an ACP client asked for); nil for none.
	AgentState json.RawMessage
}

// Activate binds v to the live session id.
func (t *Table) Activate(ctx context.Context, v Viewer, id string, reply Reply) error {
	s, err := t.Lookup(id)
	if err != nil {
		return err
	}
	if err := t.bind(ctx, s, v, "", reply); errors.Is(err, errGone) {
		return fmt.Errorf("%s: %w", id, ErrUnknownSession)
	} else if err != nil {
		return err
	}
	return nil
}

// Lookup returns the live session with runtime id, or ErrUnknownSession.
func (t *Table) Lookup(id string) (*Session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.byID[id]
	if s == nil {
		return nil, fmt.Errorf("%s: %w", id, ErrUnknownSession)
	}
	return s, nil
}

// ActiveEntry is one row of session.active_list.
type ActiveEntry struct {
	ID           string `json:"id"`
	SessionKey   string `json:"session_key"`
	Title        string `json:"title"`
	Status       string `json:"status"`
	MessageCount int    `json:"message_count"`
	StartedAt    int64  `json:"started_at"`
	LastActive   int64  `json:"last_active"`
	Viewers      int    `json:"viewers"`
	// Transports counts the viewers per transport name; empty for a
	// parked session.
	Transports map[string]int `json:"transports"`
}

// Active lists the live sessions in creation order, parked ones included.
func (t *Table) Active() []ActiveEntry {
	t.mu.Lock()
	all := make([]*Session, len(t.order))
	copy(all, t.order)
	t.mu.Unlock()
	out := make([]ActiveEntry, 0, len(all))
	for _, s := range all {
		s.mu.Lock()
		e := ActiveEntry{
			ID:           s.id,
			SessionKey:   s.key,
			Title:        s.title,
			Status:       s.statusLocked(),
			MessageCount: len(s.messages) + s.inflightRowsLocked(),
			StartedAt:    s.startedAt.Unix(),
			LastActive:   s.lastActive.Unix(),
			Viewers:      len(s.viewers),
			Transports:   make(map[string]int),
		}
		for _, v := range s.viewers {
			e.Transports[v.Transport()]++
		}
		s.mu.Unlock()
		out = append(out, e)
	}
	return out
}

// Close ends the live session id (session.close). It reports whether the
// session was live. It returns once the session is persisted.
func (t *Table) Close(ctx context.Context, id string) (bool, error) { return t.CloseBy(ctx, id, "") }

// CloseBy is Close by the credential named by: the session's last
// event, session.closed {by}, says who closed it.
func (t *Table) CloseBy(ctx context.Context, id, by string) (bool, error) {
	t.mu.Lock()
	s := t.byID[id]
	t.mu.Unlock()
	if s == nil {
		return false, nil
	}
	// Closing stores the session's end: refuse it while nothing can be
	// stored (the session stays live, with everything withheld).
	if err := t.writable(); err != nil {
		return false, fmt.Errorf("close %s: %w", id, err)
	}
	s.mu.Lock()
	if !s.closing {
		s.emitLocked(wire.EventSessionClosed, map[string]string{"by": by})
	}
	s.mu.Unlock()
	if !t.release(releaseRef{s: s}, Closed) {
		return false, nil
	}
	select {
	case <-s.released:
		// endErr is written before released is closed.
		if s.endErr != nil {
			return true, fmt.Errorf("close %s: closed, but its end is not stored yet (it is once the storage takes writes): %v: %w", id, s.endErr, ErrStorageUnavailable)
		}
		return true, nil
	case <-ctx.Done():
		return true, ctx.Err()
	}
}

// Detach is the teardown of a departing viewer: each binding it held goes
// through the funnel with the generation its bind made.
func (t *Table) Detach(v contract.TransportID, bs []Binding) {
	for _, b := range bs {
		t.release(releaseRef{s: b.s, gen: b.gen, tid: v}, Disconnected)
	}
}

// Fence releases every live session with reason fenced (interrupting
// runs, persisting what can be): a cluster host that cannot reach the
// cluster lets go of its sessions before another host takes them over,
// so that no key has two live sessions. The table keeps serving: binds
// succeed again once the ownership store answers.
func (t *Table) Fence() {
	t.mu.Lock()
	all := make([]*Session, len(t.order))
	copy(all, t.order)
	t.mu.Unlock()
	for _, s := range all {
		t.release(releaseRef{s: s}, Fenced)
	}
}

// Shutdown releases every live session with reason shutdown (interrupting
// runs, persisting them) and waits for all teardowns, or ctx.
func (t *Table) Shutdown(ctx context.Context) error {
	t.mu.Lock()
	t.closed = true
	all := make([]*Session, len(t.order))
	copy(all, t.order)
	t.mu.Unlock()
	for _, s := range all {
		t.release(releaseRef{s: s}, Shutdown)
	}
	select {
	case <-t.sweep:
	default:
		close(t.sweep)
	}
	t.sweeper.Wait()
	done := make(chan struct{})
	go func() { t.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.journal.close()
		return ctx.Err()
	}
	// Every event is committed and handed to its viewers before the
	// sockets are closed.
	err := t.journal.flush(ctx)
	t.journal.close()
	return err
}
