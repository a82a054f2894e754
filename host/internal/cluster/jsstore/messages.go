package jsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/cluster/bus"
	"github.com/tether-agent/tether/host/store"
)

// AppendMessages is store.Store.AppendMessages: all of msgs are one
// message on the session's subject (so they are stored together or not
// at all, and stay adjacent), published only if the subject's last
// message is the one this store read.
func (s *Store) AppendMessages(ctx context.Context, key string, msgs ...agent.Message) error {
	return s.write(func() error {
		if _, _, err := s.getRow(ctx, key); err != nil {
			return fmt.Errorf("append messages: %w", err)
		}
		return s.appendMessages(ctx, key, msgs, 0)
	})
}

// storedRow is one display row as a messages message holds it.
type storedRow struct {
	Role    string          `json:"role"`
	Text    string          `json:"text"`
	Content json.RawMessage `json:"content,omitempty"`
}

// appendMessages appends msgs to key's display rows as one message. A
// Commit gives batch, the lowest seq of the session's events it holds
// (0: none, and for other writers): when the session's last messages
// message was written by a Commit with the same batch, that Commit
// failed after storing it, and this is the table's journal trying it
// again with the same queued entries first (and perhaps more behind):
// the rows it stored are the first of msgs, and are not stored twice.
func (s *Store) appendMessages(ctx context.Context, key string, msgs []agent.Message, batch uint64) error {
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
			rows[i] = storedRow{Role: string(m.Role), Text: m.Text, Content: m.Content}
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
		err = bus.RetryBusy(ctx, &s.retries, func() error {
			_, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(top))
			return err
		})
		if bus.WrongLastSequence(err) && !bus.Busy(err) {
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
func (s *Store) messageCount(ctx context.Context, key string) (rowCount, error) {
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
func (s *Store) ownMessages(ctx context.Context, key string, limit int) ([]agent.Message, error) {
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
			out = append(out, agent.Message{Role: agent.Role(r.Role), Text: r.Text, Content: r.Content})
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
func (s *Store) Messages(ctx context.Context, key string) ([]agent.Message, error) {
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
func (s *Store) lineage(ctx context.Context, key string) ([]store.Generation, error) {
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
func (s *Store) DisplayMessages(ctx context.Context, key string) ([]agent.Message, error) {
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
func (s *Store) DisplayCount(ctx context.Context, key string) (int, error) {
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
