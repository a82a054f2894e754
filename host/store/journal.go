package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Event is one journaled event: its session, seq and encoded params (the
// object sent to clients).
type Event struct {
	Key    string
	Seq    uint64
	Params json.RawMessage
}

// Retention bounds the journal: events kept per session and in all, and
// the bytes of each session's events (their params). Past a bound the
// oldest events go; the bytes bound never takes a session's newest event,
// so a journal is empty only when it was never written. Zero fields mean
// the defaults (10,000, 1,000,000 and 64 MiB).
type Retention struct {
	PerSession      int
	Total           int
	PerSessionBytes int64
}

// DefaultPerSessionBytes is Retention.PerSessionBytes by default
// (--journal-bytes-per-session).
const DefaultPerSessionBytes = 64 << 20

// WithDefaults returns r with its zero fields set to the defaults.
func (r Retention) WithDefaults() Retention {
	if r.PerSession <= 0 {
		r.PerSession = 10000
	}
	if r.Total <= 0 {
		r.Total = 1000000
	}
	if r.PerSessionBytes <= 0 {
		r.PerSessionBytes = DefaultPerSessionBytes
	}
	return r
}

// AppendEvents journals events in one transaction (with other writes
// queued with it: see group.go), then prunes the sessions it touched to
// the retention bounds. Events whose seq is already journaled for their
// session are ignored.
func (s *Store) AppendEvents(ctx context.Context, events []Event, keep Retention) error {
	if len(events) == 0 {
		return nil
	}
	return s.write(func() error {
		return s.group(ctx, "append events", func(ctx context.Context, tx *sql.Tx) error {
			return appendEventsTx(ctx, tx, events, keep)
		})
	})
}

// appendEventsTx journals events in tx and prunes the sessions it touched
// to the retention bounds. Each session's row keeps the bytes of its
// journal (journal_bytes, migration 5): what a commit journals is added
// here, to every session it touched in one statement, which also says
// which are past the bytes bound; whatever deletes events takes theirs
// off (a trigger). A prune by bytes reads only the events it removes.
func appendEventsTx(ctx context.Context, tx *sql.Tx, events []Event, keep Retention) error {
	if len(events) == 0 {
		return nil
	}
	keep = keep.WithDefaults()
	j, err := prepareJournal(ctx, tx)
	if err != nil {
		return fmt.Errorf("append events: %w", err)
	}
	defer j.close()
	touched := map[string]uint64{}
	added := map[string]int64{} // bytes journaled, by session
	var lastID int64            // the highest event id now, if any was journaled
	for _, e := range events {
		res, err := j.insert.ExecContext(ctx, e.Key, int64(e.Seq), string(e.Params))
		if err != nil {
			return fmt.Errorf("append event %s/%d: %w", e.Key, e.Seq, err)
		}
		if n, err := res.RowsAffected(); err == nil && n > 0 {
			added[e.Key] += int64(len(e.Params))
			if id, err := res.LastInsertId(); err == nil {
				lastID = max(lastID, id)
			}
		}
		touched[e.Key] = max(touched[e.Key], e.Seq)
	}
	for key, top := range touched {
		if top > uint64(keep.PerSession) {
			if _, err := j.pruneCount.ExecContext(ctx, key, int64(top)-int64(keep.PerSession)); err != nil {
				return fmt.Errorf("prune events of %s: %w", key, err)
			}
		}
	}
	over, err := addBytesTx(ctx, tx, added, keep.PerSessionBytes)
	if err != nil {
		return fmt.Errorf("append events: %w", err)
	}
	for key, total := range over {
		if err := j.pruneBytes(ctx, key, total, keep.PerSessionBytes); err != nil {
			return fmt.Errorf("prune events of %s: %w", key, err)
		}
	}
	// Ids start at 1 and only grow: the journal holds at most lastID
	// events, so there is something to prune only past the total.
	if lastID > int64(keep.Total) {
		if _, err := tx.ExecContext(ctx, `DELETE FROM events WHERE id <= ?`, lastID-int64(keep.Total)); err != nil {
			return fmt.Errorf("prune events: %w", err)
		}
	}
	return nil
}

// journalTx is the statements of a journal write, prepared once for
// every event and session of it.
type journalTx struct {
	tx         *sql.Tx
	insert     *sql.Stmt // session, seq, params
	pruneCount *sql.Stmt // session, the last seq to remove
}

func prepareJournal(ctx context.Context, tx *sql.Tx) (*journalTx, error) {
	j := &journalTx{tx: tx}
	for _, p := range []struct {
		stmt  **sql.Stmt
		query string
	}{
		{&j.insert, `INSERT OR IGNORE INTO events (session_key, seq, params) VALUES (?, ?, ?)`},
		{&j.pruneCount, `DELETE FROM events WHERE session_key = ? AND seq <= ?`},
	} {
		stmt, err := tx.PrepareContext(ctx, p.query)
		if err != nil {
			j.close()
			return nil, err
		}
		*p.stmt = stmt
	}
	return j, nil
}

func (j *journalTx) close() {
	for _, s := range []*sql.Stmt{j.insert, j.pruneCount} {
		if s != nil {
			_ = s.Close()
		}
	}
}

// addBytesTx adds the bytes each session's events just journaled to its
// row, all in one statement, and returns the sessions that now hold more
// than most bytes, with their bytes.
func addBytesTx(ctx context.Context, tx *sql.Tx, added map[string]int64, most int64) (map[string]int64, error) {
	if len(added) == 0 {
		return nil, nil
	}
	type add struct {
		K string `json:"k"`
		N int64  `json:"n"`
	}
	adds := make([]add, 0, len(added))
	for k, n := range added {
		adds = append(adds, add{k, n})
	}
	arg, err := json.Marshal(adds)
	if err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, `UPDATE sessions SET journal_bytes = journal_bytes + a.value ->> 'n'
		FROM json_each(?) AS a WHERE sessions.key = a.value ->> 'k' RETURNING sessions.key, sessions.journal_bytes`, string(arg))
	if err != nil {
		return nil, fmt.Errorf("journal bytes: %w", err)
	}
	defer rows.Close()
	var over map[string]int64
	for rows.Next() {
		var key string
		var total int64
		if err := rows.Scan(&key, &total); err != nil {
			return nil, fmt.Errorf("journal bytes: %w", err)
		}
		if total > most {
			if over == nil {
				over = map[string]int64{}
			}
			over[key] = total
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("journal bytes: %w", err)
	}
	return over, nil
}

// pruneBytes removes key's oldest events while its journal, of total
// bytes, holds more than most bytes, never its newest one.
func (j *journalTx) pruneBytes(ctx context.Context, key string, total, most int64) error {
	rows, err := j.tx.QueryContext(ctx,
		`SELECT seq, length(CAST(params AS BLOB)) FROM events
		WHERE session_key = ? AND seq < (SELECT MAX(seq) FROM events WHERE session_key = ?) ORDER BY seq`, key, key)
	if err != nil {
		return fmt.Errorf("oldest events: %w", err)
	}
	defer rows.Close()
	cut := int64(-1)
	for total > most && rows.Next() {
		var seq, n int64
		if err := rows.Scan(&seq, &n); err != nil {
			return fmt.Errorf("oldest events: %w", err)
		}
		cut, total = seq, total-n
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("oldest events: %w", err)
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("oldest events: %w", err)
	}
	if cut < 0 {
		return nil
	}
	if _, err := j.tx.ExecContext(ctx, `DELETE FROM events WHERE session_key = ? AND seq <= ?`, key, cut); err != nil {
		return fmt.Errorf("past %d bytes: %w", most, err)
	}
	return nil
}

// JournalBytes is the bytes of key's journal: the params of its events,
// as the bytes bound counts them.
func (s *Store) JournalBytes(ctx context.Context, key string) (int64, error) {
	var n int64
	if err := s.reader().QueryRowContext(ctx, `SELECT journal_bytes FROM sessions WHERE key = ?`, key).Scan(&n); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("journal bytes of %s: %w", key, ErrNotFound)
		}
		return 0, fmt.Errorf("journal bytes of %s: %w", key, err)
	}
	return n, nil
}

// EventsSince returns the journaled events of key with seq > after, in seq
// order, at most limit (limit <= 0 means 10,000), and the bounds of what
// the journal holds for key: the lowest and highest seq (0, 0 when empty).
func (s *Store) EventsSince(ctx context.Context, key string, after uint64, limit int) (events []Event, first, last uint64, err error) {
	if limit <= 0 {
		limit = 10000
	}
	err = s.readTx(ctx, func(tx *sql.Tx) error {
		var lo, hi sql.NullInt64
		if err := tx.QueryRowContext(ctx, `SELECT MIN(seq), MAX(seq) FROM events WHERE session_key = ?`, key).Scan(&lo, &hi); err != nil {
			return err
		}
		first, last = uint64(lo.Int64), uint64(hi.Int64)
		rows, err := tx.QueryContext(ctx, `SELECT seq, params FROM events WHERE session_key = ? AND seq > ? ORDER BY seq LIMIT ?`, key, int64(after), limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var seq int64
			var params string
			if err := rows.Scan(&seq, &params); err != nil {
				return err
			}
			events = append(events, Event{Key: key, Seq: uint64(seq), Params: json.RawMessage(params)})
		}
		return rows.Err()
	})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("events of %s since %d: %w", key, after, err)
	}
	return events, first, last, nil
}

// Run is one prompt run of a session.
type Run struct {
	ID        string
	Status    string // running, complete, interrupted, failed
	StartedAt time.Time
	EndedAt   time.Time // zero while running
	// StartSeq is the seq of the run's message.start event.
	StartSeq uint64
	// By is the name of the credential whose prompt started the run
	// ("" for runs stored before it was recorded).
	By string
}

// StartRun records a run in flight.
func (s *Store) StartRun(ctx context.Context, key string, r Run) error {
	return s.write(func() error {
		return s.group(ctx, "start run "+r.ID+" of "+key, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx,
				`INSERT INTO runs (session_key, run_id, status, started_at, start_seq, started_by) VALUES (?, ?, ?, ?, ?, ?)`,
				key, r.ID, r.Status, unixOf(r.StartedAt), int64(r.StartSeq), r.By)
			if err != nil {
				return fmt.Errorf("start run %s of %s: %w", r.ID, key, err)
			}
			return nil
		})
	})
}

// EndRun records how a run ended; a run already ended keeps its status.
func (s *Store) EndRun(ctx context.Context, key, runID, status string, at time.Time) error {
	return s.write(func() error {
		return s.group(ctx, "end run "+runID+" of "+key, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx,
				`UPDATE runs SET status = ?, ended_at = ? WHERE session_key = ? AND run_id = ? AND ended_at IS NULL`,
				status, unixOf(at), key, runID)
			if err != nil {
				return fmt.Errorf("end run %s of %s: %w", runID, key, err)
			}
			return nil
		})
	})
}

// Runs lists the runs of key, oldest first.
func (s *Store) Runs(ctx context.Context, key string) ([]Run, error) {
	rows, err := s.reader().QueryContext(ctx,
		`SELECT run_id, status, started_at, ended_at, start_seq, started_by FROM runs WHERE session_key = ? ORDER BY started_at, start_seq`, key)
	if err != nil {
		return nil, fmt.Errorf("runs of %s: %w", key, err)
	}
	defer rows.Close()
	out := []Run{}
	for rows.Next() {
		var r Run
		var started int64
		var ended sql.NullInt64
		var startSeq int64
		if err := rows.Scan(&r.ID, &r.Status, &started, &ended, &startSeq, &r.By); err != nil {
			return nil, fmt.Errorf("runs of %s: %w", key, err)
		}
		r.StartedAt = timeOf(started)
		if ended.Valid {
			r.EndedAt = timeOf(ended.Int64)
		}
		r.StartSeq = uint64(startSeq)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("runs of %s: %w", key, err)
	}
	return out, nil
}
