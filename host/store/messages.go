package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/tether-agent/tether/host/agent"
)

// AppendMessages appends msgs, in order, to the own rows of the session with
// that key, in one transaction (with other writes queued with it: see
// group.go): either all are stored or none. It returns an error wrapping
// ErrNotFound when there is no such session.
func (s *Store) AppendMessages(ctx context.Context, key string, msgs ...agent.Message) error {
	return s.write(func() error {
		return s.group(ctx, "append messages to "+key, func(ctx context.Context, tx *sql.Tx) error {
			return appendMessagesTx(ctx, tx, key, msgs...)
		})
	})
}

func appendMessagesTx(ctx context.Context, tx *sql.Tx, key string, msgs ...agent.Message) error {
	if err := mustExist(ctx, tx, key); err != nil {
		return fmt.Errorf("append messages: %w", err)
	}
	var next int64
	if err := tx.QueryRowContext(ctx,
		`SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE session_key = ?`, key).Scan(&next); err != nil {
		return fmt.Errorf("append messages to %s: %w", key, err)
	}
	for i, m := range msgs {
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO messages (session_key, seq, role, text, content) VALUES (?, ?, ?, ?, ?)`,
			key, next+int64(i), string(m.Role), m.Text, string(m.Content)); err != nil {
			return fmt.Errorf("append messages to %s: %w", key, err)
		}
	}
	return nil
}

// mustExist returns an error wrapping ErrNotFound unless a session with that
// key is stored.
func mustExist(ctx context.Context, q queryer, key string) error {
	var one int
	err := q.QueryRowContext(ctx, `SELECT 1 FROM sessions WHERE key = ?`, key).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("session %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("session %s: %w", key, err)
	}
	return nil
}

// Messages returns the session's own rows in order (not the parent's
// prefix), or an error wrapping ErrNotFound.
func (s *Store) Messages(ctx context.Context, key string) ([]agent.Message, error) {
	var out []agent.Message
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		if err := mustExist(ctx, tx, key); err != nil {
			return err
		}
		var err error
		out, err = ownMessages(ctx, tx, key, -1)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("messages: %w", err)
	}
	return out, nil
}

// ownMessages returns the first limit own rows of the session (all of them
// when limit < 0), never nil.
func ownMessages(ctx context.Context, q queryer, key string, limit int) ([]agent.Message, error) {
	rows, err := q.QueryContext(ctx,
		`SELECT role, text, content FROM messages WHERE session_key = ? ORDER BY seq LIMIT ?`, key, limit)
	if err != nil {
		return nil, fmt.Errorf("session %s: messages: %w", key, err)
	}
	defer rows.Close()
	out := []agent.Message{}
	for rows.Next() {
		var role, text, content string
		if err := rows.Scan(&role, &text, &content); err != nil {
			return nil, fmt.Errorf("session %s: messages: %w", key, err)
		}
		m := agent.Message{Role: agent.Role(role), Text: text}
		if content != "" {
			m.Content = json.RawMessage(content)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("session %s: messages: %w", key, err)
	}
	return out, nil
}

// Generation is one session of a stored session's lineage, as its display
// history sees it: its key, its fork count (how many of its parent's
// display rows it shows) and how many rows of its own it has.
type Generation struct {
	Key       string
	ForkCount int
	OwnCount  int
}

// DisplayPlan is the arithmetic of a display history, for any store: for
// a lineage chain (the session first, its root last) it returns how many
// display rows the session has and, per generation, how many of that
// generation's own rows (its first ones) the history shows. The history
// is those rows, root first.
func DisplayPlan(chain []Generation) (total int, own []int) {
	if len(chain) == 0 {
		return 0, nil
	}
	// displayOf[i]: the display row count of chain[i], its own rows plus as
	// much of its parent's display as its fork count keeps.
	displayOf := make([]int, len(chain))
	for i := len(chain) - 1; i >= 0; i-- {
		inherited := 0
		if i+1 < len(chain) {
			inherited = min(chain[i].ForkCount, displayOf[i+1])
		}
		displayOf[i] = inherited + chain[i].OwnCount
	}
	// want[i] is how many display rows of chain[i] are visible: no more
	// than its child needs, the child's fork count keeps, or it has.
	// Walking from the root down, each generation adds the own rows its
	// inherited part does not cover.
	want := make([]int, len(chain))
	want[0] = displayOf[0]
	for i := 1; i < len(chain); i++ {
		want[i] = min(want[i-1], chain[i-1].ForkCount, displayOf[i])
	}
	own = make([]int, len(chain))
	for i := range chain {
		inherited := 0
		if i+1 < len(chain) {
			inherited = want[i+1]
		}
		own[i] = max(want[i]-inherited, 0)
	}
	return displayOf[0], own
}

// lineage returns the chain of sessions from key up to its root ancestor,
// key first, with their fork and own-row counts. It returns an error
// wrapping ErrNotFound when key is not stored. A missing ancestor ends the
// chain (it contributes no rows), and so does a cycle.
func lineage(ctx context.Context, q queryer, key string) ([]Generation, error) {
	var chain []Generation
	seen := map[string]bool{}
	for cur := key; cur != "" && !seen[cur]; {
		seen[cur] = true
		var (
			l      = Generation{Key: cur}
			parent string
		)
		err := q.QueryRowContext(ctx,
			`SELECT COALESCE(parent, ''), fork_count,
			        (SELECT COUNT(*) FROM messages m WHERE m.session_key = sessions.key)
			 FROM sessions WHERE key = ?`, cur).Scan(&parent, &l.ForkCount, &l.OwnCount)
		if errors.Is(err, sql.ErrNoRows) {
			if len(chain) == 0 {
				return nil, fmt.Errorf("session %s: %w", key, ErrNotFound)
			}
			break
		}
		if err != nil {
			return nil, fmt.Errorf("session %s: lineage: %w", key, err)
		}
		chain = append(chain, l)
		cur = parent
	}
	return chain, nil
}

// DisplayMessages returns the session's display history: the parent's display
// rows (recursively: the parent's own display prefix too) cut to the first
// ForkCount rows, followed by the session's own rows. It returns an error
// wrapping ErrNotFound when key is not stored.
func (s *Store) DisplayMessages(ctx context.Context, key string) ([]agent.Message, error) {
	var out []agent.Message
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		chain, err := lineage(ctx, tx, key)
		if err != nil {
			return err
		}
		total, own := DisplayPlan(chain)
		out = make([]agent.Message, 0, total)
		for i := len(chain) - 1; i >= 0; i-- {
			if own[i] == 0 {
				continue
			}
			rows, err := ownMessages(ctx, tx, chain[i].Key, own[i])
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

// DisplayCount returns len(DisplayMessages(ctx, key)) without reading the
// rows; the host uses it as the ForkCount of a branch.
func (s *Store) DisplayCount(ctx context.Context, key string) (int, error) {
	var n int
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		chain, err := lineage(ctx, tx, key)
		if err != nil {
			return err
		}
		n, _ = DisplayPlan(chain)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("display count: %w", err)
	}
	return n, nil
}
