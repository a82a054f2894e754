package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/ownership"
	"github.com/tether-agent/tether/host/store"
)

// Reply receives the snapshot of a bind while the session's lock is held:
// it must hand the encoded response to send without blocking, so that no
// event of the session can overtake it (send queues it to the viewer at
// once, or behind the session's events not yet stored). b is the viewer's
// binding, to be presented to Detach when the viewer leaves.
type Reply func(b Binding, snap Snapshot, send func(frame []byte))

// Create stores a new session, builds its agent and binds v to it.
func (t *Table) Create(ctx context.Context, v Viewer, opt CreateOptions, reply Reply) error {
	if err := t.writable(); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	now := t.now()
	sess := store.Session{Key: t.newKey(now), Title: opt.Title, StartedAt: now}
	if opt.Parent != "" {
		if _, err := t.store.GetSession(ctx, opt.Parent); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("parent %s: %w", opt.Parent, ErrStoredNotFound)
			}
			return storageErr("parent "+opt.Parent, err, ErrBuildFailed)
		}
		sess.Parent = opt.Parent
		sess.ForkCount = opt.ForkCount
		if sess.ForkCount < 0 {
			n, err := t.store.DisplayCount(ctx, opt.Parent)
			if err != nil {
				return storageErr("parent "+opt.Parent, err, ErrBuildFailed)
			}
			sess.ForkCount = n
		}
	}
	sess.Epoch = contract.RandomHex(8)
	// The agent is built before the row is stored, so a create that fails
	// leaves nothing behind. A key is the second plus 24 random bits, so
	// two creates in one second can draw the same key: the loser draws
	// again (with a new agent, which may have been told the key).
	var ag agent.Agent
	for attempt := 1; ; attempt++ {
		var err error
		ag, err = t.newAgent(ctx, sess.Key, opt.AgentState)
		if err != nil {
			return err
		}
		sess.AgentState = agentState(ag, opt.AgentState)
		err = t.store.CreateSession(ctx, sess)
		if err == nil {
			break
		}
		t.discard(ag)
		if !errors.Is(err, store.ErrExists) || attempt == maxKeyDraws {
			return storageErr("store session", err, ErrBuildFailed)
		}
		sess.Key = t.newKey(now)
	}
	s, err := t.build(ctx, sess, ag, opt.CloseOnDisconnect, contract.RandomHex(4), storageErr)
	if err != nil {
		return err
	}
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			t.discard(s.agent)
			return ErrTableClosed
		}
		if !t.fullLocked() {
			break
		}
		t.mu.Unlock()
		if err := t.evictOne(); err != nil {
			t.discard(s.agent)
			return fmt.Errorf("create: %v: %w", err, ErrBuildFailed)
		}
	}
	return t.claimAndUnlock(ctx, s, v, "", reply)
}

// newAgent builds the agent of a live session, outside every lock.
func (t *Table) newAgent(ctx context.Context, key string, state json.RawMessage) (agent.Agent, error) {
	ag, err := t.agents.NewAgent(ctx, key, state)
	if err != nil {
		return nil, fmt.Errorf("agent for %s: %v: %w", key, err, ErrBuildFailed)
	}
	t.metrics.AgentBuilds.Inc()
	return ag, nil
}

// agentState is what ag keeps across lives (Stateful), else what it was
// given.
func agentState(ag agent.Agent, given json.RawMessage) string {
	if st, ok := ag.(agent.Stateful); ok {
		return string(st.State())
	}
	return string(given)
}

// build loads a stored session's display history and makes its session,
// with runtime id id, around ag (which it closes on failure), outside every lock.
// A failed read or write of the store is mapped by storeErr (storageErr,
// or resumeStorageErr for a resume).
func (t *Table) build(ctx context.Context, sess store.Session, ag agent.Agent, closeOnDisconnect bool, id string, storeErr func(op string, err, other error) error) (*Session, error) {
	seq, epoch, runs, err := t.recover(ctx, sess, id)
	if err != nil {
		t.discard(ag)
		return nil, storeErr("recover "+sess.Key, err, ErrBuildFailed)
	}
	msgs, err := t.store.DisplayMessages(ctx, sess.Key)
	if err != nil {
		t.discard(ag)
		return nil, storeErr("load "+sess.Key, err, ErrBuildFailed)
	}
	_, turns := ag.(agent.Turner)
	reset := false
	if st, ok := ag.(agent.Stateful); ok {
		reset = st.ContextReset()
	}
	state := agentState(ag, json.RawMessage(sess.AgentState))
	return &Session{
		t:                 t,
		turns:             turns,
		agentReset:        reset,
		agentState:        state,
		perms:             make(map[string]*permission),
		id:                id,
		key:               sess.Key,
		agent:             ag,
		closeOnDisconnect: closeOnDisconnect,
		startedAt:         sess.StartedAt,
		log:               t.log.With().Str("session_id", id).Str("session_key", sess.Key).Logger(),
		released:          make(chan struct{}),
		ringCap:           t.ring,
		op:                make(chan struct{}, 1),
		viewers:           make(map[contract.TransportID]Viewer),
		title:             sess.Title,
		messages:          msgs,
		runs:              runs,
		seq:               seq,
		committed:         seq,
		ringStart:         seq + 1,
		epoch:             epoch,
		lastActive:        t.now(),
	}, nil
}

// discard closes an agent that was built but never registered (a losing
// resume, a failed build, or a table that closed meanwhile).
func (t *Table) discard(ag agent.Agent) {
	t.metrics.AgentDiscards.Inc()
	if err := ag.Close(); err != nil {
		t.log.Debug().Err(err).Msg("closing discarded agent")
	}
}

// claimAndUnlock registers the new session s with v as its first viewer:
// it marks the key claimed, records the owner in the ownership store
// (outside the lock), then adds s to the table and answers reply. t.mu is
// held on entry and released on return. A store that refuses the claim
// (another owner, or unreachable) makes it fail; s's agent is closed. A
// table that closed meanwhile gets the claim given back (again outside
// the lock) and ErrTableClosed.
func (t *Table) claimAndUnlock(ctx context.Context, s *Session, v Viewer, resumed string, reply Reply) error {
	c := &claim{done: make(chan struct{})}
	t.claims[s.key] = c
	t.mu.Unlock()

	// Nobody else knows s yet: its first binding needs no slot.
	s.gen = 1
	s.viewers[v.ID()] = v
	octx, cancel := context.WithTimeout(ctx, t.ownersTimeout)
	rev, err := t.owners.Create(octx, s.key, s.ownerLocked())
	cancel()
	if err != nil {
		t.unclaim(s.key, c)
		t.discard(s.agent)
		return ownersError("claim "+s.key, err)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.discard(s.agent)
		t.giveBack(ctx, s.key, rev)
		t.unclaim(s.key, c)
		return ErrTableClosed
	}
	return t.registerAndUnlock(ctx, s, v, resumed, rev, c, reply)
}

// registerAndUnlock adds s, whose key the ownership store recorded at rev
// with v as its one viewer, to the table, ends the table claim c and
// answers reply. t.mu is held on entry and released on return.
func (t *Table) registerAndUnlock(_ context.Context, s *Session, v Viewer, resumed string, rev uint64, c *claim, reply Reply) error {
	s.gen = 1
	s.viewers[v.ID()] = v
	s.rev = rev
	if t.claims[s.key] == c {
		delete(t.claims, s.key)
	}
	t.byID[s.id] = s
	t.byKey[s.key] = s
	t.order = append(t.order, s)
	t.metrics.LiveSessions.Inc()
	t.metrics.Viewers.Inc()
	s.mu.Lock()
	t.mu.Unlock()
	close(c.done)
	defer s.mu.Unlock()
	snap := s.snapshotLocked()
	snap.Resumed = resumed
	reply(Binding{s: s, gen: s.gen}, snap, s.sendLocked(v))
	return nil
}

// ownersError maps an ownership store error to the table's.
func ownersError(op string, err error) error {
	switch {
	case errors.Is(err, ErrTableClosed):
		return err
	case errors.Is(err, ownership.ErrConflict):
		return fmt.Errorf("%s: %w: %w", op, err, ErrOwnedElsewhere)
	default:
		return fmt.Errorf("%s: %w: %w", op, err, ErrOwnersUnavailable)
	}
}

// errGone: the session left the table before a bind got its slot.
var errGone = errors.New("session left the table")

// bind adds v as a viewer of s: it takes s's slot, records the new
// binding in the ownership store (outside every lock), then adds the
// viewer, cancels a pending reap and answers reply under s.mu, so the
// first event v receives after the snapshot has seq latest_seq+1. It
// returns errGone when s left the table first.
func (t *Table) bind(ctx context.Context, s *Session, v Viewer, resumed string, reply Reply) error {
	if err := s.acquire(ctx); err != nil {
		return fmt.Errorf("%s: %v: %w", s.id, err, ErrNoLongerLive)
	}
	defer s.releaseOp()
	t.mu.Lock()
	live := t.byID[s.id] == s
	t.mu.Unlock()
	if !live {
		return errGone
	}
	s.mu.Lock()
	next := s.ownerLocked()
	if _, ok := s.viewers[v.ID()]; !ok {
		next.Viewers = append(next.Viewers, v.ID())
	}
	next.Gen++
	rev := s.rev
	s.mu.Unlock()
	octx, cancel := context.WithTimeout(ctx, t.ownersTimeout)
	newRev, err := t.owners.Update(octx, s.key, next, rev)
	cancel()
	if err != nil {
		return ownersError("bind "+s.key, err)
	}
	// Only a teardown removes s from the table, and teardowns wait for
	// the slot this bind holds.
	s.rev = newRev
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	if _, ok := s.viewers[v.ID()]; !ok {
		s.viewers[v.ID()] = v
		t.metrics.Viewers.Inc()
	}
	if s.parkTimer != nil {
		s.parkTimer.Stop()
		s.parkTimer = nil
		t.metrics.ParkedSessions.Dec()
	}
	s.reapPending = false
	s.lastActive = t.now()
	snap := s.snapshotLocked()
	snap.Resumed = resumed
	reply(Binding{s: s, gen: s.gen}, snap, s.sendLocked(v))
	return nil
}

// Resume binds v to the live session of the stored key or title target,
// rebuilding it from the store when it is not live. Concurrent calls for
// one key converge on one live session: the first claims the key — in the
// table and then in the ownership store — before it builds anything, and
// the others wait for its claim and bind to what it made. Claiming first
// means that a store shared by several hosts decides which host rebuilds
// a key before any host writes to the key's stored session (recovering
// an interrupted run writes).
func (t *Table) Resume(ctx context.Context, v Viewer, target string, reply Reply) error {
	key := target
	if !store.ValidKey(target) {
		if err := t.storeReachable(ctx, fmt.Sprintf("find %q", target)); err != nil {
			return err
		}
		sess, err := t.store.FindByTitle(ctx, target)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("%q: %w", target, ErrStoredNotFound)
		case err != nil:
			return resumeStorageErr(fmt.Sprintf("find %q", target), err, ErrBuildFailed)
		}
		key = sess.Key
	}
	for attempt := 0; ; attempt++ {
		if attempt > 100 {
			return fmt.Errorf("%s: %w", key, ErrNoLongerLive)
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return ErrTableClosed
		}
		if s := t.byKey[key]; s != nil {
			t.mu.Unlock()
			if err := t.bind(ctx, s, v, key, reply); !errors.Is(err, errGone) {
				return err
			}
			continue // released meanwhile: rebuild
		}
		if c := t.claims[key]; c != nil {
			t.mu.Unlock()
			select {
			case <-c.done:
			case <-ctx.Done():
				return fmt.Errorf("%s: %v: %w", key, ctx.Err(), ErrNoLongerLive)
			}
			if c.held != nil {
				return c.held
			}
			continue
		}
		if t.releasing[key] != nil {
			// Wait for a teardown of this key still persisting, so the
			// rebuild sees everything it wrote.
			t.mu.Unlock()
			if err := t.waitReleased(ctx, key); err != nil {
				return err
			}
			continue
		}
		t.mu.Unlock()

		// Rebuilding reads the session's history and writes: on a
		// cluster whose servers do not answer now, say so at once.
		if err := t.storeReachable(ctx, "load "+key); err != nil {
			return err
		}
		sess, err := t.store.GetSession(ctx, key)
		if err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("%s: %w", key, ErrStoredNotFound)
			}
			return resumeStorageErr("load "+key, err, ErrBuildFailed)
		}
		// Rebuilding writes (the cursor, the reopening): refuse it while
		// nothing can be stored.
		if err := t.resumeWritable(); err != nil {
			return fmt.Errorf("resume %s: %w", key, err)
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return ErrTableClosed
		}
		if t.byKey[key] != nil || t.claims[key] != nil || t.releasing[key] != nil {
			t.mu.Unlock()
			continue // another resume or a teardown came first
		}
		if t.fullLocked() {
			t.mu.Unlock()
			if err := t.evictOne(); err != nil {
				return fmt.Errorf("resume: %v: %w", err, ErrBuildFailed)
			}
			continue
		}
		c := &claim{done: make(chan struct{})}
		t.claims[key] = c
		t.mu.Unlock()
		return t.rebuild(ctx, sess, v, c, reply)
	}
}

// rebuild makes the live session of the stored session sess, whose key
// the caller claimed in the table (c): it records the owner in the
// ownership store, then builds the agent and the session and binds v to
// it. It gives the claim up — in the store and in the table — when any
// step fails.
func (t *Table) rebuild(ctx context.Context, sess store.Session, v Viewer, c *claim, reply Reply) error {
	key := sess.Key
	id := contract.RandomHex(4)
	first := ownership.Owner{Host: t.host, Instance: t.instance, SessionID: id, Gen: 1, Viewers: []contract.TransportID{v.ID()}}
	octx, cancel := context.WithTimeout(ctx, t.ownersTimeout)
	rev, err := t.owners.Create(octx, key, first)
	cancel()
	if err != nil {
		err = ownersError("claim "+key, err)
		var held *ownership.HeldError
		if errors.As(err, &held) {
			c.held = err // closed by unclaim: the waiters read it after
		}
		t.unclaim(key, c)
		return err
	}
	// Read the stored session again now that the key is ours: another
	// host may have stored its end (cursor, agent state) between the
	// first read and its giving the key back.
	if fresh, ferr := t.store.GetSession(ctx, key); ferr != nil {
		err = resumeStorageErr("load "+key, ferr, ErrBuildFailed)
		if errors.Is(ferr, store.ErrNotFound) {
			err = fmt.Errorf("%s: %w", key, ErrStoredNotFound)
		}
	} else {
		sess = fresh
	}
	var s *Session
	if err == nil {
		s, err = t.buildClaimed(ctx, sess, id)
	}
	if err == nil {
		t.mu.Lock()
		if !t.closed {
			return t.registerAndUnlock(ctx, s, v, key, rev, c, reply)
		}
		t.mu.Unlock()
		t.discard(s.agent)
		err = ErrTableClosed
	}
	t.giveBack(ctx, key, rev)
	t.unclaim(key, c)
	return err
}

// buildClaimed builds the agent and the live session of the claimed
// stored session sess, with runtime id id, and reopens it in the store.
func (t *Table) buildClaimed(ctx context.Context, sess store.Session, id string) (*Session, error) {
	key := sess.Key
	var state json.RawMessage
	if sess.AgentState != "" {
		state = json.RawMessage(sess.AgentState)
	}
	ag, err := t.newAgent(ctx, key, state)
	if err != nil {
		return nil, err
	}
	if now := agentState(ag, state); now != sess.AgentState {
		if err := t.store.SetAgentState(ctx, key, now); err != nil {
			t.discard(ag)
			return nil, resumeStorageErr("store agent state of "+key, err, ErrBuildFailed)
		}
	}
	s, err := t.build(ctx, sess, ag, false, id, resumeStorageErr)
	if err != nil {
		return nil, err
	}
	if err := t.store.Reopen(ctx, key); err != nil {
		t.discard(s.agent)
		return nil, resumeStorageErr("reopen "+key, err, ErrBuildFailed)
	}
	return s, nil
}

// unclaim removes the table claim c of key and wakes its waiters.
func (t *Table) unclaim(key string, c *claim) {
	t.mu.Lock()
	if t.claims[key] == c {
		delete(t.claims, key)
	}
	t.mu.Unlock()
	close(c.done)
}

// giveBack deletes the ownership entry of key at rev, outside every lock
// and within a bound of its own (a claim that came to nothing).
func (t *Table) giveBack(ctx context.Context, key string, rev uint64) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.ownersTimeout)
	defer cancel()
	if err := t.owners.Delete(dctx, key, rev); err != nil {
		t.log.Warn().Err(err).Str("session_key", key).Msg("giving back an ownership claim")
	}
}

// waitReleased waits until no teardown of key is in progress.
func (t *Table) waitReleased(ctx context.Context, key string) error {
	for {
		t.mu.Lock()
		s := t.releasing[key]
		t.mu.Unlock()
		if s == nil {
			return nil
		}
		select {
		case <-s.released:
		case <-ctx.Done():
			return fmt.Errorf("%s: %v: %w", key, ctx.Err(), ErrNoLongerLive)
		}
	}
}
