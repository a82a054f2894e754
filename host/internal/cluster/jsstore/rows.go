package jsstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/cluster/bus"
	"github.com/tether-agent/tether/host/store"
)

// row is a stored session's KV value: everything of store.Session but
// the key and the message count (which the messages stream holds), and
// the session's runs.
type row struct {
	Title      string   `json:"title,omitempty"`
	Parent     string   `json:"parent,omitempty"`
	ForkCount  int      `json:"fork_count,omitempty"`
	StartedAt  int64    `json:"started_at"`
	EndedAt    int64    `json:"ended_at,omitempty"`
	EndReason  string   `json:"end_reason,omitempty"`
	Epoch      string   `json:"epoch,omitempty"`
	LastSeq    uint64   `json:"last_seq,omitempty"`
	AgentState string   `json:"agent_state,omitempty"`
	Runs       []runRow `json:"runs,omitempty"`
}

// runRow is one run of a row.
type runRow struct {
	ID        string `json:"id"`
	Status    string `json:"status"`
	StartedAt int64  `json:"started_at"`
	EndedAt   int64  `json:"ended_at,omitempty"`
	Ended     bool   `json:"ended,omitempty"`
	StartSeq  uint64 `json:"start_seq,omitempty"`
	By        string `json:"by,omitempty"`
}

// rowKey is the bucket key of a session's row.
func rowKey(key string) string { return "s." + key }

// unixOf and timeOf convert as host/store does: Unix seconds, the zero
// time 0.
func unixOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}

func timeOf(sec int64) time.Time {
	if sec == 0 {
		return time.Time{}
	}
	return time.Unix(sec, 0).UTC()
}

// session makes a store.Session of a row (MessageCount and LastActive
// not filled).
func (r row) session(key string) store.Session {
	return store.Session{
		Key: key, Title: r.Title, Parent: r.Parent, ForkCount: r.ForkCount,
		StartedAt: timeOf(r.StartedAt), EndedAt: timeOf(r.EndedAt), EndReason: r.EndReason,
		Epoch: r.Epoch, LastSeq: r.LastSeq, AgentState: r.AgentState,
	}
}

// lastActive is store.Session.LastActive of a row: the latest of its
// start, its end and its runs' starts and ends.
func (r row) lastActive() time.Time {
	last := max(r.StartedAt, r.EndedAt)
	for _, run := range r.Runs {
		last = max(last, run.StartedAt, run.EndedAt)
	}
	return timeOf(last)
}

// lastRunBy is store.Session.LastRunBy of a row: who started its latest
// run, ordered as Runs orders them.
func (r row) lastRunBy() string {
	var latest *runRow
	for i := range r.Runs {
		run := &r.Runs[i]
		if latest == nil || run.StartedAt > latest.StartedAt ||
			(run.StartedAt == latest.StartedAt && run.StartSeq >= latest.StartSeq) {
			latest = run
		}
	}
	if latest == nil {
		return ""
	}
	return latest.By
}

// getRow reads key's row and its revision from the stream leader.
func (s *Store) getRow(ctx context.Context, key string) (row, uint64, error) {
	if !bus.ValidToken(key) {
		return row{}, 0, fmt.Errorf("session %s: %w", key, store.ErrNotFound)
	}
	e, err := s.kv.Get(ctx, rowKey(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return row{}, 0, fmt.Errorf("session %s: %w", key, store.ErrNotFound)
	}
	if err != nil {
		return row{}, 0, fmt.Errorf("session %s: %w", key, err)
	}
	var r row
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return row{}, 0, fmt.Errorf("session %s: revision %d is not a session row: %v: %w", key, e.Revision(), err, store.ErrDamaged)
	}
	return r, e.Revision(), nil
}

// maxRowRaces bounds how often updateRow reads a row again after losing
// its compare-and-swap to another writer.
const maxRowRaces = 100

// updateRow applies change to key's row by compare-and-swap: read the row
// and its revision, change it, write it back at that revision; lost to
// another writer, read again. change returning false writes nothing.
func (s *Store) updateRow(ctx context.Context, key string, change func(r *row) (bool, error)) error {
	for range maxRowRaces {
		r, rev, err := s.getRow(ctx, key)
		if err != nil {
			return err
		}
		write, err := change(&r)
		if err != nil || !write {
			return err
		}
		val, err := json.Marshal(r)
		if err != nil {
			return err
		}
		err = bus.RetryBusy(ctx, &s.retries, func() error {
			_, err := s.kv.Update(ctx, rowKey(key), val, rev)
			return err
		})
		if err == nil {
			return nil
		}
		if !bus.WrongLastSequence(err) || bus.Busy(err) {
			return fmt.Errorf("session %s: %w", key, err)
		}
	}
	return fmt.Errorf("session %s: lost %d compare-and-swaps in a row: %w", key, maxRowRaces, store.ErrUnavailable)
}

// CreateSession is store.Store.CreateSession: a KV create of the row, so
// that of two hosts creating one key exactly one wins (the other gets
// store.ErrExists).
func (s *Store) CreateSession(ctx context.Context, sess store.Session) error {
	return s.write(func() error {
		if sess.Key == "" || !bus.ValidToken(sess.Key) {
			return fmt.Errorf("create session %q: empty key or not a subject token: %w", sess.Key, store.ErrInvalid)
		}
		if sess.ForkCount < 0 {
			return fmt.Errorf("create session %s: negative fork count %d: %w", sess.Key, sess.ForkCount, store.ErrInvalid)
		}
		if sess.Parent != "" {
			if _, _, err := s.getRow(ctx, sess.Parent); err != nil {
				return fmt.Errorf("create session %s: parent: %w", sess.Key, err)
			}
		}
		r := row{
			Title: sess.Title, Parent: sess.Parent, ForkCount: sess.ForkCount,
			StartedAt: unixOf(sess.StartedAt), EndedAt: unixOf(sess.EndedAt), EndReason: sess.EndReason,
			Epoch: sess.Epoch, LastSeq: sess.LastSeq, AgentState: sess.AgentState,
		}
		val, err := json.Marshal(r)
		if err != nil {
			return err
		}
		err = bus.RetryBusy(ctx, &s.retries, func() error {
			_, err := s.kv.Create(ctx, rowKey(sess.Key), val)
			return err
		})
		if bus.WrongLastSequence(err) && !bus.Busy(err) {
			return fmt.Errorf("create session %s: %w", sess.Key, store.ErrExists)
		}
		if err != nil {
			return fmt.Errorf("create session %s: %w", sess.Key, err)
		}
		return nil
	})
}

// GetSession is store.Store.GetSession.
func (s *Store) GetSession(ctx context.Context, key string) (store.Session, error) {
	var sess store.Session
	err := s.read(func() error {
		r, _, err := s.getRow(ctx, key)
		if err != nil {
			return err
		}
		sess = r.session(key)
		c, err := s.messageCount(ctx, key)
		sess.MessageCount = c.rows
		return err
	})
	if err != nil {
		return store.Session{}, fmt.Errorf("get session: %w", err)
	}
	return sess, nil
}

// allSessions reads every row, with LastActive filled, seeing every
// write acknowledged before it was called.
//
// It reads them by a watch of the rows, whose consumer the servers
// place on any server of the bucket's stream: one that has not applied
// the latest acknowledged writes yet (a replica of a replicated bucket
// lags the leader, which acknowledges once a quorum stored a write)
// ends the watch's initial values without them. So it first asks the
// stream leader for the stream sequence of the last row written, and
// reads the watch past its initial values, as the lagging server
// catches up, until it has delivered that sequence (collectRows).
func (s *Store) allSessions(ctx context.Context) ([]store.Session, error) {
	m, err := s.rows.GetLastMsgForSubject(ctx, s.rowsSubj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return []store.Session{}, nil // no row was ever written
	}
	if err != nil {
		return nil, fmt.Errorf("the last row: %w", err)
	}
	w, err := s.kv.Watch(ctx, rowKey("*"))
	if err != nil {
		return nil, err
	}
	defer bus.StopWatch(w)
	rows, err := collectRows(ctx, w.Updates(), m.Sequence, catchUpBudget)
	if err != nil {
		return nil, err
	}
	out := make([]store.Session, 0, len(rows))
	for key, r := range rows {
		sess := r.session(key)
		sess.LastActive = r.lastActive()
		sess.LastRunBy = r.lastRunBy()
		out = append(out, sess)
	}
	return out, nil
}

// catchUpBudget bounds how long collectRows waits, after the initial
// values, for a lagging server to deliver the last row written.
const catchUpBudget = 5 * time.Second

// collectRows reads the updates of a watch of the rows (puts, and the
// delete markers of rows deleted: the watch does not ignore them, their
// sequence may be the one awaited) into every current row by session
// key. It returns once it has read the end of the initial values (the
// nil entry) and an entry at stream sequence last or later: then it has
// every write up to last, whatever the watch's server had applied when
// the watch began. Waiting for last past the initial values is bounded
// by budget (an error that noAnswer recognises).
func collectRows(ctx context.Context, updates <-chan jetstream.KeyValueEntry, last uint64, budget time.Duration) (map[string]row, error) {
	rows := map[string]row{}
	var seen uint64 // the highest stream sequence read
	initDone := false
	var late <-chan time.Time
	for !initDone || seen < last {
		select {
		case e, ok := <-updates:
			if !ok {
				return nil, errors.New("the watch of the rows ended")
			}
			if e == nil {
				initDone = true
				if seen < last {
					t := time.NewTimer(budget)
					defer t.Stop()
					late = t.C
				}
				continue
			}
			seen = max(seen, e.Revision())
			key := e.Key()[len(rowKey("")):]
			if e.Operation() != jetstream.KeyValuePut {
				delete(rows, key)
				continue
			}
			var r row
			if err := json.Unmarshal(e.Value(), &r); err != nil {
				return nil, fmt.Errorf("%s at revision %d is not a session row: %v: %w", e.Key(), e.Revision(), err, store.ErrDamaged)
			}
			rows[key] = r
		case <-late:
			return nil, fmt.Errorf("the watch of the rows reached stream sequence %d, not the last row's %d, within %v: %w", seen, last, budget, context.DeadlineExceeded)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return rows, nil
}

// newestFirst orders sessions as host/store lists them: by StartedAt,
// then key, newest first.
func newestFirst(a, b store.Session) int {
	if c := cmp.Compare(unixOf(b.StartedAt), unixOf(a.StartedAt)); c != 0 {
		return c
	}
	return cmp.Compare(b.Key, a.Key)
}

// FindByTitle is store.Store.FindByTitle. It reads every row: the bucket
// has no index by title.
func (s *Store) FindByTitle(ctx context.Context, title string) (store.Session, error) {
	if title == "" {
		return store.Session{}, fmt.Errorf("find by title: empty title: %w", store.ErrNotFound)
	}
	var found store.Session
	err := s.read(func() error {
		all, err := s.allSessions(ctx)
		if err != nil {
			return err
		}
		ok := false
		for _, sess := range all {
			if sess.Title == title && (!ok || newestFirst(sess, found) < 0) {
				found, ok = sess, true
			}
		}
		if !ok {
			return store.ErrNotFound
		}
		found.LastActive, found.LastRunBy = time.Time{}, "" // filled by List only, as host/store does
		c, err := s.messageCount(ctx, found.Key)
		found.MessageCount = c.rows
		return err
	})
	if err != nil {
		return store.Session{}, fmt.Errorf("find by title %q: %w", title, err)
	}
	return found, nil
}

// List is store.Store.List, LastActive filled. It reads every row and
// sorts them: the bucket has no index by start time.
func (s *Store) List(ctx context.Context, limit int) ([]store.Session, error) {
	if limit <= 0 {
		limit = 100
	}
	var out []store.Session
	err := s.read(func() error {
		all, err := s.allSessions(ctx)
		if err != nil {
			return err
		}
		slices.SortFunc(all, newestFirst)
		out = all[:min(limit, len(all))]
		for i := range out {
			c, err := s.messageCount(ctx, out[i].Key)
			if err != nil {
				return err
			}
			out[i].MessageCount = c.rows
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	return out, nil
}

// End is store.Store.End: the first reason recorded wins.
func (s *Store) End(ctx context.Context, key, reason string, at time.Time) error {
	return s.write(func() error {
		if reason == "" {
			return fmt.Errorf("end session %s: empty reason: %w", key, store.ErrInvalid)
		}
		err := s.updateRow(ctx, key, func(r *row) (bool, error) { return endRow(r, reason, at), nil })
		if err != nil {
			return fmt.Errorf("end session: %w", err)
		}
		return nil
	})
}

// endRow records an end in r unless it has one; it reports whether r
// changed.
func endRow(r *row, reason string, at time.Time) bool {
	if r.EndReason != "" {
		return false
	}
	r.EndReason, r.EndedAt = reason, unixOf(at)
	return true
}

// Reopen is store.Store.Reopen.
func (s *Store) Reopen(ctx context.Context, key string) error {
	return s.setRow(ctx, "reopen session", key, func(r *row) { r.EndReason, r.EndedAt = "", 0 })
}

// SetCursor is store.Store.SetCursor.
func (s *Store) SetCursor(ctx context.Context, key, epoch string, lastSeq uint64) error {
	return s.setRow(ctx, "set cursor of", key, func(r *row) { r.Epoch, r.LastSeq = epoch, lastSeq })
}

// SetAgentState is store.Store.SetAgentState.
func (s *Store) SetAgentState(ctx context.Context, key, state string) error {
	return s.setRow(ctx, "set agent state of", key, func(r *row) { r.AgentState = state })
}

// SetTitle is store.Store.SetTitle.
func (s *Store) SetTitle(ctx context.Context, key, title string) error {
	return s.setRow(ctx, "set title of", key, func(r *row) { r.Title = title })
}

// setRow is a write of key's row by set.
func (s *Store) setRow(ctx context.Context, op, key string, set func(r *row)) error {
	return s.write(func() error {
		err := s.updateRow(ctx, key, func(r *row) (bool, error) { set(r); return true, nil })
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		return nil
	})
}

// StartRun is store.Store.StartRun: a run already recorded under that id
// is refused (ErrExists), as the SQLite primary key refuses it.
func (s *Store) StartRun(ctx context.Context, key string, r store.Run) error {
	return s.write(func() error {
		if err := s.updateRow(ctx, key, func(rw *row) (bool, error) { return true, addRun(rw, r) }); err != nil {
			return fmt.Errorf("start run %s: %w", r.ID, err)
		}
		return nil
	})
}

// addRun adds r to rw's runs.
func addRun(rw *row, r store.Run) error {
	for _, old := range rw.Runs {
		if old.ID == r.ID {
			return fmt.Errorf("run %s: %w", r.ID, store.ErrExists)
		}
	}
	rw.Runs = append(rw.Runs, runRow{ID: r.ID, Status: r.Status, StartedAt: unixOf(r.StartedAt), StartSeq: r.StartSeq, By: r.By})
	return nil
}

// EndRun is store.Store.EndRun: a run already ended keeps its status; an
// unknown run or session is no error.
func (s *Store) EndRun(ctx context.Context, key, runID, status string, at time.Time) error {
	return s.write(func() error {
		err := s.updateRow(ctx, key, func(r *row) (bool, error) { return endRunRow(r, runID, status, at), nil })
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("end run %s: %w", runID, err)
		}
		return nil
	})
}

// endRunRow ends runID in r unless it has ended; it reports whether r
// changed.
func endRunRow(r *row, runID, status string, at time.Time) bool {
	for i := range r.Runs {
		if run := &r.Runs[i]; run.ID == runID && !run.Ended {
			run.Status, run.EndedAt, run.Ended = status, unixOf(at), true
			return true
		}
	}
	return false
}

// Runs is store.Store.Runs: oldest first (by start time, then the seq of
// the run's first event); none for an unknown session.
func (s *Store) Runs(ctx context.Context, key string) ([]store.Run, error) {
	out := []store.Run{}
	err := s.read(func() error {
		r, _, err := s.getRow(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, run := range r.Runs {
			out = append(out, store.Run{ID: run.ID, Status: run.Status, StartedAt: timeOf(run.StartedAt), EndedAt: timeOf(run.EndedAt), StartSeq: run.StartSeq, By: run.By})
		}
		slices.SortStableFunc(out, func(a, b store.Run) int {
			if c := cmp.Compare(unixOf(a.StartedAt), unixOf(b.StartedAt)); c != 0 {
				return c
			}
			return cmp.Compare(a.StartSeq, b.StartSeq)
		})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("runs of %s: %w", key, err)
	}
	return out, nil
}

// StartTurn is store.Store.StartTurn: the prompt's display row, then the
// run in the session's row. The two are separate writes: a fault between
// them leaves the prompt stored without its run (the turn is refused
// all the same, with store.ErrUnavailable).
func (s *Store) StartTurn(ctx context.Context, key string, prompt agent.Message, r store.Run) error {
	return s.write(func() error {
		rw, _, err := s.getRow(ctx, key)
		if err != nil {
			return fmt.Errorf("start turn: %w", err)
		}
		for _, old := range rw.Runs {
			if old.ID == r.ID {
				return fmt.Errorf("start turn of %s: run %s: %w", key, r.ID, store.ErrExists)
			}
		}
		if err := s.appendMessages(ctx, key, []agent.Message{prompt}, 0); err != nil {
			return fmt.Errorf("start turn: %w", err)
		}
		if err := s.updateRow(ctx, key, func(rw *row) (bool, error) { return true, addRun(rw, r) }); err != nil {
			return fmt.Errorf("start turn: %w", err)
		}
		return nil
	})
}
