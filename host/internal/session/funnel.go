package session

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/ownership"
	"github.com/tether-agent/tether/host/store"
)

// Reason is why a teardown was asked for. The exported ones are the end
// reasons recorded for a stored session; the first one recorded wins.
type Reason uint8

// Teardown reasons.
const (
	// Disconnected: a viewer left (its socket closed, its transport died
	// or was unloaded). Recorded when it closes a close_on_disconnect
	// session.
	Disconnected Reason = iota + 1
	// OrphanReap: the reap timer of a parked session fired.
	OrphanReap
	// IdleReap: a parked, idle session outlived the session TTL.
	IdleReap
	// Evicted: a parked, idle session made room under the live cap.
	Evicted
	// Closed: session.close.
	Closed
	// Shutdown: the host is stopping.
	Shutdown
	// Fenced: a cluster host lost the cluster (no heartbeat for half its
	// TTL) and lets go of its sessions before another host takes them.
	Fenced
	// settled: a run ended; what was deferred while it streamed applies
	// now. Never recorded itself.
	settled
)

// String is the end reason as stored and listed.
func (r Reason) String() string {
	switch r {
	case Disconnected:
		return "disconnected"
	case OrphanReap:
		return "orphan_reap"
	case IdleReap:
		return "idle_reap"
	case Evicted:
		return "evicted"
	case Closed:
		return "closed"
	case Shutdown:
		return "shutdown"
	case Fenced:
		return "fenced"
	case settled:
		return "settled"
	}
	return "unknown"
}

// view is what a teardown caller's expectation finds when compared with
// the session now: the input of decide.
type view struct {
	// live: the session is still in the table (not released since).
	live bool
	// current: the caller's binding generation is the session's.
	current bool
	// viewer: the departing transport is bound to the session.
	viewer bool
	// viewers is the number of viewers bound now, the departing one
	// included.
	viewers int
	// run: a run is in flight; runStale: it made no progress for
	// runStaleAfter; runInterrupted: it was asked to stop already;
	// runAsking: it waits for an answer to a permission request.
	run, runStale, runInterrupted, runAsking bool
	closeOnDisconnect                        bool
	// reapPending: the reap timer fired while a run streamed.
	reapPending bool
}

// verdict is what decide allows a teardown to do.
type verdict struct {
	// drop removes the departing viewer (a new binding generation).
	drop bool
	// park starts the session's reap timer again (it has no viewer).
	park bool
	// close removes the session from the table and finishes it, with
	// end as its end reason.
	close bool
	end   Reason
	// interrupt asks the run in flight to stop (once).
	interrupt bool
	// reapPending marks that the reap is due once the run ends.
	reapPending bool
	// conflict: the caller's view was stale and that refused what it
	// asked for (a close, a reap, an eviction).
	conflict bool
}

// decide is the funnel's compare: given what the caller saw (why, and
// the view of its binding against the session now) it says what the
// teardown may do. It is pure; release applies its verdict.
//
//   - A session no longer in the table: nothing (it was released already).
//   - closed, shutdown and fenced close unconditionally.
//   - idle_reap and evicted close only a session nobody bound since it was
//     picked, with no viewer and no run.
//   - A departing viewer is dropped. When it was the last one the session
//     is parked, or closed at once if it is close_on_disconnect with no
//     run — but only if nobody bound since the viewer did; a stale caller
//     only drops its own viewer and parks.
//   - A reap timer closes only a session with no viewer whose binding is
//     the one it was armed for; with a run in flight it waits for the run
//     (looking again after another grace), and interrupts it once when it
//     made no progress for runStaleAfter — unless it is waiting for a
//     person to answer a permission request, which is no stall.
//   - A run that settled applies a deferred close_on_disconnect or reap.
func decide(v view, why Reason) verdict {
	if !v.live {
		return verdict{}
	}
	switch why {
	case Closed, Shutdown, Fenced:
		return verdict{close: true, end: why}
	case IdleReap, Evicted:
		if v.current && v.viewers == 0 && !v.run {
			return verdict{close: true, end: why}
		}
		return verdict{conflict: true}
	case Disconnected:
		if !v.viewer {
			return verdict{}
		}
		if v.viewers > 1 {
			return verdict{drop: true}
		}
		if v.closeOnDisconnect && !v.run {
			if v.current {
				return verdict{drop: true, close: true, end: Disconnected}
			}
			return verdict{drop: true, park: true, conflict: true}
		}
		return verdict{drop: true, park: true}
	case OrphanReap:
		if !v.current || v.viewers > 0 {
			return verdict{conflict: true}
		}
		if !v.run {
			return verdict{close: true, end: OrphanReap}
		}
		if !v.runStale || v.runAsking {
			return verdict{reapPending: true, park: true}
		}
		return verdict{reapPending: true, interrupt: !v.runInterrupted}
	case settled:
		if !v.current || v.viewers > 0 {
			return verdict{}
		}
		switch {
		case v.closeOnDisconnect:
			return verdict{close: true, end: Disconnected}
		case v.reapPending:
			return verdict{close: true, end: OrphanReap}
		}
	}
	return verdict{}
}

// releaseRef is what a teardown caller saw: the session, its binding
// generation then, and the departing transport (zero for timers and
// explicit closes).
type releaseRef struct {
	s   *Session
	gen uint64
	tid contract.TransportID
}

// release is the one teardown funnel. It takes the session's slot (so no
// bind or other teardown runs meanwhile), compares the caller's view with
// the session (decide) and applies the verdict: under the locks the local
// binding changes, then outside them the ownership store's record of it.
// Closing removes the session under the lock and marks it closing; the
// slow part (waiting for the run, persisting, closing the agent, giving
// back ownership) runs after, in finish. It reports whether this call
// removed the session.
func (t *Table) release(ref releaseRef, why Reason) bool {
	s := ref.s
	_ = s.acquire(context.Background())
	defer s.releaseOp()

	t.mu.Lock()
	s.mu.Lock()
	_, isViewer := s.viewers[ref.tid]
	v := view{
		live:              t.byID[s.id] == s,
		current:           ref.gen == s.gen,
		viewer:            isViewer && !ref.tid.IsZero(),
		viewers:           len(s.viewers),
		run:               s.run != nil,
		closeOnDisconnect: s.closeOnDisconnect,
		reapPending:       s.reapPending,
	}
	if s.run != nil {
		v.runStale = t.now().Sub(s.run.progress) >= runStaleAfter
		v.runAsking = len(s.perms) > 0
		v.runInterrupted = s.run.interrupted
	}
	d := decide(v, why)
	if d.conflict {
		t.metrics.CASConflicts.Inc()
	}
	if d.drop {
		delete(s.viewers, ref.tid)
		t.metrics.Viewers.Dec()
		s.gen++
	}
	if d.reapPending {
		s.reapPending = true
	}
	if d.interrupt {
		s.run.interrupted = true
		s.run.cancel()
	}
	if d.park && !d.close {
		t.parkLocked(s)
	}
	if !d.close {
		owner, rev := s.ownerLocked(), s.rev
		s.mu.Unlock()
		t.mu.Unlock()
		if d.drop {
			t.recordOwner(s, owner, rev)
		}
		return false
	}
	// Swap: remove the session; nobody can bind it again.
	delete(t.byID, s.id)
	delete(t.byKey, s.key)
	for i, r := range t.order {
		if r == s {
			t.order = append(t.order[:i], t.order[i+1:]...)
			break
		}
	}
	t.releasing[s.key] = s
	s.closing = true
	if s.parkTimer != nil {
		s.parkTimer.Stop()
		s.parkTimer = nil
		t.metrics.ParkedSessions.Dec()
	}
	// The viewers stay on the closing session until its run has ended,
	// so they still get the run's message.complete; finish drops them.
	ru := s.run
	if ru != nil && !ru.interrupted {
		ru.interrupted = true
		ru.cancel()
	}
	s.mu.Unlock()
	t.metrics.LiveSessions.Dec()
	t.wg.Add(1)
	t.mu.Unlock()

	s.log.Debug().Stringer("reason", d.end).Msg("releasing session")
	go t.finish(s, ru, d.end)
	return true
}

// recordOwner writes a teardown's new binding to the ownership store.
// The teardown has happened locally whatever the store says; a failure
// is logged and counted, and the next write starts from the revision the
// store last confirmed.
func (t *Table) recordOwner(s *Session, o ownership.Owner, rev uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), t.ownersTimeout)
	defer cancel()
	newRev, err := t.owners.Update(ctx, s.key, o, rev)
	if err != nil {
		t.metrics.OwnerErrors.Inc()
		s.log.Warn().Err(err).Msg("recording a teardown in the ownership store")
		return
	}
	s.rev = newRev
}

// parkLocked starts the reap timer of a session that has no viewer left.
// Both t.mu and s.mu are held.
func (t *Table) parkLocked(s *Session) {
	if s.parkTimer != nil {
		s.parkTimer.Stop()
		t.metrics.ParkedSessions.Dec()
	}
	s.parkTimer = nil
	if t.grace <= 0 {
		// Parked forever: a marker timer that never fires.
		s.parkTimer = time.NewTimer(time.Duration(1<<63 - 1))
		t.metrics.ParkedSessions.Inc()
		return
	}
	ref := releaseRef{s: s, gen: s.gen}
	s.parkTimer = time.AfterFunc(t.grace, func() { t.release(ref, OrphanReap) })
	t.metrics.ParkedSessions.Inc()
}

// finish is the slow part of a teardown, outside every lock: wait for the
// run, persist, close the agent, give back ownership, tell the viewers,
// then let waiting resumes rebuild.
func (t *Table) finish(s *Session, ru *run, reason Reason) {
	defer t.wg.Done()
	if ru != nil {
		<-ru.done
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.mu.Lock()
	epoch, seq := s.epoch, s.seq
	viewers := make([]Viewer, 0, len(s.viewers))
	for _, v := range s.viewers {
		viewers = append(viewers, v)
	}
	t.metrics.Viewers.Sub(float64(len(s.viewers)))
	s.viewers = nil
	s.mu.Unlock()
	// Stored behind the session's last events. While the database cannot
	// be written this waits a bounded time: the rows stay queued, and a
	// rebuild of the key may miss only the end and the cursor.
	select {
	case err := <-t.journal.addOps(ops{cursor: &store.Cursor{Key: s.key, Epoch: epoch, LastSeq: seq}, ends: []store.End{{Key: s.key, Reason: reason.String(), At: t.now()}}}):
		if err != nil {
			s.log.Error().Err(err).Msg("recording the session's end")
			s.endErr = err
		}
	case <-ctx.Done():
		s.log.Error().Err(t.journal.health()).Msg("the session's end is not stored yet; released anyway")
		s.endErr = cmp.Or(t.journal.health(), errors.New("not stored within 5 s"))
	}
	if err := s.agent.Close(); err != nil {
		s.log.Debug().Err(err).Msg("closing agent")
	}
	t.metrics.AgentCloses.Inc()
	// The session is persisted: another owner may build it now. Nobody
	// else changes s.rev any more (s is out of the table).
	if err := t.owners.Delete(ctx, s.key, s.rev); err != nil {
		t.metrics.OwnerErrors.Inc()
		s.log.Warn().Err(err).Msg("giving back ownership")
	}
	for _, v := range viewers {
		v.Released(s)
	}
	t.mu.Lock()
	if t.releasing[s.key] == s {
		delete(t.releasing, s.key)
	}
	t.mu.Unlock()
	close(s.released)
	s.log.Info().Stringer("reason", reason).Msg("session released")
}
