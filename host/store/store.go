// Package store persists tether's stored sessions and their display rows in
// one SQLite database file (state.db in the host's state directory).
//
// The database is opened with modernc.org/sqlite (no cgo) in WAL mode with
// foreign keys on, and its schema is brought to the newest version by
// numbered, forward-only migrations, each applied in its own transaction
// together with the bump of PRAGMA user_version. A Store is safe for use by
// many goroutines: it writes through a single connection, so writes and
// write transactions are serialised (the writes of a burst, prompts,
// runs, journal appends and display rows, are committed in groups by one
// writer goroutine: see group.go), and reads through a small pool of
// read-only connections, which in WAL mode read the last committed state
// without waiting for a write in progress.
//
// A stored session is named by a key of the form YYYYMMDD_HHMMSS_xxxxxx
// (see NewKey). A session may have a parent: its display history is then the
// parent's display history cut to the first ForkCount rows, followed by its
// own rows (see DisplayMessages). Times are stored as Unix seconds.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/internal/statedir"
)

// Errors returned by the store. Test for them with errors.Is.
var (
	// ErrNotFound: no stored session with that key (or title).
	ErrNotFound = errors.New("stored session not found")
	// ErrExists: a stored session with that key already exists.
	ErrExists = errors.New("stored session already exists")
	// ErrInvalid: an argument is out of range (empty key or reason,
	// negative fork count, unknown migration version).
	ErrInvalid = errors.New("invalid argument")
	// ErrSchemaTooNew: the database was written by a newer tether whose
	// schema this binary does not know.
	ErrSchemaTooNew = errors.New("database schema is newer than this binary")
)

// busyTimeout is how long a statement waits for a lock held by another
// connection (another process on the same file) before failing.
const busyTimeout = 5 * time.Second

// walCheckpointPages is the size of the WAL, in pages of 4 KiB, past
// which a commit checkpoints it into the database file (so the next
// write starts it again from its beginning), and walSizeLimit the bytes
// the WAL file is cut back to when it starts again. SQLite's default
// threshold, 1,000 pages, is about 4 MiB: on a disk with less room than
// that the WAL was never checkpointed, it grew until it had taken all
// the room there was, and from then on every write failed with
// SQLITE_FULL for good, even once room was made elsewhere, for the
// WAL took that room too and a checkpoint needs room for the database
// file to grow into (TestWritesRecoverAfterDiskFull). A checkpoint
// every 1 MiB or so costs a commit little (BenchmarkCommitEvents).
const (
	walCheckpointPages = 256
	walSizeLimit       = 1 << 20
)

// defaultListLimit is the number of sessions List returns when asked for
// limit <= 0.
const defaultListLimit = 100

// Store is an open state database. Its methods are safe for concurrent use.
type Store struct {
	db      *sql.DB                      // the one connection that writes (and the schema's)
	rdb     *sql.DB                      // the connections that read (nil: reads go to db)
	fault   atomic.Pointer[func() error] // SetWriteFault's hook; nil: none
	onFault atomic.Pointer[func(error)]  // OnWriteFault's hook; nil: none
	w       *committer                   // the writer of grouped writes (group.go); nil: each alone

	closeOnce sync.Once
	closeErr  error
}

// Session is one stored session.
type Session struct {
	// Key is the stored key, YYYYMMDD_HHMMSS_xxxxxx.
	Key string
	// Title is the session's title, "" when it has none.
	Title string
	// Parent is the stored key of the parent session, or "".
	Parent string
	// ForkCount is the number of the parent's display rows visible as this
	// session's prefix.
	ForkCount int
	// StartedAt is when the session was created.
	StartedAt time.Time
	// EndedAt is when the session ended; zero while it has not.
	EndedAt time.Time
	// EndReason is why the session ended ("closed", "shutdown", …); ""
	// while it has not.
	EndReason string
	// MessageCount is the number of the session's own message rows. It is
	// filled by reads and ignored by CreateSession.
	MessageCount int
	// LastActive is when the session was last active as far as the store
	// knows: the latest of StartedAt, EndedAt and its runs' start and end
	// times. It is filled by List only (zero from the other reads) and
	// ignored by CreateSession.
	LastActive time.Time
	// LastRunBy is who started the session's latest run (Run.By), ""
	// when it has none or it was not recorded. Filled by List only.
	LastRunBy string
	// Epoch and LastSeq are the event cursor persisted by the host.
	Epoch   string
	LastSeq uint64
	// AgentState is what the session's agent keeps across lives (JSON;
	// empty for agents that keep nothing).
	AgentState string
}

// Open opens (creating it if needed) the database file at path, typically
// filepath.Join(stateDir, "state.db"), and migrates it to the newest schema.
// The directory must exist.
func Open(ctx context.Context, path string) (*Store, error) {
	if err := makeFiles(path); err != nil {
		return nil, err
	}
	db, err := openDB(path)
	if err != nil {
		return nil, err
	}
	st := &Store{db: db}
	if err := st.QuickCheck(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("%s is damaged (restore it from a backup, or move it aside to start with no history): %w", path, err)
	}
	if err := migrateTo(ctx, db, latestVersion); err != nil {
		if code := sqliteCode(err) & 0xff; code == sqlite3.SQLITE_CORRUPT || code == sqlite3.SQLITE_NOTADB {
			_ = db.Close()
			return nil, fmt.Errorf("%s is damaged (restore it from a backup, or move it aside to start with no history): %v: %w", path, err, ErrDamaged)
		}
		_ = db.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if st.rdb, err = openReaders(path); err != nil {
		_ = db.Close()
		return nil, err
	}
	st.startWriter()
	return st, nil
}

// readers is how many connections read at once beside the writer's.
const readers = 4

// openReaders opens the pool of read-only connections: in WAL mode a
// read does not wait for a write in progress (a commit of a huge answer,
// say), it reads the last committed state. Transactions there are
// deferred (they take no write lock), and query_only refuses a write.
func openReaders(path string) (*sql.DB, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	dsn := fmt.Sprintf("file:%s?_txlock=deferred&_pragma=busy_timeout(%d)&_pragma=foreign_keys(1)&_pragma=query_only(1)",
		escapePath(abs), busyTimeout.Milliseconds())
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s for reading: %w", path, err)
	}
	db.SetMaxOpenConns(readers)
	db.SetMaxIdleConns(readers)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	if err := db.Ping(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open %s for reading: %w", path, err)
	}
	return db, nil
}

// Check opens the database at path read-only, with no change to it or its
// schema, and runs quick_check: an error wrapping ErrDamaged when the file
// is damaged. A running host may hold it open meanwhile.
func Check(ctx context.Context, path string) error {
	if err := checkFiles(path); err != nil {
		return err
	}
	db, err := openDBMode(path, "ro")
	if err != nil {
		return err
	}
	defer db.Close()
	return (&Store{db: db}).QuickCheck(ctx)
}

// makeFiles makes the database file at path when it is missing, mode
// 0600 and never through a symbolic link (SQLite gives its -wal and -shm
// the mode of the database file, so they are 0600 too), and refuses a
// link at any of the files SQLite will open (checkFiles).
func makeFiles(path string) error {
	f, err := statedir.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	return checkFiles(path)
}

// checkFiles refuses the database when its file, or a -wal, -shm or
// -journal file beside it, is a symbolic link, another user's, or
// writable by others: SQLite opens them by name and would follow a link
// (the driver cannot ask for SQLITE_OPEN_NOFOLLOW).
func checkFiles(path string) error {
	for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
		if err := statedir.CheckFile(path + suffix); err != nil {
			return fmt.Errorf("open %s: %w", path, err)
		}
	}
	return nil
}

// openDB opens the database file at path with the connection settings every
// Store uses, without touching its schema.
func openDB(path string) (*sql.DB, error) { return openDBMode(path, "") }

// openDBMode is openDB with a SQLite open mode ("ro", or "" for
// read-write-create).
func openDBMode(path, mode string) (*sql.DB, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// A file: URI with the path escaped, so that no character of the path
	// ('?', '#', '%') is taken for URI syntax. _txlock=immediate makes every
	// transaction take the write lock at BEGIN, so a transaction that reads
	// before it writes never fails to upgrade its lock.
	// The WAL is checkpointed and cut back every walCheckpointPages.
	dsn := fmt.Sprintf("file:%s?_txlock=immediate&_pragma=busy_timeout(%d)&_pragma=foreign_keys(1)&_pragma=journal_mode(WAL)"+
		"&_pragma=wal_autocheckpoint(%d)&_pragma=journal_size_limit(%d)",
		escapePath(abs), busyTimeout.Milliseconds(), walCheckpointPages, walSizeLimit)
	if mode != "" {
		dsn = fmt.Sprintf("file:%s?mode=%s&_pragma=busy_timeout(%d)", escapePath(abs), mode, busyTimeout.Milliseconds())
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// One connection: SQLite allows one writer at a time anyway, and with a
	// single connection concurrent callers queue in database/sql instead of
	// failing with SQLITE_BUSY.
	db.SetMaxOpenConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	if err := db.Ping(); err != nil {
		_ = db.Close()
		if code := sqliteCode(err) & 0xff; code == sqlite3.SQLITE_CORRUPT || code == sqlite3.SQLITE_NOTADB {
			return nil, fmt.Errorf("%s is damaged (restore it from a backup, or move it aside to start with no history): %v: %w", path, err, ErrDamaged)
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return db, nil
}

// escapePath percent-encodes the bytes of p that a SQLite file: URI would
// otherwise interpret.
func escapePath(p string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c <= ' ' || c >= 0x7f || c == '%' || c == '?' || c == '#' {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&0xf])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// Close closes the database. It is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.stopWriter() // what is queued is committed first
		var rerr error
		if s.rdb != nil {
			rerr = s.rdb.Close()
		}
		if err := errors.Join(s.db.Close(), rerr); err != nil {
			s.closeErr = fmt.Errorf("close: %w", err)
		}
	})
	return s.closeErr
}

// NewKey returns a stored key "YYYYMMDD_HHMMSS_xxxxxx": the UTC time of now
// followed by 6 random lower-case hex characters from crypto/rand.
func NewKey(now time.Time) string {
	return now.UTC().Format("20060102_150405") + "_" + contract.RandomHex(3)
}

// ValidKey reports whether k has the shape of a stored key,
// "YYYYMMDD_HHMMSS_xxxxxx" with decimal digits and lower-case hex.
func ValidKey(k string) bool {
	if len(k) != len("20060102_150405_abcdef") {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case i == 8 || i == 15:
			if c != '_' {
				return false
			}
		case i < 15:
			if c < '0' || c > '9' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// CreateSession stores a new session. sess.Key must be non-empty and not yet
// stored (ErrExists otherwise); sess.Parent, when set, must be a stored
// session. MessageCount is ignored.
func (s *Store) CreateSession(ctx context.Context, sess Session) error {
	return s.write(func() error {
		return s.group(ctx, "create session "+sess.Key, func(ctx context.Context, tx *sql.Tx) error { return createSessionTx(ctx, tx, sess) })
	})
}

func createSessionTx(ctx context.Context, tx *sql.Tx, sess Session) error {
	if sess.Key == "" {
		return fmt.Errorf("create session: empty key: %w", ErrInvalid)
	}
	if sess.ForkCount < 0 {
		return fmt.Errorf("create session %s: negative fork count %d: %w", sess.Key, sess.ForkCount, ErrInvalid)
	}
	var parent any
	if sess.Parent != "" {
		parent = sess.Parent
	}
	var ended any
	if !sess.EndedAt.IsZero() {
		ended = sess.EndedAt.Unix()
	}
	_, err := tx.ExecContext(ctx,
		`INSERT INTO sessions (key, title, parent, fork_count, started_at, ended_at, end_reason, epoch, last_seq, agent_state)
		 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sess.Key, sess.Title, parent, sess.ForkCount, unixOf(sess.StartedAt), ended, sess.EndReason,
		sess.Epoch, int64(sess.LastSeq), sess.AgentState)
	switch code := sqliteCode(err); {
	case err == nil:
		return nil
	case code == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return fmt.Errorf("create session %s: %w", sess.Key, ErrExists)
	case code == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
		return fmt.Errorf("create session %s: parent %s: %w", sess.Key, sess.Parent, ErrNotFound)
	default:
		return fmt.Errorf("create session %s: %w", sess.Key, err)
	}
}

// sqliteCode returns the extended SQLite result code of err, or 0.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code()
	}
	return 0
}

// sessionColumns is the select list scanSession reads.
const sessionColumns = `key, title, COALESCE(parent, ''), fork_count, started_at, ended_at, end_reason, epoch, last_seq,
	(SELECT COUNT(*) FROM messages m WHERE m.session_key = sessions.key), agent_state`

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

// prefixScanner scans columns selected before sessionColumns into dest,
// then the rest as sc would.
type prefixScanner struct {
	sc   scanner
	dest []any
}

func (p prefixScanner) Scan(dest ...any) error {
	return p.sc.Scan(append(p.dest, dest...)...)
}

// lastActive is the latest of times, the zero time when all are zero.
func lastActive(times ...time.Time) time.Time {
	var last time.Time
	for _, t := range times {
		if t.After(last) {
			last = t
		}
	}
	return last
}

// scanSession reads one row selected with sessionColumns.
func scanSession(sc scanner) (Session, error) {
	var (
		sess    Session
		started int64
		ended   sql.NullInt64
		lastSeq int64
	)
	if err := sc.Scan(&sess.Key, &sess.Title, &sess.Parent, &sess.ForkCount, &started, &ended,
		&sess.EndReason, &sess.Epoch, &lastSeq, &sess.MessageCount, &sess.AgentState); err != nil {
		return Session{}, err
	}
	sess.StartedAt = timeOf(started)
	if ended.Valid {
		sess.EndedAt = timeOf(ended.Int64)
	}
	sess.LastSeq = uint64(lastSeq)
	return sess, nil
}

// unixOf converts t to Unix seconds; the zero time is 0.
func unixOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}

// timeOf converts Unix seconds to a UTC time; 0 is the zero time.
func timeOf(sec int64) time.Time {
	if sec == 0 {
		return time.Time{}
	}
	return time.Unix(sec, 0).UTC()
}

// GetSession returns the stored session with that key, with MessageCount
// filled, or an error wrapping ErrNotFound.
func (s *Store) GetSession(ctx context.Context, key string) (Session, error) {
	sess, err := scanSession(s.reader().QueryRowContext(ctx,
		`SELECT `+sessionColumns+` FROM sessions WHERE key = ?`, key))
	if errors.Is(err, sql.ErrNoRows) {
		return Session{}, fmt.Errorf("get session %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return Session{}, fmt.Errorf("get session %s: %w", key, err)
	}
	return sess, nil
}

// FindByTitle returns the newest stored session (by StartedAt, then key)
// whose title is exactly title, or an error wrapping ErrNotFound. An empty
// title matches nothing.
func (s *Store) FindByTitle(ctx context.Context, title string) (Session, error) {
	if title == "" {
		return Session{}, fmt.Errorf("find by title: empty title: %w", ErrNotFound)
	}
	sess, err := scanSession(s.reader().QueryRowContext(ctx,
		`SELECT `+sessionColumns+` FROM sessions WHERE title = ?
		 ORDER BY started_at DESC, key DESC LIMIT 1`, title))
	if errors.Is(err, sql.ErrNoRows) {
		return Session{}, fmt.Errorf("find by title %q: %w", title, ErrNotFound)
	}
	if err != nil {
		return Session{}, fmt.Errorf("find by title %q: %w", title, err)
	}
	return sess, nil
}

// lastRunColumn selects the latest start or end time of a session's runs
// (NULL when it has none), for Session.LastActive.
const lastRunColumn = `(SELECT MAX(MAX(r.started_at, COALESCE(r.ended_at, 0))) FROM runs r WHERE r.session_key = sessions.key)`

// lastRunByColumn selects who started a session's latest run (NULL when
// it has none), for Session.LastRunBy; the runs_by_start index serves it.
const lastRunByColumn = `(SELECT r.started_by FROM runs r WHERE r.session_key = sessions.key ORDER BY r.started_at DESC, r.start_seq DESC LIMIT 1)`

// List returns stored sessions newest first (by StartedAt, then key), at
// most limit of them (limit <= 0 means 100), with MessageCount and
// LastActive filled.
func (s *Store) List(ctx context.Context, limit int) ([]Session, error) {
	if limit <= 0 {
		limit = defaultListLimit
	}
	rows, err := s.reader().QueryContext(ctx,
		`SELECT `+lastRunColumn+`, `+lastRunByColumn+`, `+sessionColumns+` FROM sessions ORDER BY started_at DESC, key DESC LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	defer rows.Close()
	out := []Session{}
	for rows.Next() {
		var lastRun sql.NullInt64
		var lastBy sql.NullString
		sess, err := scanSession(prefixScanner{rows, []any{&lastRun, &lastBy}})
		if err != nil {
			return nil, fmt.Errorf("list sessions: %w", err)
		}
		sess.LastActive = lastActive(sess.StartedAt, sess.EndedAt, timeOf(lastRun.Int64))
		sess.LastRunBy = lastBy.String
		out = append(out, sess)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	return out, nil
}

// reader is the pool reads go to.
func (s *Store) reader() *sql.DB {
	if s.rdb != nil {
		return s.rdb
	}
	return s.db
}

// readTx runs f in a read transaction that is always rolled back, so that
// its reads see one consistent state; it takes no write lock and waits
// for no write.
func (s *Store) readTx(ctx context.Context, f func(tx *sql.Tx) error) error {
	tx, err := s.reader().BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	return f(tx)
}

// End records the end of a session at time at with reason. The first reason
// recorded wins: if the session already has an end reason, End does nothing
// and returns nil. It returns an error wrapping ErrNotFound when key is not
// stored, and ErrInvalid for an empty reason.
func (s *Store) End(ctx context.Context, key, reason string, at time.Time) error {
	return s.write(func() error {
		return s.group(ctx, "end session "+key, func(ctx context.Context, tx *sql.Tx) error { return endTx(ctx, tx, key, reason, at) })
	})
}

func endTx(ctx context.Context, tx *sql.Tx, key, reason string, at time.Time) error {
	if reason == "" {
		return fmt.Errorf("end session %s: empty reason: %w", key, ErrInvalid)
	}
	res, err := tx.ExecContext(ctx,
		`UPDATE sessions SET ended_at = ?, end_reason = ? WHERE key = ? AND end_reason = ''`,
		unixOf(at), reason, key)
	return checkUpdateIn(ctx, tx, "end session", key, res, err)
}

// Reopen clears the end time and end reason of a stored session that becomes
// live again. It returns an error wrapping ErrNotFound when key is not
// stored.
func (s *Store) Reopen(ctx context.Context, key string) error {
	return s.write(func() error {
		return s.group(ctx, "reopen session "+key, func(ctx context.Context, tx *sql.Tx) error { return reopenTx(ctx, tx, key) })
	})
}

func reopenTx(ctx context.Context, tx *sql.Tx, key string) error {
	res, err := tx.ExecContext(ctx,
		`UPDATE sessions SET ended_at = NULL, end_reason = '' WHERE key = ?`, key)
	return checkUpdateIn(ctx, tx, "reopen session", key, res, err)
}

// SetCursor persists the session's event cursor. It returns an error
// wrapping ErrNotFound when key is not stored.
func (s *Store) SetCursor(ctx context.Context, key, epoch string, lastSeq uint64) error {
	return s.write(func() error {
		return s.group(ctx, "set cursor of "+key, func(ctx context.Context, tx *sql.Tx) error { return setCursorTx(ctx, tx, key, epoch, lastSeq) })
	})
}

func setCursorTx(ctx context.Context, tx *sql.Tx, key, epoch string, lastSeq uint64) error {
	res, err := tx.ExecContext(ctx,
		`UPDATE sessions SET epoch = ?, last_seq = ? WHERE key = ?`, epoch, int64(lastSeq), key)
	return checkUpdateIn(ctx, tx, "set cursor of", key, res, err)
}

// SetAgentState stores what the session's agent keeps across lives. It
// returns an error wrapping ErrNotFound when key is not stored.
func (s *Store) SetAgentState(ctx context.Context, key, state string) error {
	return s.write(func() error {
		return s.group(ctx, "set agent state of "+key, func(ctx context.Context, tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, `UPDATE sessions SET agent_state = ? WHERE key = ?`, state, key)
			return checkUpdateIn(ctx, tx, "set agent state of", key, res, err)
		})
	})
}

// SetTitle sets the session's title. It returns an error wrapping
// ErrNotFound when key is not stored.
func (s *Store) SetTitle(ctx context.Context, key, title string) error {
	return s.write(func() error {
		return s.group(ctx, "set title of "+key, func(ctx context.Context, tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, `UPDATE sessions SET title = ? WHERE key = ?`, title, key)
			return checkUpdateIn(ctx, tx, "set title of", key, res, err)
		})
	})
}

// checkUpdateIn turns the outcome of an UPDATE … WHERE key = ? into an error:
// the statement's own error, or ErrNotFound when it touched no row and key
// is not stored. An UPDATE that touched no row of a stored session (End
// after an earlier End) is not an error.
// q says whether key is stored.
func checkUpdateIn(ctx context.Context, q queryer, op, key string, res sql.Result, err error) error {
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, key, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, key, err)
	}
	if n > 0 {
		return nil
	}
	if err := mustExist(ctx, q, key); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}
