package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/store"
)

// Run statuses (SPEC §4).
const (
	statusRunning     = "running"
	statusComplete    = "complete"
	statusInterrupted = "interrupted"
	statusFailed      = "failed"
)

// record is one live session.
type record struct {
	// Constant after construction.
	id                string
	key               string
	agent             contract.Agent
	closeOnDisconnect bool
	startedAt         time.Time
	log               zerolog.Logger
	released          chan struct{} // closed when a teardown has persisted it
	ringCap           int
	journal           *journal

	// rev is the ledger revision of this record's ownership entry; it is
	// guarded by the table's mu.
	rev uint64

	mu sync.Mutex // guards the fields below
	// Binding state, changed only with the table's mu held too.
	gen         uint64
	viewers     map[contract.TransportID]Viewer
	parkTimer   *time.Timer // non-nil while parked
	reapPending bool        // the reap timer fired while a run streamed
	closing     bool
	// Session state.
	title      string
	messages   []contract.Message // display rows: lineage + own, completed turns
	run        *run               // the run in flight, or nil
	runs       []runInfo
	seq        uint64
	ring       []eventFrame // events with seq in [ringStart, seq]
	ringStart  uint64
	epoch      string
	lastActive time.Time
}

// run is a prompt being answered.
type run struct {
	id          string
	started     time.Time
	cancel      context.CancelFunc
	done        chan struct{}
	text        strings.Builder
	progress    time.Time // last delta
	interrupted bool
	startSeq    uint64 // seq of its message.start
}

// runInfo is one row of session.runs.
type runInfo struct {
	RunID     string `json:"run_id"`
	Status    string `json:"status"`
	StartedAt int64  `json:"started_at"`
	EndedAt   *int64 `json:"ended_at"`
}

// eventFrame is one sent event: its seq and encoded params.
type eventFrame struct {
	seq    uint64
	params json.RawMessage
}

// Snapshot is the result of session.create, resume, activate and branch.
type Snapshot struct {
	SessionID    string             `json:"session_id"`
	SessionKey   string             `json:"session_key"`
	Resumed      string             `json:"resumed,omitempty"`
	Title        string             `json:"title"`
	MessageCount int                `json:"message_count"`
	Messages     []contract.Message `json:"messages"`
	Status       string             `json:"status"`
	Running      bool               `json:"running"`
	StartedAt    int64              `json:"started_at"`
	LatestSeq    uint64             `json:"latest_seq"`
	Epoch        string             `json:"epoch"`
}

func (r *record) statusLocked() string {
	if r.run != nil {
		return "working"
	}
	return "idle"
}

// inflightRowsLocked is the number of display rows the run in flight adds
// beyond the completed ones: its prompt and its partial answer.
func (r *record) inflightRowsLocked() int {
	if r.run == nil {
		return 0
	}
	return 1
}

// snapshotLocked copies the whole display history, the turn in flight
// included as far as it has streamed.
func (r *record) snapshotLocked() Snapshot {
	msgs := make([]contract.Message, len(r.messages), len(r.messages)+1)
	copy(msgs, r.messages)
	if r.run != nil {
		msgs = append(msgs, contract.Message{Role: contract.RoleAssistant, Text: r.run.text.String()})
	}
	return Snapshot{
		SessionID:    r.id,
		SessionKey:   r.key,
		Title:        r.title,
		MessageCount: len(msgs),
		Messages:     msgs,
		Status:       r.statusLocked(),
		Running:      r.run != nil,
		StartedAt:    r.startedAt.Unix(),
		LatestSeq:    r.seq,
		Epoch:        r.epoch,
	}
}

// eventParams is the params object of a server event.
type eventParams struct {
	Type      string `json:"type"`
	SessionID string `json:"session_id"`
	Seq       uint64 `json:"seq"`
	Payload   any    `json:"payload"`
}

// emitLocked assigns the next seq to an event, keeps it in the ring and
// queues it to every viewer. rec.mu is held, so events reach each viewer
// in seq order and never interleave with a snapshot.
func (r *record) emitLocked(typ string, payload any) {
	r.seq++
	params, err := json.Marshal(eventParams{Type: typ, SessionID: r.id, Seq: r.seq, Payload: payload})
	if err != nil {
		panic(fmt.Sprintf("host: encoding event: %v", err))
	}
	r.ring = append(r.ring, eventFrame{seq: r.seq, params: params})
	if len(r.ring) > r.ringCap {
		drop := len(r.ring) - r.ringCap
		r.ring = append(r.ring[:0:0], r.ring[drop:]...)
	}
	r.ringStart = r.ring[0].seq
	frame := encodeNotification(params)
	viewers := make([]Viewer, 0, len(r.viewers))
	for _, v := range r.viewers {
		viewers = append(viewers, v)
	}
	// Delivered by the journal once committed: durable before sent.
	r.journal.add(r.key, r.seq, params, frame, viewers)
}

// encodeNotification wraps event params in the JSON-RPC envelope.
func encodeNotification(params json.RawMessage) []byte {
	b := make([]byte, 0, len(params)+48)
	b = append(b, `{"jsonrpc":"2.0","method":"event","params":`...)
	b = append(b, params...)
	return append(b, '}')
}

// eventsResult is the result of session.events.since (SPEC §4).
// Truncated is true when events after last_seen are gone (pruned, or lost
// with an earlier host) or last_seen is ahead of latest_seq. The fields
// are in the order encoding/json gave the map it replaces.
type eventsResult struct {
	Epoch     string            `json:"epoch"`
	Events    []json.RawMessage `json:"events"`
	LatestSeq uint64            `json:"latest_seq"`
	Truncated bool              `json:"truncated"`
}

// eventsSinceLive answers session.events.since from the record's
// in-memory ring when that reaches back far enough (ok); otherwise the
// journal in the database holds some of the events: call eventsSince.
func (t *Table) eventsSinceLive(rec *record, lastSeen uint64) (eventsResult, bool) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.eventsSinceLocked(lastSeen)
}

func (r *record) eventsSinceLocked(lastSeen uint64) (eventsResult, bool) {
	res := eventsResult{Epoch: r.epoch, Events: []json.RawMessage{}, LatestSeq: r.seq}
	if lastSeen > r.seq {
		res.Truncated = true
		return res, true
	}
	if lastSeen+1 < r.ringStart {
		return res, false
	}
	for _, e := range r.ring {
		if e.seq > lastSeen {
			res.Events = append(res.Events, e.params)
		}
	}
	return res, true
}

// eventsSince answers session.events.since: from the in-memory ring when
// it reaches back far enough, else from the journal (plus what the ring
// has past the journal).
func (t *Table) eventsSince(ctx context.Context, rec *record, lastSeen uint64) (eventsResult, error) {
	rec.mu.Lock()
	r, ok := rec.eventsSinceLocked(lastSeen)
	if ok {
		rec.mu.Unlock()
		return r, nil
	}
	ring := append([]eventFrame(nil), rec.ring...)
	rec.mu.Unlock()
	latest := r.LatestSeq

	stored, first, _, err := t.store.EventsSince(ctx, rec.key, lastSeen, 0)
	if err != nil {
		return eventsResult{}, err
	}
	next := lastSeen + 1
	if first == 0 || first > next {
		r.Truncated = true
	}
	for _, e := range stored {
		if e.Seq > latest {
			break
		}
		if e.Seq != next {
			r.Truncated = true
		}
		r.Events = append(r.Events, e.Params)
		next = e.Seq + 1
	}
	for _, e := range ring {
		if e.seq >= next {
			if e.seq != next {
				r.Truncated = true
			}
			r.Events = append(r.Events, e.params)
			next = e.seq + 1
		}
	}
	if next <= latest {
		r.Truncated = true
	}
	return r, nil
}

// submit starts a run answering text. It returns the run id, or
// ErrSessionBusy while another run is in flight.
func (t *Table) submit(rec *record, text string) (string, error) {
	ctx := context.Background()
	rec.mu.Lock()
	if rec.closing {
		rec.mu.Unlock()
		return "", fmt.Errorf("%s: %w", rec.id, ErrUnknownSession)
	}
	if rec.run != nil {
		rec.mu.Unlock()
		return "", fmt.Errorf("%s: %w", rec.id, ErrSessionBusy)
	}
	runCtx, cancel := context.WithCancel(ctx)
	now := t.now()
	ru := &run{id: newEpoch(), started: now, cancel: cancel, done: make(chan struct{}), progress: now}
	history := make([]contract.Message, len(rec.messages))
	copy(history, rec.messages)
	rec.messages = append(rec.messages, contract.Message{Role: contract.RoleUser, Text: text})
	rec.run = ru
	rec.runs = append(rec.runs, runInfo{RunID: ru.id, Status: statusRunning, StartedAt: now.Unix()})
	rec.lastActive = now
	rec.emitLocked("message.start", map[string]string{"run_id": ru.id})
	ru.startSeq = rec.seq
	t.wg.Add(1)
	rec.mu.Unlock()

	go t.runAgent(runCtx, rec, ru, history, text)
	return ru.id, nil
}

// runAgent runs the agent for one prompt and records its end. A
// disconnect never cancels it: only interrupt, close, reap and shutdown do.
func (t *Table) runAgent(ctx context.Context, rec *record, ru *run, history []contract.Message, prompt string) {
	defer t.wg.Done()
	defer ru.cancel()
	persistCtx := context.WithoutCancel(ctx)
	if err := t.store.AppendMessages(persistCtx, rec.key, contract.Message{Role: contract.RoleUser, Text: prompt}); err != nil {
		rec.log.Error().Err(err).Msg("persisting prompt")
	}
	if err := t.store.StartRun(persistCtx, rec.key, store.Run{ID: ru.id, Status: statusRunning, StartedAt: ru.started, StartSeq: ru.startSeq}); err != nil {
		rec.log.Error().Err(err).Msg("persisting run")
	}
	err := rec.agent.Run(ctx, history, prompt, func(delta string) {
		if delta == "" {
			return
		}
		rec.mu.Lock()
		ru.text.WriteString(delta)
		ru.progress = t.now()
		rec.lastActive = ru.progress
		rec.emitLocked("message.delta", map[string]string{"text": delta})
		rec.mu.Unlock()
	})

	rec.mu.Lock()
	status := statusComplete
	switch {
	case ru.interrupted || errors.Is(err, context.Canceled):
		status = statusInterrupted
	case err != nil:
		status = statusFailed
	}
	answer := ru.text.String()
	rec.mu.Unlock()
	if err != nil && status == statusFailed {
		rec.log.Warn().Err(err).Str("run_id", ru.id).Msg("run failed")
	}
	// The answer is stored before the client is told the run ended.
	if err := t.store.AppendMessages(persistCtx, rec.key, contract.Message{Role: contract.RoleAssistant, Text: answer}); err != nil {
		rec.log.Error().Err(err).Msg("persisting answer")
	}
	if err := t.store.EndRun(persistCtx, rec.key, ru.id, status, t.now()); err != nil {
		rec.log.Error().Err(err).Msg("persisting run end")
	}

	rec.mu.Lock()
	ended := t.now().Unix()
	for i := range rec.runs {
		if rec.runs[i].RunID == ru.id {
			rec.runs[i].Status = status
			rec.runs[i].EndedAt = &ended
		}
	}
	rec.messages = append(rec.messages, contract.Message{Role: contract.RoleAssistant, Text: answer})
	rec.run = nil
	rec.lastActive = t.now()
	rec.emitLocked("message.complete", map[string]string{"text": answer, "status": status})
	gen := rec.gen
	idle := len(rec.viewers) == 0 && !rec.closing
	seq, epoch := rec.seq, rec.epoch
	rec.mu.Unlock()
	close(ru.done)

	if err := t.store.SetCursor(persistCtx, rec.key, epoch, seq); err != nil {
		rec.log.Error().Err(err).Msg("persisting event cursor")
	}
	if idle {
		t.release(releaseRef{rec: rec, gen: gen}, reasonSettled)
	}
}

// interrupt cancels the run in flight, reporting whether there was one.
func (rec *record) interrupt() bool {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.run == nil {
		return false
	}
	if !rec.run.interrupted {
		rec.run.interrupted = true
		rec.run.cancel()
	}
	return true
}

// runList copies session.runs.
func (rec *record) runList() []runInfo {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := make([]runInfo, len(rec.runs))
	copy(out, rec.runs)
	return out
}
