package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/store"
)

// StoreConfig configures the JetStream objects a JSStore keeps its data
// in, created when they do not exist yet; existing ones are used as they
// are.
type StoreConfig struct {
	// Prefix names them: bucket <Prefix>_store, streams <PREFIX>_EVENTS
	// and <PREFIX>_MESSAGES on subjects <Prefix>.journal.<key> and
	// <Prefix>.messages.<key> (default "tether"). Letters, digits, '_'
	// and '-' only.
	Prefix string
	// Replicas is how many servers keep each of them (default 1): 3 on a
	// three-server cluster.
	Replicas int
	// Storage is jetstream.FileStorage (the zero value) or MemoryStorage.
	Storage jetstream.StorageType
}

// Headers of the stream messages.
const (
	// hdrSeq is the session seq of a journal message, and the index
	// (from 1) of the first display row of a messages message.
	hdrSeq = "Tether-Seq"
	// hdrCount is how many display rows a messages message holds.
	hdrCount = "Tether-Count"
	// hdrPart is the index (from 1) of a messages message among its
	// subject's.
	hdrPart = "Tether-Part"
	// hdrBatch is, on a messages message a Commit wrote, the lowest seq
	// of the session's events in that Commit.
	hdrBatch = "Tether-Batch"
)

// JSStore is host/store's *Store on JetStream: the same methods, errors
// and ordering, for any host of a cluster. See the package doc for the
// layout. Its methods are safe for concurrent use. It does not own the
// connection: close that after Close.
type JSStore struct {
	js       jetstream.JetStream
	kv       jetstream.KeyValue
	events   jetstream.Stream
	messages jetstream.Stream
	evName   string // the events stream's name
	evSubj   string // the journal subjects' prefix, "<prefix>.journal."
	msgSubj  string // the messages subjects' prefix, "<prefix>.messages."

	fault   atomic.Pointer[func() error]
	onFault atomic.Pointer[func(error)]
	closed  atomic.Bool
	retries atomic.Uint64 // writes asked again while busy

	// keyLocks serialises this process's writers of one session's
	// messages subject, so that a writer that lost a race to another of
	// this process does not spin; the expected-last-subject-sequence
	// check still decides between hosts.
	keyLocks sync.Map // key → *sync.Mutex

	// tops caches the last event this process journaled or read per
	// session, saving a read before each append. A stale entry (another
	// host journaled since) costs one refused publish and a read: the
	// server's expected-last-subject-sequence check decides, never it.
	tops sync.Map // key → journalTop
}

var _ interface {
	Close() error
	QuickCheck(context.Context) error
} = (*JSStore)(nil)

// OpenJSStore opens (creating them if needed) the bucket and streams of
// cfg on js.
func OpenJSStore(ctx context.Context, js jetstream.JetStream, cfg StoreConfig) (*JSStore, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "tether"
	}
	if !validToken(cfg.Prefix) {
		return nil, fmt.Errorf("open store: prefix %q: %w", cfg.Prefix, store.ErrInvalid)
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	kv, err := openLeaderKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      cfg.Prefix + "_store",
		Description: "tether stored sessions: one row per session",
		History:     1,
		Replicas:    cfg.Replicas,
		Storage:     cfg.Storage,
	})
	if err != nil {
		return nil, fmt.Errorf("open store: %v: %w", err, store.ErrUnavailable)
	}
	s := &JSStore{
		js:      js,
		kv:      kv,
		evName:  upper(cfg.Prefix) + "_EVENTS",
		evSubj:  cfg.Prefix + ".journal.",
		msgSubj: cfg.Prefix + ".messages.",
	}
	for _, st := range []struct {
		dst  *jetstream.Stream
		name string
		subj string
		desc string
	}{
		{&s.events, s.evName, s.evSubj, "tether event journals: one subject per session, one message per event"},
		{&s.messages, upper(cfg.Prefix) + "_MESSAGES", s.msgSubj, "tether display rows: one subject per session, one message per append"},
	} {
		// An existing stream is used as it is (QuickCheck tells if it
		// was changed to drop messages).
		*st.dst, err = js.Stream(ctx, st.name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			// Direct gets off: a read of a subject's last message is
			// answered by the stream leader, so it sees every
			// acknowledged write.
			*st.dst, err = js.CreateStream(ctx, jetstream.StreamConfig{
				Name:        st.name,
				Description: st.desc,
				Subjects:    []string{st.subj + "*"},
				Storage:     cfg.Storage,
				Replicas:    cfg.Replicas,
				Discard:     jetstream.DiscardOld,
			})
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				// Another host created it meanwhile.
				*st.dst, err = js.Stream(ctx, st.name)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("open store: stream %s: %v: %w", st.name, err, store.ErrUnavailable)
		}
	}
	return s, nil
}

// upper is s in upper case (ASCII).
func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// validToken reports whether k can be one token of a subject and a KV
// key: non-empty, of letters, digits, '_' and '-'. Every stored key
// (store.ValidKey) is.
func validToken(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// Close makes every later call fail with store.ErrUnavailable. It is
// idempotent, and does not close the connection.
func (s *JSStore) Close() error {
	s.closed.Store(true)
	return nil
}

// SetWriteFault is store.Store.SetWriteFault: every write fails with the
// error f returns (when not nil) before it reaches the server.
func (s *JSStore) SetWriteFault(f func() error) {
	if f == nil {
		s.fault.Store(nil)
		return
	}
	s.fault.Store(&f)
}

// OnWriteFault is store.Store.OnWriteFault.
func (s *JSStore) OnWriteFault(f func(error)) {
	if f == nil {
		s.onFault.Store(nil)
		return
	}
	s.onFault.Store(&f)
}

// write runs one write operation as store.Store does: an injected fault,
// or any error that is not the caller's (not ErrNotFound, ErrExists or
// ErrInvalid), comes back wrapping store.ErrUnavailable and is reported
// to the OnWriteFault hook.
func (s *JSStore) write(f func() error) error {
	var err error
	if s.closed.Load() {
		err = fmt.Errorf("store closed: %w", store.ErrUnavailable)
	} else if h := s.fault.Load(); h != nil {
		if ferr := (*h)(); ferr != nil {
			err = fmt.Errorf("%w: %w", ferr, store.ErrUnavailable)
		}
	}
	if err == nil {
		err = f()
	}
	if err != nil && !callerError(err) && !errors.Is(err, store.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", err, store.ErrUnavailable)
	}
	if errors.Is(err, store.ErrUnavailable) {
		if h := s.onFault.Load(); h != nil {
			(*h)(err)
		}
	}
	return err
}

// read runs one read: an error that is not the caller's wraps
// store.ErrUnavailable.
func (s *JSStore) read(f func() error) error {
	if s.closed.Load() {
		return fmt.Errorf("store closed: %w", store.ErrUnavailable)
	}
	err := f()
	if err != nil && !callerError(err) && !errors.Is(err, store.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", err, store.ErrUnavailable)
	}
	return err
}

// callerError reports whether err is the store refusing an argument
// rather than the storage failing.
func callerError(err error) bool {
	return errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrExists) || errors.Is(err, store.ErrInvalid)
}

// QuickCheck is store.Store.QuickCheck for the cluster: the bucket and
// both streams answer, and are what OpenJSStore made of them (an error
// wrapping store.ErrDamaged when one is gone or reconfigured,
// store.ErrUnavailable when the servers do not answer).
func (s *JSStore) QuickCheck(ctx context.Context) error {
	return s.read(func() error {
		if _, err := s.kv.Status(ctx); err != nil {
			if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("quick check: bucket: %v: %w", err, store.ErrDamaged)
			}
			return fmt.Errorf("quick check: bucket: %w", err)
		}
		for _, st := range []jetstream.Stream{s.events, s.messages} {
			info, err := st.Info(ctx)
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("quick check: stream %s: %v: %w", st.CachedInfo().Config.Name, err, store.ErrDamaged)
			}
			if err != nil {
				return fmt.Errorf("quick check: stream %s: %w", st.CachedInfo().Config.Name, err)
			}
			if c := info.Config; c.MaxMsgsPerSubject > 0 || c.MaxMsgs > 0 || c.MaxAge > 0 || c.AllowDirect {
				return fmt.Errorf("quick check: stream %s is configured to drop or serve messages behind the store's back: %w", c.Name, store.ErrDamaged)
			}
		}
		return nil
	})
}

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

// session makes a store.Session of a row (MessageCount not filled).
func (r row) session(key string) store.Session {
	return store.Session{
		Key: key, Title: r.Title, Parent: r.Parent, ForkCount: r.ForkCount,
		StartedAt: timeOf(r.StartedAt), EndedAt: timeOf(r.EndedAt), EndReason: r.EndReason,
		Epoch: r.Epoch, LastSeq: r.LastSeq, AgentState: r.AgentState,
	}
}

// getRow reads key's row and its revision from the stream leader.
func (s *JSStore) getRow(ctx context.Context, key string) (row, uint64, error) {
	if !validToken(key) {
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
func (s *JSStore) updateRow(ctx context.Context, key string, change func(r *row) (bool, error)) error {
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
		err = retryBusy(ctx, &s.retries, func() error {
			_, err := s.kv.Update(ctx, rowKey(key), val, rev)
			return err
		})
		if err == nil {
			return nil
		}
		if !wrongLastSequence(err) || busy(err) {
			return fmt.Errorf("session %s: %w", key, err)
		}
	}
	return fmt.Errorf("session %s: lost %d compare-and-swaps in a row: %w", key, maxRowRaces, store.ErrUnavailable)
}

// CreateSession is store.Store.CreateSession: a KV create of the row, so
// that of two hosts creating one key exactly one wins (the other gets
// store.ErrExists).
func (s *JSStore) CreateSession(ctx context.Context, sess store.Session) error {
	return s.write(func() error {
		if sess.Key == "" || !validToken(sess.Key) {
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
		err = retryBusy(ctx, &s.retries, func() error {
			_, err := s.kv.Create(ctx, rowKey(sess.Key), val)
			return err
		})
		if wrongLastSequence(err) && !busy(err) {
			return fmt.Errorf("create session %s: %w", sess.Key, store.ErrExists)
		}
		if err != nil {
			return fmt.Errorf("create session %s: %w", sess.Key, err)
		}
		return nil
	})
}

// GetSession is store.Store.GetSession.
func (s *JSStore) GetSession(ctx context.Context, key string) (store.Session, error) {
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

// allSessions reads every row, by a watch of the rows that stops at the
// end of its initial values.
func (s *JSStore) allSessions(ctx context.Context) ([]store.Session, error) {
	w, err := s.kv.Watch(ctx, "s.*", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer stopWatch(w)
	out := []store.Session{}
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("the watch of the rows ended")
			}
			if e == nil {
				return out, nil
			}
			var r row
			if err := json.Unmarshal(e.Value(), &r); err != nil {
				return nil, fmt.Errorf("%s at revision %d is not a session row: %v: %w", e.Key(), e.Revision(), err, store.ErrDamaged)
			}
			out = append(out, r.session(e.Key()[len("s."):]))
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
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
func (s *JSStore) FindByTitle(ctx context.Context, title string) (store.Session, error) {
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
		c, err := s.messageCount(ctx, found.Key)
		found.MessageCount = c.rows
		return err
	})
	if err != nil {
		return store.Session{}, fmt.Errorf("find by title %q: %w", title, err)
	}
	return found, nil
}

// List is store.Store.List. It reads every row and sorts them: the bucket
// has no index by start time.
func (s *JSStore) List(ctx context.Context, limit int) ([]store.Session, error) {
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
func (s *JSStore) End(ctx context.Context, key, reason string, at time.Time) error {
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
func (s *JSStore) Reopen(ctx context.Context, key string) error {
	return s.setRow(ctx, "reopen session", key, func(r *row) { r.EndReason, r.EndedAt = "", 0 })
}

// SetCursor is store.Store.SetCursor.
func (s *JSStore) SetCursor(ctx context.Context, key, epoch string, lastSeq uint64) error {
	return s.setRow(ctx, "set cursor of", key, func(r *row) { r.Epoch, r.LastSeq = epoch, lastSeq })
}

// SetAgentState is store.Store.SetAgentState.
func (s *JSStore) SetAgentState(ctx context.Context, key, state string) error {
	return s.setRow(ctx, "set agent state of", key, func(r *row) { r.AgentState = state })
}

// SetTitle is store.Store.SetTitle.
func (s *JSStore) SetTitle(ctx context.Context, key, title string) error {
	return s.setRow(ctx, "set title of", key, func(r *row) { r.Title = title })
}

// setRow is a write of key's row by set.
func (s *JSStore) setRow(ctx context.Context, op, key string, set func(r *row)) error {
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
func (s *JSStore) StartRun(ctx context.Context, key string, r store.Run) error {
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
	rw.Runs = append(rw.Runs, runRow{ID: r.ID, Status: r.Status, StartedAt: unixOf(r.StartedAt), StartSeq: r.StartSeq})
	return nil
}

// EndRun is store.Store.EndRun: a run already ended keeps its status; an
// unknown run or session is no error.
func (s *JSStore) EndRun(ctx context.Context, key, runID, status string, at time.Time) error {
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
func (s *JSStore) Runs(ctx context.Context, key string) ([]store.Run, error) {
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
			out = append(out, store.Run{ID: run.ID, Status: run.Status, StartedAt: timeOf(run.StartedAt), EndedAt: timeOf(run.EndedAt), StartSeq: run.StartSeq})
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
func (s *JSStore) StartTurn(ctx context.Context, key string, prompt agent.Message, r store.Run) error {
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

// Commit is store.Store.Commit, as a sequence of writes, session by
// session in the order the batch first names them: its events (each
// checked against the journal's last, so a retried Commit journals none
// twice), its display rows (one stream message), then its row (run seqs,
// run ends, the last cursor, the end) by one compare-and-swap. Unlike the
// SQLite transaction it is not all or nothing: a fault stops it with
// store.ErrUnavailable and leaves what was written before the fault. The
// table's journal tries a failed Commit again with the same entries
// first: that stores no event twice, nor, for a session that has events
// in it, the display rows already stored (see appendMessages).
func (s *JSStore) Commit(ctx context.Context, b store.Batch, keep store.Retention) error {
	if b.Empty() {
		return nil
	}
	return s.write(func() error {
		var order []string
		seen := map[string]bool{}
		note := func(k string) {
			if !seen[k] {
				seen[k] = true
				order = append(order, k)
			}
		}
		msgs := map[string][]agent.Message{}
		firstEvent := map[string]uint64{}
		for _, e := range b.Events {
			if f, ok := firstEvent[e.Key]; !ok || e.Seq < f {
				firstEvent[e.Key] = e.Seq
			}
		}
		for _, m := range b.Messages {
			note(m.Key)
			msgs[m.Key] = append(msgs[m.Key], m.Message)
		}
		for _, r := range b.RunSeqs {
			note(r.Key)
		}
		for _, r := range b.RunEnds {
			note(r.Key)
		}
		for _, c := range b.Cursors {
			note(c.Key)
		}
		for _, e := range b.Ends {
			note(e.Key)
		}
		if err := s.appendEvents(ctx, b.Events, keep); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		for _, key := range order {
			if len(msgs[key]) > 0 {
				if err := s.appendMessages(ctx, key, msgs[key], firstEvent[key]); err != nil {
					return fmt.Errorf("commit: %w", err)
				}
			}
			err := s.updateRow(ctx, key, func(r *row) (bool, error) {
				changed := false
				for _, rs := range b.RunSeqs {
					for i := range r.Runs {
						if rs.Key == key && r.Runs[i].ID == rs.RunID {
							r.Runs[i].StartSeq, changed = rs.StartSeq, true
						}
					}
				}
				for _, e := range b.RunEnds {
					if e.Key == key && endRunRow(r, e.RunID, e.Status, e.At) {
						changed = true
					}
				}
				for _, c := range b.Cursors {
					if c.Key == key {
						r.Epoch, r.LastSeq, changed = c.Epoch, c.LastSeq, true
					}
				}
				for _, e := range b.Ends {
					if e.Key == key && endRow(r, e.Reason, e.At) {
						changed = true
					}
				}
				return changed, nil
			})
			if errors.Is(err, store.ErrNotFound) {
				// As the SQLite UPDATEs: no row, nothing to change.
				continue
			}
			if err != nil {
				return fmt.Errorf("commit: %w", err)
			}
		}
		return nil
	})
}

// errGap refuses an event that would leave a hole in a journal.
var errGap = errors.New("event seq leaves a gap in the journal")

// AppendEvents is store.Store.AppendEvents: events whose seq is already
// journaled for their session are ignored; then each session it wrote to
// is pruned to the retention bounds. Each event is one message on its
// session's subject, carrying its seq, published only if the subject's
// last message is the one this store read (expected last subject
// sequence): of two hosts journaling one session, a seq is journaled
// once, and in order. A seq beyond the journal's last + 1 is refused
// (store.ErrInvalid) unless the journal is empty.
func (s *JSStore) AppendEvents(ctx context.Context, events []store.Event, keep store.Retention) error {
	return s.write(func() error { return s.appendEvents(ctx, events, keep) })
}

// journalTop is the last message of a subject: its stream sequence and
// the seq (or row index) in its header, 0 and 0 for an empty subject.
type journalTop struct {
	streamSeq uint64
	seq       uint64
}

// lastOf reads the last message of subj from the stream leader.
func lastOf(ctx context.Context, st jetstream.Stream, subj string) (journalTop, *jetstream.RawStreamMsg, error) {
	m, err := st.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return journalTop{}, nil, nil
	}
	if err != nil {
		return journalTop{}, nil, err
	}
	seq, err := strconv.ParseUint(m.Header.Get(hdrSeq), 10, 64)
	if err != nil {
		return journalTop{}, nil, fmt.Errorf("%s: message %d has no seq: %w", subj, m.Sequence, store.ErrDamaged)
	}
	return journalTop{streamSeq: m.Sequence, seq: seq}, m, nil
}

// journalTop is key's last journaled event: from the cache unless
// reread, else from the stream leader (fresh).
func (s *JSStore) journalTop(ctx context.Context, key string, reread bool) (top journalTop, fresh bool, err error) {
	if !reread {
		if t, ok := s.tops.Load(key); ok {
			return t.(journalTop), false, nil
		}
	}
	top, _, err = lastOf(ctx, s.events, s.evSubj+key)
	if err != nil {
		s.tops.Delete(key)
		return journalTop{}, false, err
	}
	s.tops.Store(key, top)
	return top, true, nil
}

// maxJournalRaces bounds how often appendEvents reads a journal's last
// event again after another writer appended to it.
const maxJournalRaces = 100

func (s *JSStore) appendEvents(ctx context.Context, events []store.Event, keep store.Retention) error {
	if len(events) == 0 {
		return nil
	}
	keep = withDefaults(keep)
	byKey := map[string][]store.Event{}
	var order []string
	for _, e := range events {
		if !validToken(e.Key) {
			return fmt.Errorf("append event %s/%d: %w", e.Key, e.Seq, store.ErrInvalid)
		}
		if _, ok := byKey[e.Key]; !ok {
			order = append(order, e.Key)
		}
		byKey[e.Key] = append(byKey[e.Key], e)
	}
	var lastStreamSeq uint64
	for _, key := range order {
		evs := byKey[key]
		slices.SortStableFunc(evs, func(a, b store.Event) int { return cmp.Compare(a.Seq, b.Seq) })
		subj := s.evSubj + key
		top, fresh, err := s.journalTop(ctx, key, false)
		if err != nil {
			return fmt.Errorf("append events of %s: %w", key, err)
		}
		wrote := false
		for i, races := 0, 0; i < len(evs); {
			e := evs[i]
			if e.Seq <= top.seq {
				i++ // journaled already
				continue
			}
			if top.seq > 0 && e.Seq != top.seq+1 {
				if !fresh {
					// The cache may be behind another host's appends.
					if top, fresh, err = s.journalTop(ctx, key, true); err != nil {
						return fmt.Errorf("append events of %s: %w", key, err)
					}
					continue
				}
				return fmt.Errorf("append event %s/%d after %d: %w: %w", key, e.Seq, top.seq, errGap, store.ErrInvalid)
			}
			msg := nats.NewMsg(subj)
			msg.Header.Set(hdrSeq, strconv.FormatUint(e.Seq, 10))
			msg.Data = e.Params
			var ack *jetstream.PubAck
			err := retryBusy(ctx, &s.retries, func() (err error) {
				ack, err = s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(top.streamSeq), jetstream.WithExpectStream(s.evName))
				return err
			})
			if wrongLastSequence(err) && !busy(err) && races < maxJournalRaces {
				// Another writer journaled meanwhile: read its last.
				races++
				if top, fresh, err = s.journalTop(ctx, key, true); err != nil {
					return fmt.Errorf("append events of %s: %w", key, err)
				}
				continue
			}
			if err != nil {
				s.tops.Delete(key)
				return fmt.Errorf("append event %s/%d: %w", key, e.Seq, err)
			}
			top = journalTop{streamSeq: ack.Sequence, seq: e.Seq}
			s.tops.Store(key, top)
			lastStreamSeq = max(lastStreamSeq, ack.Sequence)
			wrote = true
			i++
		}
		if wrote && top.seq > uint64(keep.PerSession) {
			if err := s.events.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeKeep(uint64(keep.PerSession))); err != nil {
				return fmt.Errorf("prune events of %s: %w", key, err)
			}
		}
	}
	// The stream holds at most lastStreamSeq messages: prune it only
	// once that could exceed the total.
	if lastStreamSeq > uint64(keep.Total) {
		if err := s.events.Purge(ctx, jetstream.WithPurgeKeep(uint64(keep.Total))); err != nil {
			return fmt.Errorf("prune events: %w", err)
		}
	}
	return nil
}

// withDefaults is store.Retention's defaults (10,000 per session,
// 1,000,000 in all).
func withDefaults(r store.Retention) store.Retention {
	if r.PerSession <= 0 {
		r.PerSession = 10000
	}
	if r.Total <= 0 {
		r.Total = 1000000
	}
	return r
}

// fetchWait bounds a read of messages the stream said it holds (they
// could only be missing if pruned meanwhile).
const fetchWait = 5 * time.Second

// readSubject calls fn with the messages of subj in st from stream
// sequence from on, while fn asks for more. known is how many the subject
// holds from there, at least; fn returns the same after the message it
// was given (0 when it wants no more). A fetch asks for no more than
// that, so it returns as soon as it has them instead of waiting for
// messages that do not exist.
func (s *JSStore) readSubject(ctx context.Context, st jetstream.Stream, subj string, from uint64, known int, fn func(m jetstream.Msg) (int, error)) error {
	if known <= 0 {
		return nil
	}
	// A consumer of this read only: not acknowledged, in memory, on one
	// server, deleted when the read is done (and by the server after
	// a while if that delete is lost).
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject:     subj,
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       max(from, 1),
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fetchWait)
		defer cancel()
		_ = st.DeleteConsumer(dctx, cons.CachedInfo().Name)
	}()
	ctx, cancel := context.WithTimeout(ctx, fetchWait)
	defer cancel()
	wait := time.Millisecond
	for known > 0 {
		batch, err := cons.Fetch(min(known, 1000), jetstream.FetchContext(ctx))
		if err != nil {
			return err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if known > 0 && err == nil {
				known, err = fn(m)
			}
		}
		berr := batch.Error()
		if n == 0 && errors.Is(berr, nats.ErrNoResponders) && err == nil {
			// On a cluster, the new consumer's server may not yet be
			// known to the one this connection is on: ask again.
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("%w (asked again until: %w)", berr, ctx.Err())
			case <-t.C:
			}
			wait = min(2*wait, 50*time.Millisecond)
			continue
		}
		if berr != nil && err == nil {
			err = berr
		}
		if err != nil {
			return err
		}
		if n == 0 && known > 0 {
			return fmt.Errorf("%s: expected %d more messages, got none", subj, known)
		}
	}
	return nil
}

// seqOf is the seq header of m.
func seqOf(m jetstream.Msg) (uint64, error) {
	seq, err := strconv.ParseUint(m.Headers().Get(hdrSeq), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: a message has no seq: %w", m.Subject(), store.ErrDamaged)
	}
	return seq, nil
}

// EventsSince is store.Store.EventsSince: the bounds come from the
// subject's first and last messages; the events from a consumer of the
// subject started where seek found the first one wanted.
func (s *JSStore) EventsSince(ctx context.Context, key string, after uint64, limit int) (events []store.Event, first, last uint64, err error) {
	if limit <= 0 {
		limit = 10000
	}
	err = s.read(func() error {
		if !validToken(key) {
			return nil
		}
		subj := s.evSubj + key
		top, _, err := lastOf(ctx, s.events, subj)
		if err != nil || top.seq == 0 {
			return err
		}
		fm, err := s.events.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil // pruned meanwhile
		}
		if err != nil {
			return err
		}
		firstSeq, err := strconv.ParseUint(fm.Header.Get(hdrSeq), 10, 64)
		if err != nil {
			return fmt.Errorf("%s: message %d has no seq: %w", subj, fm.Sequence, store.ErrDamaged)
		}
		first, last = firstSeq, top.seq
		start := max(after+1, first)
		if start > last {
			return nil
		}
		end := min(last, start+uint64(limit)-1)
		from, err := s.seek(ctx, subj, start, journalTop{streamSeq: fm.Sequence, seq: first}, top)
		if err != nil {
			return err
		}
		events = make([]store.Event, 0, end-start+1)
		return s.readSubject(ctx, s.events, subj, from.streamSeq, int(last-from.seq+1), func(m jetstream.Msg) (int, error) {
			seq, err := seqOf(m)
			if err != nil {
				return 0, err
			}
			if seq >= start {
				events = append(events, store.Event{Key: key, Seq: seq, Params: append(json.RawMessage(nil), m.Data()...)})
			}
			if seq >= end {
				return 0, nil
			}
			return int(last - seq), nil
		})
	})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("events of %s since %d: %w", key, after, err)
	}
	return events, first, last, nil
}

// maxSeeks bounds the reads seek makes.
const maxSeeks = 8

// seek returns a message of subj at or before the event start, as close
// to it as a few reads find, given two messages around it (lo.seq <=
// start <= hi.seq). A journal has no gaps, so event start is at least
// start-lo.seq stream messages after lo and hi.seq-start before hi; seek
// guesses its place between them in proportion (other sessions'
// messages are spread evenly, roughly) and reads the subject's first
// message from the guess on, which narrows one side. A journal alone in
// the stream is found by the first guess.
func (s *JSStore) seek(ctx context.Context, subj string, start uint64, lo, hi journalTop) (journalTop, error) {
	for range maxSeeks {
		if lo.seq >= start || hi.seq <= lo.seq {
			break
		}
		guess := lo.streamSeq + (hi.streamSeq-lo.streamSeq)*(start-lo.seq)/(hi.seq-lo.seq)
		guess = max(guess, lo.streamSeq+(start-lo.seq))
		guess = min(guess, hi.streamSeq-(hi.seq-start))
		m, err := s.events.GetMsg(ctx, guess, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break // pruned meanwhile: read from lo
		}
		if err != nil {
			return journalTop{}, err
		}
		seq, err := strconv.ParseUint(m.Header.Get(hdrSeq), 10, 64)
		if err != nil {
			return journalTop{}, fmt.Errorf("%s: message %d has no seq: %w", subj, m.Sequence, store.ErrDamaged)
		}
		at := journalTop{streamSeq: m.Sequence, seq: seq}
		if seq <= start {
			lo = at
		} else {
			hi = at
		}
	}
	return lo, nil
}

// keyLock is the mutex of key's messages writers in this process.
func (s *JSStore) keyLock(key string) *sync.Mutex {
	mu, _ := s.keyLocks.LoadOrStore(key, new(sync.Mutex))
	return mu.(*sync.Mutex)
}

// AppendMessages is store.Store.AppendMessages: all of msgs are one
// message on the session's subject (so they are stored together or not
// at all, and stay adjacent), published only if the subject's last
// message is the one this store read.
func (s *JSStore) AppendMessages(ctx context.Context, key string, msgs ...agent.Message) error {
	return s.write(func() error {
		if _, _, err := s.getRow(ctx, key); err != nil {
			return fmt.Errorf("append messages: %w", err)
		}
		return s.appendMessages(ctx, key, msgs, 0)
	})
}

// storedRow is one display row as a messages message holds it.
type storedRow struct {
	Role string `json:"role"`
	Text string `json:"text"`
}

// appendMessages appends msgs to key's display rows as one message. A
// Commit gives batch, the lowest seq of the session's events it holds
// (0: none, and for other writers): when the session's last messages
// message was written by a Commit with the same batch, that Commit
// failed after storing it, and this is the table's journal trying it
// again with the same queued entries first (and perhaps more behind):
// the rows it stored are the first of msgs, and are not stored twice.
func (s *JSStore) appendMessages(ctx context.Context, key string, msgs []agent.Message, batch uint64) error {
	if len(msgs) == 0 {
		return nil
	}
	mu := s.keyLock(key)
	mu.Lock()
	defer mu.Unlock()
	subj := s.msgSubj + key
	for range maxJournalRaces {
		c, err := s.messageCount(ctx, key)
		if err != nil {
			return fmt.Errorf("append messages to %s: %w", key, err)
		}
		todo := msgs
		if batch != 0 && c.batch == batch {
			todo = msgs[min(c.lastRows, len(msgs)):]
			if len(todo) == 0 {
				return nil
			}
		}
		rows := make([]storedRow, len(todo))
		for i, m := range todo {
			rows[i] = storedRow{Role: string(m.Role), Text: m.Text}
		}
		data, err := json.Marshal(rows)
		if err != nil {
			return err
		}
		msg := nats.NewMsg(subj)
		if batch != 0 {
			msg.Header.Set(hdrBatch, strconv.FormatUint(batch, 10))
		}
		msg.Header.Set(hdrSeq, strconv.Itoa(c.rows+1))
		msg.Header.Set(hdrCount, strconv.Itoa(len(rows)))
		msg.Header.Set(hdrPart, strconv.Itoa(c.parts+1))
		top := c.streamSeq
		msg.Data = data
		err = retryBusy(ctx, &s.retries, func() error {
			_, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(top))
			return err
		})
		if wrongLastSequence(err) && !busy(err) {
			continue // another host appended meanwhile
		}
		if err != nil {
			return fmt.Errorf("append messages to %s: %w", key, err)
		}
		return nil
	}
	return fmt.Errorf("append messages to %s: lost %d races in a row: %w", key, maxJournalRaces, store.ErrUnavailable)
}

// rowCount is what a session's messages subject holds: its display
// rows, its stream messages, and its last message's stream sequence
// (all 0 when it has none).
type rowCount struct {
	rows, parts int
	streamSeq   uint64
	// lastRows and batch are the last message's row count and Commit
	// batch (0 when not written by a Commit).
	lastRows int
	batch    uint64
}

// messageCount reads key's rowCount from its subject's last message.
func (s *JSStore) messageCount(ctx context.Context, key string) (rowCount, error) {
	top, m, err := lastOf(ctx, s.messages, s.msgSubj+key)
	if err != nil || m == nil {
		return rowCount{}, err
	}
	n, err1 := strconv.Atoi(m.Header.Get(hdrCount))
	parts, err2 := strconv.Atoi(m.Header.Get(hdrPart))
	if err := errors.Join(err1, err2); err != nil {
		return rowCount{}, fmt.Errorf("%s: message %d has no row count: %v: %w", m.Subject, m.Sequence, err, store.ErrDamaged)
	}
	batch, _ := strconv.ParseUint(m.Header.Get(hdrBatch), 10, 64)
	return rowCount{rows: int(top.seq) + n - 1, parts: parts, streamSeq: top.streamSeq, lastRows: n, batch: batch}, nil
}

// ownMessages returns the first limit own rows of key (all when limit <
// 0), never nil.
func (s *JSStore) ownMessages(ctx context.Context, key string, limit int) ([]agent.Message, error) {
	out := []agent.Message{}
	c, err := s.messageCount(ctx, key)
	if err != nil || c.rows == 0 || limit == 0 {
		return out, err
	}
	if limit < 0 || limit > c.rows {
		limit = c.rows
	}
	// Each stream message holds at least one row: the first limit of
	// them hold the rows wanted.
	read := 0
	err = s.readSubject(ctx, s.messages, s.msgSubj+key, 1, c.parts, func(m jetstream.Msg) (int, error) {
		read++
		var rows []storedRow
		if err := json.Unmarshal(m.Data(), &rows); err != nil {
			return 0, fmt.Errorf("%s: not display rows: %v: %w", m.Subject(), err, store.ErrDamaged)
		}
		for _, r := range rows {
			if len(out) == limit {
				break
			}
			out = append(out, agent.Message{Role: agent.Role(r.Role), Text: r.Text})
		}
		if len(out) == limit {
			return 0, nil
		}
		return c.parts - read, nil
	})
	if err != nil {
		return nil, fmt.Errorf("session %s: messages: %w", key, err)
	}
	return out, nil
}

// Messages is store.Store.Messages.
func (s *JSStore) Messages(ctx context.Context, key string) ([]agent.Message, error) {
	var out []agent.Message
	err := s.read(func() error {
		if _, _, err := s.getRow(ctx, key); err != nil {
			return err
		}
		var err error
		out, err = s.ownMessages(ctx, key, -1)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("messages: %w", err)
	}
	return out, nil
}

// lineage is host/store's: the chain from key up to its root, key first;
// a missing ancestor or a cycle ends it.
func (s *JSStore) lineage(ctx context.Context, key string) ([]store.Generation, error) {
	var chain []store.Generation
	seen := map[string]bool{}
	for cur := key; cur != "" && !seen[cur]; {
		seen[cur] = true
		r, _, err := s.getRow(ctx, cur)
		if errors.Is(err, store.ErrNotFound) {
			if len(chain) == 0 {
				return nil, err
			}
			break
		}
		if err != nil {
			return nil, err
		}
		c, err := s.messageCount(ctx, cur)
		if err != nil {
			return nil, err
		}
		chain = append(chain, store.Generation{Key: cur, ForkCount: r.ForkCount, OwnCount: c.rows})
		cur = r.Parent
	}
	return chain, nil
}

// DisplayMessages is store.Store.DisplayMessages.
func (s *JSStore) DisplayMessages(ctx context.Context, key string) ([]agent.Message, error) {
	var out []agent.Message
	err := s.read(func() error {
		chain, err := s.lineage(ctx, key)
		if err != nil {
			return err
		}
		total, own := store.DisplayPlan(chain)
		out = make([]agent.Message, 0, total)
		for i := len(chain) - 1; i >= 0; i-- {
			if own[i] == 0 {
				continue
			}
			rows, err := s.ownMessages(ctx, chain[i].Key, own[i])
			if err != nil {
				return err
			}
			out = append(out, rows...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("display messages: %w", err)
	}
	return out, nil
}

// DisplayCount is store.Store.DisplayCount.
func (s *JSStore) DisplayCount(ctx context.Context, key string) (int, error) {
	var n int
	err := s.read(func() error {
		chain, err := s.lineage(ctx, key)
		if err != nil {
			return err
		}
		n, _ = store.DisplayPlan(chain)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("display count: %w", err)
	}
	return n, nil
}
