package session

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

// recover reads a stored session's event cursor from its journal and
// finishes the runs a previous host left running (killed mid-run): each is
// recorded interrupted, with the answer its journaled deltas streamed,
// stored and journaled like any interrupted run. The epoch stays as stored
// while the journal is intact; it changes only when events the session had
// sent are missing from the journal (an older database, or a lost file).
func (t *Table) recover(ctx context.Context, sess store.Session, id string) (seq uint64, epoch string, runs []RunInfo, err error) {
	_, first, last, err := t.store.EventsSince(ctx, sess.Key, 1<<62, 1)
	if err != nil {
		return 0, "", nil, err
	}
	seq, epoch = max(sess.LastSeq, last), sess.Epoch
	if epoch == "" || last < sess.LastSeq || (sess.LastSeq > 0 && first == 0) {
		epoch = contract.RandomHex(8)
	}
	stored, err := t.store.Runs(ctx, sess.Key)
	if err != nil {
		return 0, "", nil, err
	}
	for _, r := range stored {
		if r.Status == statusRunning {
			text, err := t.streamedText(ctx, sess.Key, r.StartSeq)
			if err != nil {
				return 0, "", nil, err
			}
			now := t.now()
			if err := t.store.AppendMessages(ctx, sess.Key, agent.Message{Role: agent.RoleAssistant, Text: text}); err != nil {
				return 0, "", nil, err
			}
			seq++
			params, _ := json.Marshal(eventParams{Type: wire.EventMessageComplete, SessionID: id, Seq: seq, Payload: map[string]string{"text": text, "status": statusInterrupted}})
			if err := t.store.AppendEvents(ctx, []store.Event{{Key: sess.Key, Seq: seq, Params: params}}, t.journal.keep); err != nil {
				return 0, "", nil, err
			}
			if err := t.store.EndRun(ctx, sess.Key, r.ID, statusInterrupted, now); err != nil {
				return 0, "", nil, err
			}
			r.Status, r.EndedAt = statusInterrupted, now
		}
		info := RunInfo{RunID: r.ID, Status: r.Status, StartedAt: r.StartedAt.Unix(), By: r.By}
		if !r.EndedAt.IsZero() {
			at := r.EndedAt.Unix()
			info.EndedAt = &at
		}
		runs = append(runs, info)
	}
	if err := t.store.SetCursor(ctx, sess.Key, epoch, seq); err != nil {
		return 0, "", nil, err
	}
	return seq, epoch, runs, nil
}

// streamedText rebuilds what a run streamed from its journaled deltas.
func (t *Table) streamedText(ctx context.Context, key string, startSeq uint64) (string, error) {
	evs, _, _, err := t.store.EventsSince(ctx, key, startSeq, 0)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, e := range evs {
		var p struct {
			Type    string `json:"type"`
			Payload struct {
				Text string `json:"text"`
			} `json:"payload"`
		}
		if json.Unmarshal(e.Params, &p) != nil {
			continue
		}
		if p.Type == wire.EventMessageComplete || p.Type == wire.EventMessageStart {
			break
		}
		if p.Type == wire.EventMessageDelta {
			b.WriteString(p.Payload.Text)
		}
	}
	return b.String(), nil
}
