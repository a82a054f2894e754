package session

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/ownership"
)

// Run statuses (session.runs, message.complete).
const (
	statusRunning     = "running"
	statusComplete    = "complete"
	statusInterrupted = "interrupted"
	statusFailed      = "failed"
)

// Viewer is a client connection that watches sessions: the table sends it
// event frames. Send must never block.
type Viewer interface {
	// ID is the viewer's transport identity.
	ID() contract.TransportID
	// Transport is the name of the transport it is on ("ws", …).
	Transport() string
	// Send queues one encoded frame for the client.
	Send(frame []byte)
	// Released tells the viewer that s was released while it was bound
	// to it (closed, reaped, evicted, shut down): the viewer should forget
	// its binding. It is called once per binding, with no lock held.
	Released(s *Session)
}

// Binding is what a bind gave a viewer: the session and the binding
// generation the bind made. A viewer that leaves presents it to Detach;
// the funnel compares it with the session's binding then.
type Binding struct {
	s   *Session
	gen uint64
}

// Session returns the bound session.
func (b Binding) Session() *Session { return b.s }

// Session is one live session. Its fields are the table's: other
// packages use its methods.
type Session struct {
	// Constant after construction.
	t                 *Table
	id                string
	key               string
	agent             agent.Agent
	closeOnDisconnect bool
	startedAt         time.Time
	log               zerolog.Logger
	released          chan struct{} // closed when a teardown has persisted it
	// endErr is why the teardown could not store the session's end;
	// written by finish before released is closed, read after.
	endErr  error
	ringCap int
	// turns: the agent reports protocol updates (agent.Turner): its text
	// comes as acp.update events as well as message.delta.
	turns bool

	// op is held by the one bind or teardown of this session in progress:
	// they change the binding and record it in the ownership store outside
	// every lock, one at a time.
	op chan struct{}

	// rev is the ownership store's revision of this session's entry;
	// guarded by op.
	rev uint64

	mu sync.Mutex // guards the fields below
	// Binding state: changed only by the holder of op.
	gen         uint64
	viewers     map[contract.TransportID]Viewer
	parkTimer   *time.Timer // non-nil while parked
	reapPending bool        // the reap timer fired while a run streamed
	closing     bool
	submitting  bool // a prompt's turn is being stored: the session is busy
	// Session state.
	title      string
	messages   []agent.Message // display rows: lineage + own, completed turns
	run        *run            // the run in flight, or nil
	runs       []RunInfo
	seq        uint64
	committed  uint64       // the highest seq the journal has committed (events up to it are all stored)
	ring       []eventFrame // events with seq in [ringStart, seq]
	ringStart  uint64
	epoch      string
	lastActive time.Time
	// Permission requests of the run in flight still open, by id, and
	// the ids answered lately (a late answer gets ErrAlreadyResolved).
	perms    map[string]*permission
	resolved []string
	// The agent's state as last stored, and whether it could not carry
	// the session's earlier context over (a new agent session).
	agentState string
	agentReset bool
}

// ID is the session's runtime id.
func (s *Session) ID() string { return s.id }

// Key is the session's stored key.
func (s *Session) Key() string { return s.key }

// Turns reports whether the session's agent reports protocol updates
// (acp.update events carry its answer as well as message.delta).
func (s *Session) Turns() bool { return s.turns }

// acquire takes the session's bind/teardown slot, or gives up with ctx.
func (s *Session) acquire(ctx context.Context) error {
	select {
	case s.op <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// release gives the slot back.
func (s *Session) releaseOp() { <-s.op }

// ownerLocked is the ownership entry of the session's binding now. Its
// viewers are in no particular order: every bind builds one, and sorting
// them made a storm of n binds cost n² log n (a fifth of the host's CPU
// in a 256-socket resume storm).
func (s *Session) ownerLocked() ownership.Owner {
	o := ownership.Owner{Host: s.t.host, Instance: s.t.instance, SessionID: s.id, Gen: s.gen, Viewers: make([]contract.TransportID, 0, len(s.viewers)+1)}
	for id := range s.viewers {
		o.Viewers = append(o.Viewers, id)
	}
	return o
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
	stoppedBy   string // who interrupted it (InterruptBy)
	startSeq    uint64 // seq of its message.start
}

// RunInfo is one row of session.runs.
type RunInfo struct {
	RunID     string `json:"run_id"`
	Status    string `json:"status"`
	StartedAt int64  `json:"started_at"`
	EndedAt   *int64 `json:"ended_at"`
	// By names who submitted its prompt (a credential's name); "" for
	// runs stored before it was recorded.
	By string `json:"by,omitempty"`
}

// eventFrame is one sent event: its seq and encoded params.
type eventFrame struct {
	seq    uint64
	params json.RawMessage
}

// Snapshot is the result of session.create, resume, activate and branch.
type Snapshot struct {
	SessionID    string          `json:"session_id"`
	SessionKey   string          `json:"session_key"`
	Resumed      string          `json:"resumed,omitempty"`
	Title        string          `json:"title"`
	MessageCount int             `json:"message_count"`
	Messages     []agent.Message `json:"messages"`
	Status       string          `json:"status"`
	Running      bool            `json:"running"`
	StartedAt    int64           `json:"started_at"`
	LatestSeq    uint64          `json:"latest_seq"`
	Epoch        string          `json:"epoch"`
	// PendingPermissions are the agent's permission requests still open.
	PendingPermissions []PermissionInfo `json:"pending_permissions,omitempty"`
	// AgentContext is "reset" when the agent could not carry the
	// session's earlier context over.
	AgentContext string `json:"agent_context,omitempty"`
}

// statusLocked is "working" while a run is in flight, or while a
// prompt's turn is being stored (its run starts next), else "idle".
func (s *Session) statusLocked() string {
	if s.run != nil || s.submitting {
		return "working"
	}
	return "idle"
}

// inflightRowsLocked is the number of display rows the run in flight adds
// beyond the completed ones: its partial answer.
func (s *Session) inflightRowsLocked() int {
	if s.run == nil {
		return 0
	}
	return 1
}

// snapshotLocked copies the whole display history, the turn in flight
// included as far as it has streamed.
func (s *Session) snapshotLocked() Snapshot {
	msgs := make([]agent.Message, len(s.messages), len(s.messages)+1)
	copy(msgs, s.messages)
	if s.run != nil {
		msgs = append(msgs, agent.Message{Role: agent.RoleAssistant, Text: s.run.text.String()})
	}
	return Snapshot{
		SessionID:    s.id,
		SessionKey:   s.key,
		Title:        s.title,
		MessageCount: len(msgs),
		Messages:     msgs,
		Status:       s.statusLocked(),
		Running:      s.run != nil || s.submitting,
		StartedAt:    s.startedAt.Unix(),
		LatestSeq:    s.seq,
		Epoch:        s.epoch,

		PendingPermissions: s.pendingLocked(),
		AgentContext:       map[bool]string{true: "reset"}[s.agentReset],
	}
}

// ForkPoint is where a branch of the session starts: its stored key, the
// number of display rows of the last completed turn (a turn in flight is
// not part of the prefix: its rows are not all stored yet) and its title.
func (s *Session) ForkPoint() (key string, rows int, title string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.key, len(s.messages), s.title
}

// eventParams is the params object of a server event.
type eventParams struct {
	Type      string `json:"type"`
	SessionID string `json:"session_id"`
	Seq       uint64 `json:"seq"`
	Payload   any    `json:"payload"`
}

// emitLocked assigns the next seq to an event, keeps it in the ring and
// queues it to every viewer. s.mu is held, so events reach each viewer
// in seq order and never interleave with a snapshot.
func (s *Session) emitLocked(typ string, payload any) { s.emitOpsLocked(typ, payload, ops{}) }

// emitOpsLocked is emitLocked with rows to store in the same
// transaction as the event (before any client is sent it).
func (s *Session) emitOpsLocked(typ string, payload any, o ops) {
	s.seq++
	params, err := json.Marshal(eventParams{Type: typ, SessionID: s.id, Seq: s.seq, Payload: payload})
	if err != nil {
		panic(fmt.Sprintf("session: encoding event: %v", err))
	}
	s.ring = append(s.ring, eventFrame{seq: s.seq, params: params})
	if len(s.ring) > s.ringCap {
		// Slide the window: the dropped frames are let go now, the
		// array when append next grows it (copying ringCap frames once
		// per ringCap events, not on every event).
		drop := len(s.ring) - s.ringCap
		clear(s.ring[:drop])
		s.ring = s.ring[drop:]
	}
	s.ringStart = s.ring[0].seq
	frame := encodeNotification(params)
	viewers := make([]Viewer, 0, len(s.viewers))
	for _, v := range s.viewers {
		viewers = append(viewers, v)
	}
	// Delivered by the journal once committed: durable before sent.
	s.t.journal.add(s, s.seq, params, frame, viewers, o)
}

// setCommitted records that the journal committed every event of s up to
// seq.
func (s *Session) setCommitted(seq uint64) {
	s.mu.Lock()
	if seq > s.committed {
		s.committed = seq
	}
	s.mu.Unlock()
}

// sendLocked returns how a bind's answer goes to v: at once when every
// event of s is committed, else behind those events in the journal, so
// that no client sees a snapshot (or its latest_seq) before the events it
// reflects are stored.
func (s *Session) sendLocked(v Viewer) func(frame []byte) {
	if s.committed >= s.seq {
		return v.Send
	}
	return func(frame []byte) { s.t.journal.addFrame(v, frame) }
}

// encodeNotification wraps event params in the JSON-RPC envelope.
func encodeNotification(params json.RawMessage) []byte {
	b := make([]byte, 0, len(params)+48)
	b = append(b, `{"jsonrpc":"2.0","method":"event","params":`...)
	b = append(b, params...)
	return append(b, '}')
}

// EventsResult is the result of session.events.since. Truncated is true
// when events after last_seen are gone (pruned, or lost with an earlier
// host) or last_seen is ahead of latest_seq. The fields are in the order
// clients have always seen them.
type EventsResult struct {
	Epoch     string            `json:"epoch"`
	Events    []json.RawMessage `json:"events"`
	LatestSeq uint64            `json:"latest_seq"`
	Truncated bool              `json:"truncated"`
}

// EventsSinceLive answers session.events.since from the in-memory ring
// when that reaches back far enough (ok); otherwise the journal holds some
// of the events: call EventsSince.
func (s *Session) EventsSinceLive(lastSeen uint64) (EventsResult, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eventsSinceLocked(lastSeen)
}

// eventsSinceLocked answers from the ring, up to the committed seq: an
// event the journal has not stored yet is not shown.
func (s *Session) eventsSinceLocked(lastSeen uint64) (EventsResult, bool) {
	latest := s.committed
	res := EventsResult{Epoch: s.epoch, Events: []json.RawMessage{}, LatestSeq: latest}
	if lastSeen > latest {
		res.Truncated = true
		return res, true
	}
	if lastSeen+1 < s.ringStart {
		return res, false
	}
	for _, e := range s.ring {
		if e.seq > lastSeen && e.seq <= latest {
			res.Events = append(res.Events, e.params)
		}
	}
	return res, true
}

// journalPage is how many journaled events one read of the store takes.
var journalPage = 10000

// EventsSince answers session.events.since: from the in-memory ring when
// it reaches back far enough, else from the journal (plus what the ring
// has past the journal).
func (s *Session) EventsSince(ctx context.Context, lastSeen uint64) (EventsResult, error) {
	s.mu.Lock()
	r, ok := s.eventsSinceLocked(lastSeen)
	if ok {
		s.mu.Unlock()
		return r, nil
	}
	ring := append([]eventFrame(nil), s.ring...)
	s.mu.Unlock()
	latest := r.LatestSeq

	// The journal in pages, up to where the ring takes over (or latest).
	next := lastSeen + 1
	ringFrom := latest + 1
	if len(ring) > 0 {
		ringFrom = ring[0].seq
	}
	for page := 0; ; page++ {
		stored, first, _, err := s.t.store.EventsSince(ctx, s.key, next-1, journalPage)
		if err != nil {
			return EventsResult{}, fmt.Errorf("events of %s since %d: %w", s.key, lastSeen, err)
		}
		if page == 0 && (first == 0 || first > next) {
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
		if len(stored) < journalPage || next >= ringFrom || next > latest {
			break
		}
	}
	// The ring's copy runs past latest when events are still waiting for
	// their commit: those are not shown, as in eventsSinceLocked.
	for _, e := range ring {
		if e.seq >= next && e.seq <= latest {
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
