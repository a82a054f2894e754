package store

import (
	"context"
	"database/sql"
	"encoding/json"
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

// Retention bounds the journal: events kept per session and in all. Zero
// fields mean the defaults (10,000 and 1,000,000).
type Retention struct {
	PerSession int
	Total      int
}

func (r Retention) withDefaults() Retention {
	if r.PerSession <= 0 {
		r.PerSession = 10000
	}
	if r.Total <= 0 {
		r.Total = 1000000
	}
	return r
}

// AppendEvents journals events in one transaction, then prunes the
// sessions it touched to the retention bounds. Events whose seq is already
// journaled for their session are ignored.
func (s *Store) AppendEvents(ctx context.Context, events []Event, keep Retention) error {
	return s.write(func() error { return s.appendEvents(ctx, events, keep) })
}

func (s *Store) appendEvents(ctx context.Context, events []Event, keep Retention) error {
	if len(events) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("append events: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := appendEventsTx(ctx, tx, events, keep); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("append events: commit: %w", err)
	}
	return nil
}

// appendEventsTx journals events in tx and prunes the sessions it touched
// to the retention bounds.
func appendEventsTx(ctx context.Context, tx *sql.Tx, events []Event, keep Retention) error {
	if len(events) == 0 {
		return nil
	}
	keep = keep.withDefaults()
	stmt, err := tx.PrepareContext(ctx, `INSERT OR IGNORE INTO events (session_key, seq, params) VALUES (?, ?, ?)`)
	if err != nil {
		return fmt.Errorf("append events: %w", err)
	}
	defer stmt.Close()
	touched := map[string]uint64{}
	for _, e := range events {
		if _, err := stmt.ExecContext(ctx, e.Key, int64(e.Seq), string(e.Params)); err != nil {
			return fmt.Errorf("append event %s/%d: %w", e.Key, e.Seq, err)
		}
		touched[e.Key] = max(touched[e.Key], e.Seq)
	}
	for key, top := range touched {
		if top > uint64(keep.PerSession) {
			if _, err := tx.ExecContext(ctx, `DELETE FROM events WHERE session_key = ? AND seq <= ?`, key, int64(top)-int64(keep.PerSession)); err != nil {
				return fmt.Errorf("prune events of %s: %w", key, err)
			}
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM events WHERE id <= (SELECT MAX(id) FROM events) - ?`, keep.Total); err != nil {
		return fmt.Errorf("prune events: %w", err)
	}
	return nil
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
}

// StartRun records a run in flight.
func (s *Store) StartRun(ctx context.Context, key string, r Run) error {
	return s.write(func() error { return s.startRun(ctx, key, r) })
}

func (s *Store) startRun(ctx context.Context, key string, r Run) error {
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO runs (session_key, run_id, status, started_at, start_seq) VALUES (?, ?, ?, ?, ?)`,
		key, r.ID, r.Status, unixOf(r.StartedAt), int64(r.StartSeq))
	if err != nil {
		return fmt.Errorf("start run %s of %s: %w", r.ID, key, err)
	}
	return nil
}

// EndRun records how a run ended; a run already ended keeps its status.
func (s *Store) EndRun(ctx context.Context, key, runID, status string, at time.Time) error {
	return s.write(func() error { return s.endRun(ctx, key, runID, status, at) })
}

func (s *Store) endRun(ctx context.Context, key, runID, status string, at time.Time) error {
	_, err := s.db.ExecContext(ctx,
		`UPDATE runs SET status = ?, ended_at = ? WHERE session_key = ? AND run_id = ? AND ended_at IS NULL`,
		status, unixOf(at), key, runID)
	if err != nil {
		return fmt.Errorf("end run %s of %s: %w", runID, key, err)
	}
	return nil
}

// Runs lists the runs of key, oldest first.
func (s *Store) Runs(ctx context.Context, key string) ([]Run, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT run_id, status, started_at, ended_at, start_seq FROM runs WHERE session_key = ? ORDER BY started_at, start_seq`, key)
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
		if err := rows.Scan(&r.ID, &r.Status, &started, &ended, &startSeq); err != nil {
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
