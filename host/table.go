package host

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/store"
)

// Session table errors.
var (
	// ErrUnknownSession: no live session has that runtime id.
	ErrUnknownSession = errors.New("unknown session")
	// ErrStoredNotFound: no stored session has that key or title.
	ErrStoredNotFound = errors.New("stored session not found")
	// ErrNoLongerLive: the session was released while the call waited.
	ErrNoLongerLive = errors.New("session no longer live; retry resume")
	// ErrSessionBusy: a run is in flight and the call needs the session idle.
	ErrSessionBusy = errors.New("session busy")
	// ErrBuildFailed: the agent or the database failed while building a
	// live session.
	ErrBuildFailed = errors.New("resume or create failed")
	// ErrTableClosed: the table is shutting down.
	ErrTableClosed = errors.New("session table closed")
	// ErrLiveCap: the live-session cap is reached and no session can be
	// evicted (every one has a viewer or a run).
	ErrLiveCap = errors.New("live session cap reached")
)

// End reasons recorded for a stored session (SPEC §4). The first one
// recorded wins.
const (
	ReasonClosed       = "closed"
	ReasonDisconnected = "disconnected"
	ReasonOrphanReap   = "orphan_reap"
	ReasonIdleReap     = "idle_reap"
	ReasonEvicted      = "evicted"
	ReasonShutdown     = "shutdown"
)

// runStaleAfter is how long a parked session's run may go without progress
// before the reaper interrupts it (SPEC §5.4).
const runStaleAfter = 10 * time.Minute

// Viewer is a client connection that watches sessions: the table sends it
// event frames. Send must never block.
type Viewer interface {
	// ID is the viewer's transport identity.
	ID() contract.TransportID
	// Transport is the name of the transport it is on ("ws", …).
	Transport() string
	// Send queues one encoded frame for the client.
	Send(frame []byte)
}

// TableConfig configures a Table.
type TableConfig struct {
	Store  *store.Store
	Agents contract.AgentFactory
	// Ledger records key ownership; nil means a new MemLedger.
	Ledger Ledger
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
	Metrics *Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Table is the authoritative table of live sessions. Every path that
// removes a viewer, parks, reaps or closes a session goes through release,
// which compares the caller's view of the binding and swaps it.
type Table struct {
	store   *store.Store
	agents  contract.AgentFactory
	ledger  Ledger
	grace   time.Duration
	ring    int
	log     zerolog.Logger
	metrics *Metrics
	now     func() time.Time
	journal *journal
	ttl     time.Duration
	maxLive int
	sweep   chan struct{} // closed to stop the idle sweeper
	sweeper sync.WaitGroup

	wg sync.WaitGroup // teardowns and runs in flight

	mu    sync.Mutex // guards the fields below
	byID  map[string]*record
	byKey map[string]*record
	order []*record // creation order, for active_list
	// releasing holds records removed from the table whose teardown is
	// still persisting, by key; a resume of that key waits for them.
	releasing map[string]*record
	closed    bool
}

// NewTable returns an empty table.
func NewTable(cfg TableConfig) *Table {
	if cfg.Ledger == nil {
		cfg.Ledger = NewMemLedger()
	}
	if cfg.RingSize <= 0 {
		cfg.RingSize = 4096
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	t := &Table{
		store:   cfg.Store,
		agents:  cfg.Agents,
		ledger:  cfg.Ledger,
		grace:   cfg.OrphanGrace,
		ring:    cfg.RingSize,
		log:     cfg.Log,
		metrics: cfg.Metrics,
		now:     cfg.Now,
		journal: newJournal(cfg.Store, cfg.Retention, cfg.Log),
		ttl:     cfg.SessionTTL,
		maxLive: cfg.MaxLive,
		sweep:   make(chan struct{}),
		byID:    make(map[string]*record),
		byKey:   make(map[string]*record),
	}
	if t.ttl > 0 {
		t.sweeper.Add(1)
		go t.sweepIdle()
	}
	return t
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
		for _, ref := range t.candidates(func(r *record) bool { return now.Sub(r.lastActive) > t.ttl }) {
			t.release(ref, ReasonIdleReap)
		}
	}
}

// candidates returns, oldest activity first, the parked idle sessions
// (no viewer, no run) for which pick holds, with their generation now.
func (t *Table) candidates(pick func(*record) bool) []releaseRef {
	t.mu.Lock()
	recs := make([]*record, len(t.order))
	copy(recs, t.order)
	t.mu.Unlock()
	type cand struct {
		ref  releaseRef
		last time.Time
	}
	var cs []cand
	for _, rec := range recs {
		rec.mu.Lock()
		if len(rec.viewers) == 0 && rec.run == nil && !rec.closing && pick(rec) {
			cs = append(cs, cand{releaseRef{rec: rec, gen: rec.gen}, rec.lastActive})
		}
		rec.mu.Unlock()
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].last.Before(cs[j].last) })
	out := make([]releaseRef, len(cs))
	for i, c := range cs {
		out[i] = c.ref
	}
	return out
}

// makeRoomLocked reports whether one more live session fits under the
// cap. When it does not, it releases t.mu, evicts the oldest parked idle
// session and reports false (the caller retries); with nothing to evict it
// returns ErrLiveCap. t.mu is held on entry, and on return only when it
// reports true.
func (t *Table) makeRoomLocked() (bool, error) {
	if t.maxLive <= 0 || len(t.byID) < t.maxLive {
		return true, nil
	}
	t.mu.Unlock()
	for _, ref := range t.candidates(func(*record) bool { return true }) {
		if t.release(ref, ReasonEvicted) {
			return false, nil
		}
	}
	return false, fmt.Errorf("%d live sessions, none parked and idle: %w", t.maxLive, ErrLiveCap)
}

// newSessionID returns a runtime session id: 8 lower-case hex characters.
func newSessionID() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("host: crypto/rand failed: %v", err))
	}
	return hex.EncodeToString(b[:])
}

func newEpoch() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("host: crypto/rand failed: %v", err))
	}
	return hex.EncodeToString(b[:])
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
}

// Create stores a new session, builds its agent and binds v to it.
func (t *Table) Create(ctx context.Context, v Viewer, opt CreateOptions, reply Reply) error {
	now := t.now()
	sess := store.Session{Key: store.NewKey(now), Title: opt.Title, StartedAt: now}
	if opt.Parent != "" {
		if _, err := t.store.GetSession(ctx, opt.Parent); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("parent %s: %w", opt.Parent, ErrStoredNotFound)
			}
			return fmt.Errorf("parent %s: %v: %w", opt.Parent, err, ErrBuildFailed)
		}
		sess.Parent = opt.Parent
		sess.ForkCount = opt.ForkCount
		if sess.ForkCount < 0 {
			n, err := t.store.DisplayCount(ctx, opt.Parent)
			if err != nil {
				return fmt.Errorf("parent %s: %v: %w", opt.Parent, err, ErrBuildFailed)
			}
			sess.ForkCount = n
		}
	}
	sess.Epoch = newEpoch()
	// The agent is built before the row is stored, so a create that fails
	// leaves nothing behind.
	agent, err := t.newAgent(ctx, sess.Key)
	if err != nil {
		return err
	}
	if err := t.store.CreateSession(ctx, sess); err != nil {
		t.discard(agent)
		return fmt.Errorf("store session: %v: %w", err, ErrBuildFailed)
	}
	rec, err := t.build(ctx, sess, agent, opt.CloseOnDisconnect)
	if err != nil {
		return err
	}
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			t.discard(rec.agent)
			return ErrTableClosed
		}
		ok, err := t.makeRoomLocked()
		if err != nil {
			t.discard(rec.agent)
			return fmt.Errorf("create: %v: %w", err, ErrBuildFailed)
		}
		if ok {
			break
		}
	}
	t.registerLocked(rec)
	t.bindLocked(rec, v, "", reply)
	return nil
}

// newAgent builds the agent of a live session, outside every lock.
func (t *Table) newAgent(ctx context.Context, key string) (contract.Agent, error) {
	agent, err := t.agents.NewAgent(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("agent for %s: %v: %w", key, err, ErrBuildFailed)
	}
	t.metrics.AgentBuilds.Inc()
	return agent, nil
}

// build loads a stored session's display history and makes its record
// around agent (which it closes on failure), outside every lock.
func (t *Table) build(ctx context.Context, sess store.Session, agent contract.Agent, closeOnDisconnect bool) (*record, error) {
	id := newSessionID()
	seq, epoch, runs, err := t.recover(ctx, sess, id)
	if err != nil {
		t.discard(agent)
		return nil, fmt.Errorf("recover %s: %v: %w", sess.Key, err, ErrBuildFailed)
	}
	msgs, err := t.store.DisplayMessages(ctx, sess.Key)
	if err != nil {
		t.discard(agent)
		return nil, fmt.Errorf("load %s: %v: %w", sess.Key, err, ErrBuildFailed)
	}
	rec := &record{
		id:                id,
		key:               sess.Key,
		agent:             agent,
		closeOnDisconnect: closeOnDisconnect,
		startedAt:         sess.StartedAt,
		log:               t.log.With().Str("session_id", id).Str("session_key", sess.Key).Logger(),
		released:          make(chan struct{}),
		ringCap:           t.ring,
		viewers:           make(map[contract.TransportID]Viewer),
		journal:           t.journal,
		title:             sess.Title,
		messages:          msgs,
		runs:              runs,
		seq:               seq,
		ringStart:         seq + 1,
		epoch:             epoch,
		lastActive:        t.now(),
	}
	return rec, nil
}

// recover reads a stored session's event cursor from its journal and
// finishes the runs a previous host left running (killed mid-run): each is
// recorded interrupted, with the answer its journaled deltas streamed,
// stored and journaled like any interrupted run. The epoch stays as stored
// while the journal is intact; it changes only when events the session had
// sent are missing from the journal (an older database, or a lost file).
func (t *Table) recover(ctx context.Context, sess store.Session, id string) (seq uint64, epoch string, runs []runInfo, err error) {
	_, first, last, err := t.store.EventsSince(ctx, sess.Key, 1<<62, 1)
	if err != nil {
		return 0, "", nil, err
	}
	seq, epoch = max(sess.LastSeq, last), sess.Epoch
	if epoch == "" || last < sess.LastSeq || (sess.LastSeq > 0 && first == 0) {
		epoch = newEpoch()
	}
	stored, err := t.store.Runs(ctx, sess.Key)
	if err != nil {
		return 0, "", nil, err
	}
	for _, r := range stored {
		if r.Status == statusRunning {
			text, err := t.streamedText(ctx, sess.Key, r.StartSeq)
			if err != nil {
				return 0, "", nil, err
			}
			now := t.now()
			if err := t.store.AppendMessages(ctx, sess.Key, contract.Message{Role: contract.RoleAssistant, Text: text}); err != nil {
				return 0, "", nil, err
			}
			seq++
			params, _ := json.Marshal(eventParams{Type: "message.complete", SessionID: id, Seq: seq, Payload: map[string]string{"text": text, "status": statusInterrupted}})
			if err := t.store.AppendEvents(ctx, []store.Event{{Key: sess.Key, Seq: seq, Params: params}}, store.Retention{}); err != nil {
				return 0, "", nil, err
			}
			if err := t.store.EndRun(ctx, sess.Key, r.ID, statusInterrupted, now); err != nil {
				return 0, "", nil, err
			}
			r.Status, r.EndedAt = statusInterrupted, now
		}
		info := runInfo{RunID: r.ID, Status: r.Status, StartedAt: r.StartedAt.Unix()}
		if !r.EndedAt.IsZero() {
			at := r.EndedAt.Unix()
			info.EndedAt = &at
		}
		runs = append(runs, info)
	}
	if err := t.store.SetCursor(ctx, sess.Key, epoch, seq); err != nil {
		return 0, "", nil, err
	}
	return seq, epoch, runs, nil
}

// streamedText rebuilds what a run streamed from its journaled deltas.
func (t *Table) streamedText(ctx context.Context, key string, startSeq uint64) (string, error) {
	evs, _, _, err := t.store.EventsSince(ctx, key, startSeq, 0)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, e := range evs {
		var p struct {
			Type    string `json:"type"`
			Payload struct {
				Text string `json:"text"`
			} `json:"payload"`
		}
		if json.Unmarshal(e.Params, &p) != nil {
			continue
		}
		if p.Type == "message.complete" || p.Type == "message.start" {
			break
		}
		if p.Type == "message.delta" {
			b.WriteString(p.Payload.Text)
		}
	}
	return b.String(), nil
}

// discard closes an agent that was built but never registered (a losing
// resume, a failed build, or a table that closed meanwhile).
func (t *Table) discard(agent contract.Agent) {
	t.metrics.AgentDiscards.Inc()
	if err := agent.Close(); err != nil {
		t.log.Debug().Err(err).Msg("closing discarded agent")
	}
}

// registerLocked adds rec to the table and claims its key in the ledger.
func (t *Table) registerLocked(rec *record) {
	rev, err := t.ledger.Create(rec.key, Ownership{SessionID: rec.id})
	if err != nil {
		// The map and the in-memory ledger change together under t.mu,
		// so this is a bug, not a race.
		panic(fmt.Sprintf("host: ledger out of step with table: %v", err))
	}
	rec.rev = rev
	t.byID[rec.id] = rec
	t.byKey[rec.key] = rec
	t.order = append(t.order, rec)
	t.metrics.LiveSessions.Inc()
}

// Reply receives the snapshot of a bind while the session's lock is held:
// it must queue the response to the client without blocking, so that no
// event of the session can overtake it. The returned seq then orders it.
type Reply func(rec *record, snap Snapshot)

// bindLocked adds v as a viewer of rec, cancels a pending reap, bumps the
// binding generation and hands the snapshot to reply. It is called with
// t.mu held and returns with it released. The snapshot, the viewer's
// membership and the reply are done under rec.mu together, so the first
// event v receives after the snapshot has seq latest_seq+1.
func (t *Table) bindLocked(rec *record, v Viewer, resumed string, reply Reply) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.gen++
	if _, ok := rec.viewers[v.ID()]; !ok {
		rec.viewers[v.ID()] = v
		t.metrics.Viewers.Inc()
	}
	if rec.parkTimer != nil {
		rec.parkTimer.Stop()
		rec.parkTimer = nil
		t.metrics.ParkedSessions.Dec()
	}
	rec.reapPending = false
	rec.lastActive = t.now()
	t.updateLedgerLocked(rec)
	t.mu.Unlock()
	snap := rec.snapshotLocked()
	snap.Resumed = resumed
	reply(rec, snap)
}

// updateLedgerLocked records rec's binding generation in the ledger with
// the revision rec last saw.
func (t *Table) updateLedgerLocked(rec *record) {
	rev, err := t.ledger.Update(rec.key, Ownership{SessionID: rec.id, Gen: rec.gen}, rec.rev)
	if err != nil {
		panic(fmt.Sprintf("host: ledger out of step with table: %v", err))
	}
	rec.rev = rev
}

// Resume binds v to the live session of the stored key or title target,
// rebuilding it from the database when it is not live. Concurrent calls
// for one key converge on one live session: the agent is built outside
// the lock and a losing build is closed.
func (t *Table) Resume(ctx context.Context, v Viewer, target string, reply Reply) error {
	key := target
	if !store.ValidKey(target) {
		sess, err := t.store.FindByTitle(ctx, target)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("%q: %w", target, ErrStoredNotFound)
		case err != nil:
			return fmt.Errorf("find %q: %v: %w", target, err, ErrBuildFailed)
		}
		key = sess.Key
	}
	for attempt := 0; ; attempt++ {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return ErrTableClosed
		}
		if rec := t.byKey[key]; rec != nil {
			// Records in byKey are never closing: close removes them
			// under t.mu before marking them.
			t.bindLocked(rec, v, key, reply)
			return nil
		}
		t.mu.Unlock()

		sess, err := t.store.GetSession(ctx, key)
		if err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("%s: %w", key, ErrStoredNotFound)
			}
			return fmt.Errorf("load %s: %v: %w", key, err, ErrBuildFailed)
		}
		// Wait for a teardown of this key still persisting, so the
		// rebuild sees everything it wrote.
		if err := t.waitReleased(ctx, key); err != nil {
			return err
		}
		agent, err := t.newAgent(ctx, key)
		if err != nil {
			return err
		}
		rec, err := t.build(ctx, sess, agent, false)
		if err != nil {
			return err
		}
		if err := t.store.Reopen(ctx, key); err != nil {
			t.discard(rec.agent)
			return fmt.Errorf("reopen %s: %v: %w", key, err, ErrBuildFailed)
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			t.discard(rec.agent)
			return ErrTableClosed
		}
		if t.byKey[key] == nil && t.releasing[key] == nil {
			ok, err := t.makeRoomLocked()
			if err != nil {
				t.discard(rec.agent)
				return fmt.Errorf("resume: %v: %w", err, ErrBuildFailed)
			}
			if !ok {
				t.discard(rec.agent)
				continue
			}
		}
		if winner := t.byKey[key]; winner != nil || t.releasing[key] != nil {
			// Another resume won the race (or a teardown started): close
			// our build and bind to the winner on the next pass.
			t.mu.Unlock()
			t.discard(rec.agent)
			if attempt > 100 {
				return fmt.Errorf("%s: %w", key, ErrNoLongerLive)
			}
			continue
		}
		t.registerLocked(rec)
		t.bindLocked(rec, v, key, reply)
		return nil
	}
}

// waitReleased waits until no teardown of key is in progress.
func (t *Table) waitReleased(ctx context.Context, key string) error {
	for {
		t.mu.Lock()
		rec := t.releasing[key]
		t.mu.Unlock()
		if rec == nil {
			return nil
		}
		select {
		case <-rec.released:
		case <-ctx.Done():
			return fmt.Errorf("%s: %v: %w", key, ctx.Err(), ErrNoLongerLive)
		}
	}
}

// Activate binds v to the live session id.
func (t *Table) Activate(v Viewer, id string, reply Reply) error {
	t.mu.Lock()
	rec := t.byID[id]
	if rec == nil {
		t.mu.Unlock()
		return fmt.Errorf("%s: %w", id, ErrUnknownSession)
	}
	t.bindLocked(rec, v, "", reply)
	return nil
}

// Lookup returns the live record with runtime id, or ErrUnknownSession.
func (t *Table) Lookup(id string) (*record, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec := t.byID[id]
	if rec == nil {
		return nil, fmt.Errorf("%s: %w", id, ErrUnknownSession)
	}
	return rec, nil
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
	recs := make([]*record, len(t.order))
	copy(recs, t.order)
	t.mu.Unlock()
	out := make([]ActiveEntry, 0, len(recs))
	for _, rec := range recs {
		rec.mu.Lock()
		e := ActiveEntry{
			ID:           rec.id,
			SessionKey:   rec.key,
			Title:        rec.title,
			Status:       rec.statusLocked(),
			MessageCount: len(rec.messages) + rec.inflightRowsLocked(),
			StartedAt:    rec.startedAt.Unix(),
			LastActive:   rec.lastActive.Unix(),
			Viewers:      len(rec.viewers),
			Transports:   make(map[string]int),
		}
		for _, v := range rec.viewers {
			e.Transports[v.Transport()]++
		}
		rec.mu.Unlock()
		out = append(out, e)
	}
	return out
}

// releaseRef is what a teardown caller saw: the record, its binding
// generation then, and the departing transport (zero for timers and
// explicit closes).
type releaseRef struct {
	rec *record
	gen uint64
	tid contract.TransportID
}

// release is the one teardown funnel (SPEC §5.2). It compares the caller's
// view (record identity, binding generation, departing transport) with the
// table and swaps the binding:
//
//   - a record no longer in the table, or a departing transport that is
//     not a viewer: nothing happens;
//   - a departing viewer is dropped; when it was the last one the session
//     is parked (reap timer), or closed at once for close_on_disconnect
//     with no run in flight — but only if nobody bound since the caller
//     looked; a stale caller only drops its own viewer (and parks);
//   - a reap (orphan_reap) happens only if the generation is unchanged,
//     no viewer is bound and no run is in flight;
//   - closed and shutdown close unconditionally.
//
// Closing removes the record under the lock and marks it closing; the slow
// part (interrupting the run, persisting, closing the agent) runs after.
// It reports whether this call removed the record.
func (t *Table) release(ref releaseRef, why string) bool {
	rec := ref.rec
	t.mu.Lock()
	if t.byID[rec.id] != rec {
		t.mu.Unlock()
		if !ref.tid.IsZero() || why == ReasonOrphanReap {
			t.metrics.CASConflicts.Inc()
		}
		return false
	}
	rec.mu.Lock()
	current := ref.gen == rec.gen
	closeNow := false
	endReason := why
	switch why {
	case ReasonClosed, ReasonShutdown:
		closeNow = true
	case ReasonIdleReap, ReasonEvicted:
		// Only a parked, idle session nobody bound since it was picked.
		closeNow = current && len(rec.viewers) == 0 && rec.run == nil
		if !closeNow {
			t.metrics.CASConflicts.Inc()
		}
	case ReasonDisconnected:
		if _, ok := rec.viewers[ref.tid]; !ok {
			rec.mu.Unlock()
			t.mu.Unlock()
			t.metrics.CASConflicts.Inc()
			return false
		}
		delete(rec.viewers, ref.tid)
		t.metrics.Viewers.Dec()
		rec.gen++
		t.updateLedgerLocked(rec)
		if !current {
			t.metrics.CASConflicts.Inc()
		}
		if len(rec.viewers) > 0 {
			break
		}
		if current && rec.closeOnDisconnect && rec.run == nil {
			closeNow = true
			break
		}
		t.parkLocked(rec)
	case ReasonOrphanReap:
		if !current || len(rec.viewers) > 0 {
			t.metrics.CASConflicts.Inc()
			break // stale timer
		}
		if rec.run != nil {
			rec.reapPending = true
			if t.now().Sub(rec.run.progress) < runStaleAfter {
				// Still streaming: look again after another grace.
				t.parkLocked(rec)
			} else if !rec.run.interrupted {
				rec.run.interrupted = true
				rec.run.cancel()
			}
			break
		}
		closeNow = true
	case reasonSettled:
		// A run ended: apply what was deferred while it streamed.
		if !current || len(rec.viewers) > 0 {
			break
		}
		switch {
		case rec.closeOnDisconnect:
			closeNow, endReason = true, ReasonDisconnected
		case rec.reapPending:
			closeNow, endReason = true, ReasonOrphanReap
		}
	}
	if !closeNow {
		rec.mu.Unlock()
		t.mu.Unlock()
		return false
	}
	// Swap: remove the record; nobody can bind it again.
	delete(t.byID, rec.id)
	delete(t.byKey, rec.key)
	for i, r := range t.order {
		if r == rec {
			t.order = append(t.order[:i], t.order[i+1:]...)
			break
		}
	}
	if err := t.ledger.Delete(rec.key, rec.rev); err != nil {
		panic(fmt.Sprintf("host: ledger out of step with table: %v", err))
	}
	if t.releasing == nil {
		t.releasing = make(map[string]*record)
	}
	t.releasing[rec.key] = rec
	rec.closing = true
	if rec.parkTimer != nil {
		rec.parkTimer.Stop()
		rec.parkTimer = nil
		t.metrics.ParkedSessions.Dec()
	}
	// The viewers stay on the closing record until its run has ended, so
	// they still get the run's message.complete; finish drops them.
	run := rec.run
	if run != nil && !run.interrupted {
		run.interrupted = true
		run.cancel()
	}
	rec.mu.Unlock()
	t.metrics.LiveSessions.Dec()
	t.wg.Add(1)
	t.mu.Unlock()

	rec.log.Debug().Str("reason", endReason).Msg("releasing session")
	go t.finish(rec, run, endReason)
	return true
}

// reasonSettled is the internal release reason used when a run ends.
const reasonSettled = "settled"

// parkLocked starts the reap timer of a session that has no viewer left.
// Both t.mu and rec.mu are held.
func (t *Table) parkLocked(rec *record) {
	if rec.parkTimer != nil {
		rec.parkTimer.Stop()
		t.metrics.ParkedSessions.Dec()
	}
	rec.parkTimer = nil
	if t.grace <= 0 {
		// Parked forever: a marker timer that never fires.
		rec.parkTimer = time.NewTimer(time.Duration(1<<63 - 1))
		t.metrics.ParkedSessions.Inc()
		return
	}
	ref := releaseRef{rec: rec, gen: rec.gen}
	rec.parkTimer = time.AfterFunc(t.grace, func() { t.release(ref, ReasonOrphanReap) })
	t.metrics.ParkedSessions.Inc()
}

// finish is the slow part of a teardown, outside every lock: wait for the
// run, persist, close the agent, then let waiting resumes rebuild.
func (t *Table) finish(rec *record, run *run, reason string) {
	defer t.wg.Done()
	if run != nil {
		<-run.done
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec.mu.Lock()
	epoch, seq := rec.epoch, rec.seq
	t.metrics.Viewers.Sub(float64(len(rec.viewers)))
	rec.viewers = nil
	rec.mu.Unlock()
	if err := t.store.SetCursor(ctx, rec.key, epoch, seq); err != nil {
		rec.log.Error().Err(err).Msg("persisting event cursor")
	}
	if err := t.store.End(ctx, rec.key, reason, t.now()); err != nil {
		rec.log.Error().Err(err).Msg("recording session end")
	}
	if err := rec.agent.Close(); err != nil {
		rec.log.Debug().Err(err).Msg("closing agent")
	}
	t.metrics.AgentCloses.Inc()
	t.mu.Lock()
	if t.releasing[rec.key] == rec {
		delete(t.releasing, rec.key)
	}
	t.mu.Unlock()
	close(rec.released)
	rec.log.Info().Str("reason", reason).Msg("session released")
}

// Close ends the live session id (session.close). It reports whether the
// session was live. It returns once the session is persisted.
func (t *Table) Close(ctx context.Context, id string) (bool, error) {
	t.mu.Lock()
	rec := t.byID[id]
	t.mu.Unlock()
	if rec == nil {
		return false, nil
	}
	if !t.release(releaseRef{rec: rec}, ReasonClosed) {
		return false, nil
	}
	select {
	case <-rec.released:
		return true, nil
	case <-ctx.Done():
		return true, ctx.Err()
	}
}

// Detach is the teardown of a departing viewer: every session v was bound
// to goes through the funnel with the generation seen now.
func (t *Table) Detach(v contract.TransportID, recs []*record) {
	for _, rec := range recs {
		rec.mu.Lock()
		gen := rec.gen
		rec.mu.Unlock()
		t.release(releaseRef{rec: rec, gen: gen, tid: v}, ReasonDisconnected)
	}
}

// Shutdown releases every live session with reason shutdown (interrupting
// runs, persisting them) and waits for all teardowns, or ctx.
func (t *Table) Shutdown(ctx context.Context) error {
	t.mu.Lock()
	t.closed = true
	recs := make([]*record, len(t.order))
	copy(recs, t.order)
	t.mu.Unlock()
	for _, rec := range recs {
		t.release(releaseRef{rec: rec}, ReasonShutdown)
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
