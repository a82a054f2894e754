package store

import (
	"context"
	"database/sql"
	"fmt"
)

// migrations holds the schema, one forward-only step per version: applying
// migrations[N-1] takes a database from user_version N-1 to N. Steps are
// never edited once released; a schema change is a new step at the end.
var migrations = []string{
	// 1: stored sessions and their own display rows.
	`CREATE TABLE sessions (
		key        TEXT PRIMARY KEY NOT NULL,
		title      TEXT NOT NULL DEFAULT '',
		parent     TEXT REFERENCES sessions(key),
		fork_count INTEGER NOT NULL DEFAULT 0,
		started_at INTEGER NOT NULL,
		ended_at   INTEGER,
		end_reason TEXT NOT NULL DEFAULT ''
	);
	CREATE TABLE messages (
		session_key TEXT NOT NULL REFERENCES sessions(key) ON DELETE CASCADE,
		seq         INTEGER NOT NULL,
		role        TEXT NOT NULL,
		text        TEXT NOT NULL,
		PRIMARY KEY (session_key, seq)
	) WITHOUT ROWID;`,

	// 2: the event cursor persisted by the host, and indexes for the
	// listing and title lookups.
	`ALTER TABLE sessions ADD COLUMN epoch TEXT NOT NULL DEFAULT '';
	ALTER TABLE sessions ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0;
	CREATE INDEX sessions_by_start ON sessions(started_at, key);
	CREATE INDEX sessions_by_title ON sessions(title, started_at, key);
	CREATE INDEX sessions_by_parent ON sessions(parent);`,

	// 3: the event journal (every event sent for a session, by seq) and
	// the runs of each session.
	`CREATE TABLE events (
		id          INTEGER PRIMARY KEY,
		session_key TEXT NOT NULL REFERENCES sessions(key) ON DELETE CASCADE,
		seq         INTEGER NOT NULL,
		params      TEXT NOT NULL,
		UNIQUE (session_key, seq)
	);
	CREATE TABLE runs (
		session_key TEXT NOT NULL REFERENCES sessions(key) ON DELETE CASCADE,
		run_id      TEXT NOT NULL,
		status      TEXT NOT NULL,
		started_at  INTEGER NOT NULL,
		ended_at    INTEGER,
		start_seq   INTEGER NOT NULL DEFAULT 0,
		PRIMARY KEY (session_key, run_id)
	) WITHOUT ROWID;
	CREATE INDEX runs_by_start ON runs(session_key, started_at);`,

	// 4: what a session's agent keeps across lives (an ACP agent's
	// session id, its working directory).
	`ALTER TABLE sessions ADD COLUMN agent_state TEXT NOT NULL DEFAULT '';`,

	// 5: the bytes of each session's journal (its events' params), so
	// that its bytes bound needs no scan of the journal: the one code
	// that journals events adds theirs (appendEventsTx, one statement
	// per commit), and whatever deletes events takes theirs off, by
	// this trigger. (An update per session, or a trigger on insert too,
	// cost a commit far more: BenchmarkCommitEvents.)
	`ALTER TABLE sessions ADD COLUMN journal_bytes INTEGER NOT NULL DEFAULT 0;
	UPDATE sessions SET journal_bytes =
		(SELECT COALESCE(SUM(length(CAST(params AS BLOB))), 0) FROM events WHERE events.session_key = sessions.key);
	CREATE TRIGGER events_bytes_delete AFTER DELETE ON events BEGIN
		UPDATE sessions SET journal_bytes = journal_bytes - length(CAST(OLD.params AS BLOB)) WHERE key = OLD.session_key;
	END;`,

	// 6: credentials: each one's secret as its SHA-256 (never the
	// secret), its name, kind and scopes.
	`CREATE TABLE IF NOT EXISTS credentials (
		hash        TEXT PRIMARY KEY NOT NULL,
		id          TEXT NOT NULL UNIQUE,
		name        TEXT NOT NULL,
		kind        TEXT NOT NULL,
		scopes      TEXT NOT NULL DEFAULT '[]',
		parent      TEXT NOT NULL DEFAULT '',
		parent_hash TEXT NOT NULL DEFAULT '',
		created_at  INTEGER NOT NULL,
		expires_at  INTEGER NOT NULL DEFAULT 0,
		last_used   INTEGER NOT NULL DEFAULT 0
	) WITHOUT ROWID;`,

	// 7: who started each run (the name of the credential that
	// submitted its prompt), for the listing's "who started the last
	// run".
	`ALTER TABLE runs ADD COLUMN started_by TEXT NOT NULL DEFAULT '';`,

	// 8: the notifications' outbox: each notification (its body, as
	// sent) once per notifier, stored before it is sent and deleted once
	// delivered or given up.
	`CREATE TABLE IF NOT EXISTS outbox (
		id         TEXT NOT NULL,
		notifier   TEXT NOT NULL,
		body       TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		PRIMARY KEY (id, notifier)
	) WITHOUT ROWID;`,

	// 9: a prompt's content blocks as its client sent them (a JSON
	// array of ACP content blocks; '' for a text-only row).
	`ALTER TABLE messages ADD COLUMN content TEXT NOT NULL DEFAULT '';`,

	// 10: the page's Web Push subscriptions, each the credential's that
	// made it (docs/NOTIFICATIONS.md, "Web Push").
	`CREATE TABLE IF NOT EXISTS push_subscriptions (
		endpoint   TEXT NOT NULL PRIMARY KEY,
		p256dh     TEXT NOT NULL,
		auth       TEXT NOT NULL,
		credential TEXT NOT NULL,
		created_at INTEGER NOT NULL
	) WITHOUT ROWID;`,
}

// latestVersion is the schema version Open migrates to.
var latestVersion = len(migrations)

// migrateTo applies the steps of migrations needed to bring db to version
// target.
func migrateTo(ctx context.Context, db *sql.DB, target int) error {
	return applySteps(ctx, db, migrations, target)
}

// applySteps brings db to version target using steps, where steps[N-1] leads
// to version N. Each step runs in its own transaction together with the bump
// of user_version, so a failing step leaves the database at the version it
// had before that step. A database newer than steps describe is refused with
// ErrSchemaTooNew.
func applySteps(ctx context.Context, db *sql.DB, steps []string, target int) error {
	if target < 0 || target > len(steps) {
		return fmt.Errorf("migrate to version %d: %w: versions are 0..%d", target, ErrInvalid, len(steps))
	}
	for {
		done, err := applyNextStep(ctx, db, steps, target)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
	}
}

// applyNextStep applies the step after the database's current version, if
// that version is below target. It reports done when nothing was left to do.
// The version is read inside the transaction so that two processes
// migrating the same file do not apply a step twice.
func applyNextStep(ctx context.Context, db *sql.DB, steps []string, target int) (done bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("migrate: begin: %w", err)
	}
	defer func() {
		if err != nil || done {
			_ = tx.Rollback()
		}
	}()
	v, err := userVersion(ctx, tx)
	if err != nil {
		return false, err
	}
	switch {
	case v > len(steps):
		return false, fmt.Errorf("migrate: database is at version %d, newest known is %d: %w", v, len(steps), ErrSchemaTooNew)
	case v >= target:
		return true, nil
	}
	next := v + 1
	if _, err := tx.ExecContext(ctx, steps[v]); err != nil {
		return false, fmt.Errorf("migrate to version %d: %w", next, err)
	}
	// PRAGMA takes no bound parameters; next is an int we computed.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", next)); err != nil {
		return false, fmt.Errorf("migrate to version %d: set user_version: %w", next, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("migrate to version %d: commit: %w", next, err)
	}
	return false, nil
}

// queryer is what *sql.DB, *sql.Conn and *sql.Tx have in common.
type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// userVersion reads PRAGMA user_version.
func userVersion(ctx context.Context, q queryer) (int, error) {
	var v int
	if err := q.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return 0, fmt.Errorf("read user_version: %w", err)
	}
	return v, nil
}
