package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
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
	s, err := t.build(ctx, sess, ag, opt.CloseOnDisconnect)
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
		ok, err := t.makeRoomLocked()
		if err != nil {
			t.discard(s.agent)
			return fmt.Errorf("create: %v: %w", err, ErrBuildFailed)
		}
		if ok {
			break
		}
	}
	return t.claimLocked(ctx, s, v, "", reply)
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

// build loads a stored session's display history and makes its session
// around ag (which it closes on failure), outside every lock.
func (t *Table) build(ctx context.Context, sess store.Session, ag agent.Agent, closeOnDisconnect bool) (*Session, error) {
	id := contract.RandomHex(4)
	seq, epoch, runs, err := t.recover(ctx, sess, id)
	if err != nil {
		t.discard(ag)
		return nil, storageErr("recover "+sess.Key, err, ErrBuildFailed)
	}
	msgs, err := t.store.DisplayMessages(ctx, sess.Key)
	if err != nil {
		t.discard(ag)
		return nil, fmt.Errorf("load %s: %v: %w", sess.Key, err, ErrBuildFailed)
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

// claimLocked registers the new session s with v as its first viewer:
// it marks the key claimed, records the owner in the ownership store
// (outside the lock), then adds s to the table and answers reply. t.mu is
// held on entry and released on return. A store that refuses the claim
// (another owner, or unreachable) makes it fail; s's agent is closed. A
// table that closed meanwhile gets the claim given back (again outside
// the lock) and ErrTableClosed.
func (t *Table) claimLocked(ctx context.Context, s *Session, v Viewer, resumed string, reply Reply) error {
	c := &claim{done: make(chan struct{})}
	t.claims[s.key] = c
	t.mu.Unlock()
	defer close(c.done)

	// Nobody else knows s yet: its first binding needs no slot.
	s.gen = 1
	s.viewers[v.ID()] = v
	octx, cancel := context.WithTimeout(ctx, ownersTimeout)
	rev, err := t.owners.Create(octx, s.key, s.ownerLocked())
	cancel()

	t.mu.Lock()
	delete(t.claims, s.key)
	closed := t.closed
	if err != nil || closed {
		t.mu.Unlock()
		if err == nil {
			// The table closed meanwhile: give the claim back, outside
			// the table lock and within a bound of its own.
			err = ErrTableClosed
			dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), ownersTimeout)
			if derr := t.owners.Delete(dctx, s.key, rev); derr != nil {
				t.log.Warn().Err(derr).Str("session_key", s.key).Msg("giving back an ownership claim")
			}
			dcancel()
		}
		t.discard(s.agent)
		return ownersError("claim "+s.key, err)
	}
	s.rev = rev
	t.byID[s.id] = s
	t.byKey[s.key] = s
	t.order = append(t.order, s)
	t.metrics.LiveSessions.Inc()
	t.metrics.Viewers.Inc()
	s.mu.Lock()
	t.mu.Unlock()
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
	case errors.Is(err, ErrConflict):
		return fmt.Errorf("%s: %v: %w", op, err, ErrOwnedElsewhere)
	default:
		return fmt.Errorf("%s: %v: %w", op, err, ErrOwnersUnavailable)
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
	octx, cancel := context.WithTimeout(ctx, ownersTimeout)
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
			continue
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
		// Rebuilding writes (the cursor, the reopening): refuse it while
		// nothing can be stored.
		if err := t.writable(); err != nil {
			return fmt.Errorf("resume %s: %w", key, err)
		}
		var state json.RawMessage
		if sess.AgentState != "" {
			state = json.RawMessage(sess.AgentState)
		}
		ag, err := t.newAgent(ctx, key, state)
		if err != nil {
			return err
		}
		if now := agentState(ag, state); now != sess.AgentState {
			if err := t.store.SetAgentState(ctx, key, now); err != nil {
				t.discard(ag)
				return storageErr("store agent state of "+key, err, ErrBuildFailed)
			}
		}
		s, err := t.build(ctx, sess, ag, false)
		if err != nil {
			return err
		}
		if err := t.store.Reopen(ctx, key); err != nil {
			t.discard(s.agent)
			return storageErr("reopen "+key, err, ErrBuildFailed)
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			t.discard(s.agent)
			return ErrTableClosed
		}
		if t.byKey[key] != nil || t.claims[key] != nil || t.releasing[key] != nil {
			// Another resume won the race (or a teardown started): close
			// our build and bind to the winner on the next pass.
			t.mu.Unlock()
			t.discard(s.agent)
			continue
		}
		ok, err := t.makeRoomLocked()
		if err != nil {
			t.discard(s.agent)
			return fmt.Errorf("resume: %v: %w", err, ErrBuildFailed)
		}
		if !ok {
			t.discard(s.agent)
			continue
		}
		if t.byKey[key] != nil || t.claims[key] != nil || t.releasing[key] != nil {
			t.mu.Unlock()
			t.discard(s.agent)
			continue
		}
		return t.claimLocked(ctx, s, v, key, reply)
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
