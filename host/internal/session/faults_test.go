package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/store"
)

// steppedAgent streams one delta each time step delivers one (and acks
// it once emitted) and ends its run when step is closed, or when
// interrupted.
type steppedAgent struct{ step chan stepMsg }

type stepMsg struct {
	text string
	ack  chan struct{}
}

func (a *steppedAgent) Run(ctx context.Context, _ []agent.Message, _ string, emit func(string)) error {
	for {
		select {
		case m, ok := <-a.step:
			if !ok {
				return nil
			}
			emit(m.text)
			close(m.ack)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// say makes the agent emit text and returns once it is queued.
func (ft *faultTable) say(text string) {
	ack := make(chan struct{})
	ft.agent.step <- stepMsg{text, ack}
	<-ack
}

// flush waits, at most d, for everything queued to be stored and
// delivered.
func (ft *faultTable) flush(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return ft.tbl.journal.flush(ctx)
}

func (a *steppedAgent) Close() error { return nil }

// errDiskFull is the error the fault hook injects.
var errDiskFull = errors.New("database or disk is full (injected)")

// faultTable is a table over a store whose writes the test can make fail.
type faultTable struct {
	tbl   *Table
	st    *store.Store
	path  string
	agent *steppedAgent
	m     *metrics.Metrics
}

// newFaultTable opens a faultTable on the database at path; each opt
// changes the table's config before the table is made.
func newFaultTable(t *testing.T, path string, opts ...func(*Config)) *faultTable {
	t.Helper()
	st, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	ft := &faultTable{st: st, path: path, agent: &steppedAgent{step: make(chan stepMsg)}, m: metrics.New()}
	cfg := Config{
		Store:   st,
		Agents:  agent.FactoryFunc(func(context.Context, string, json.RawMessage) (agent.Agent, error) { return ft.agent, nil }),
		Log:     zerolog.Nop(),
		Metrics: ft.m,
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	ft.tbl = NewTable(cfg)
	return ft
}

// open creates a session bound to v and returns it with its snapshot.
func (ft *faultTable) open(t *testing.T, v *fakeViewer) (*Session, Snapshot) {
	t.Helper()
	var snap Snapshot
	if err := ft.tbl.Create(context.Background(), v, CreateOptions{ForkCount: -1}, capture(v, &snap)); err != nil {
		t.Fatal(err)
	}
	s, _ := ft.tbl.Lookup(snap.SessionID)
	return s, snap
}

func (ft *faultTable) stop(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = ft.tbl.Shutdown(ctx)
	ft.st.Close()
}

// events decodes the event frames v received, in order.
func (v *fakeViewer) events(t *testing.T) []eventParams {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []eventParams
	for _, f := range v.frames {
		var m struct {
			Method string      `json:"method"`
			Params eventParams `json:"params"`
		}
		if err := json.Unmarshal(f, &m); err != nil {
			t.Fatalf("viewer got %q: %v", f, err)
		}
		if m.Method == "event" {
			out = append(out, m.Params)
		}
	}
	return out
}

// TestStorageFaultWithholdsAndRecovers drives every write path with the
// database failing and recovering:
//
//   - create, a resume that must rebuild, prompt.submit and close answer
//     ErrStorageUnavailable and change nothing;
//   - events emitted while commits fail are not delivered (neither sent
//     nor answered by events.since), and a bind's snapshot that reflects
//     them waits behind them;
//   - once commits succeed the withheld events are delivered, in seq
//     order, with nothing lost, then the snapshot;
//   - after a restart the journal holds every event the viewer received,
//     under the same epoch.
func TestStorageFaultWithholdsAndRecovers(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	ft := newFaultTable(t, path)
	v := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}}
	var snap Snapshot
	if err := ft.tbl.Create(ctx, v, CreateOptions{ForkCount: -1}, capture(v, &snap)); err != nil {
		t.Fatal(err)
	}
	other := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 2}}
	var otherSnap Snapshot
	if err := ft.tbl.Create(ctx, other, CreateOptions{ForkCount: -1, Title: "stored"}, capture(other, &otherSnap)); err != nil {
		t.Fatal(err)
	}
	if ok, err := ft.tbl.Close(ctx, otherSnap.SessionID); !ok || err != nil {
		t.Fatalf("close: %v, %v", ok, err)
	}
	s, _ := ft.tbl.Lookup(snap.SessionID)
	if _, err := s.Submit("hello"); err != nil {
		t.Fatal(err)
	}
	ft.say("one ")
	if err := ft.flush(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	// The disk fills.
	ft.st.SetWriteFault(func() error { return errDiskFull })
	ft.say("two ")
	ft.say("three ")
	if err := ft.flush(300 * time.Millisecond); !errors.Is(err, errDiskFull) {
		t.Fatalf("flush with a full disk: %v, want it to fail with the disk's error", err)
	}
	if got := len(v.events(t)); got != 2 {
		t.Errorf("during the fault: viewer has %d events, want the 2 committed ones only", got)
	}
	res, _ := s.EventsSinceLive(0)
	if res.LatestSeq != 2 || len(res.Events) != 2 {
		t.Errorf("events.since during the fault: latest %d, %d events; want the 2 committed", res.LatestSeq, len(res.Events))
	}
	if testCounter(t, ft.m.StoreErrors) < 1 {
		t.Error("tether_store_errors_total did not count the failed commits")
	}
	for name, call := range map[string]func() error{
		"create": func() error {
			var sn Snapshot
			return ft.tbl.Create(ctx, other, CreateOptions{ForkCount: -1}, capture(other, &sn))
		},
		"resume of a stored session": func() error {
			var sn Snapshot
			return ft.tbl.Resume(ctx, other, otherSnap.SessionKey, capture(other, &sn))
		},
		"close": func() error { _, err := ft.tbl.Close(ctx, snap.SessionID); return err },
	} {
		if err := call(); !errors.Is(err, ErrStorageUnavailable) {
			t.Errorf("%s during the fault: %v, want ErrStorageUnavailable", name, err)
		}
	}
	if _, err := ft.tbl.Lookup(snap.SessionID); err != nil {
		t.Errorf("the refused close removed the session: %v", err)
	}
	// A second viewer binds the live session (no write needed): its
	// snapshot waits behind the withheld events.
	late := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 3}}
	var lateSnap Snapshot
	if err := ft.tbl.Activate(ctx, late, snap.SessionID, func(b Binding, sn Snapshot, send func([]byte)) {
		lateSnap = sn
		send([]byte(`{"snapshot":true}`))
	}); err != nil {
		t.Fatalf("activate during the fault: %v", err)
	}
	late.mu.Lock()
	early := len(late.frames)
	late.mu.Unlock()
	if early != 0 {
		t.Errorf("the snapshot reached the viewer before the events it reflects (latest_seq %d) were stored", lateSnap.LatestSeq)
	}

	// The disk has room again.
	ft.st.SetWriteFault(nil)
	if err := ft.flush(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	evs := v.events(t)
	if len(evs) != 4 {
		t.Fatalf("after recovery: %d events, want 4", len(evs))
	}
	for i, e := range evs {
		if e.Seq != uint64(i+1) {
			t.Fatalf("after recovery: event %d has seq %d, want %d (in order, none lost)", i, e.Seq, i+1)
		}
	}
	late.mu.Lock()
	if len(late.frames) != 1 {
		t.Errorf("after recovery the held snapshot was sent %d times, want once", len(late.frames))
	}
	late.mu.Unlock()
	if ft.tbl.journal.health() != nil {
		t.Error("journal still failing after the fault was removed")
	}
	close(ft.agent.step)
	ft.tbl.wg.Wait() // the run has ended (and queued its message.complete)
	if err := ft.flush(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	evs = v.events(t)
	if last := evs[len(evs)-1]; len(evs) != 5 || last.Type != "message.complete" {
		t.Fatalf("last event %s, want message.complete", last.Type)
	}

	// Restart: the journal holds every event the viewer got.
	ft.stop(t)
	ft2 := newFaultTable(t, path)
	defer ft2.stop(t)
	v2 := &fakeViewer{id: contract.TransportID{Instance: "b", Conn: 1}}
	var again Snapshot
	if err := ft2.tbl.Resume(ctx, v2, snap.SessionKey, capture(v2, &again)); err != nil {
		t.Fatal(err)
	}
	if again.Epoch != snap.Epoch {
		t.Errorf("epoch after restart %s, want %s", again.Epoch, snap.Epoch)
	}
	s2, _ := ft2.tbl.Lookup(again.SessionID)
	res2, err := s2.EventsSince(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := v.events(t)
	if len(res2.Events) < len(got) {
		t.Fatalf("journal after restart has %d events, the viewer received %d", len(res2.Events), len(got))
	}
	for i, e := range got {
		var j eventParams
		if err := json.Unmarshal(res2.Events[i], &j); err != nil {
			t.Fatal(err)
		}
		if j.Seq != e.Seq || j.Type != e.Type || fmt.Sprint(j.Payload) != fmt.Sprint(e.Payload) {
			t.Errorf("event %d: journal has %+v, viewer received %+v", i, j, e)
		}
	}
	if want := "hello"; len(again.Messages) < 2 || again.Messages[0].Text != want || again.Messages[1].Text != "one two three " {
		t.Errorf("stored messages after restart %+v, want the prompt and the whole answer", again.Messages)
	}
}

// TestStorageFaultSubmitRefused: a prompt whose turn cannot be stored is
// refused with ErrStorageUnavailable and leaves the session idle.
func TestStorageFaultSubmitRefused(t *testing.T) {
	ft := newFaultTable(t, filepath.Join(t.TempDir(), "state.db"))
	defer ft.stop(t)
	v := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}}
	s, _ := ft.open(t, v)
	ft.st.SetWriteFault(func() error { return errDiskFull })
	if _, err := s.Submit("x"); !errors.Is(err, ErrStorageUnavailable) {
		t.Fatalf("submit with a full disk: %v, want ErrStorageUnavailable", err)
	}
	if runs := s.Runs(); len(runs) != 0 || len(v.events(t)) != 0 {
		t.Errorf("after a refused submit: runs %v, events %d; want none", runs, len(v.events(t)))
	}
	ft.st.SetWriteFault(nil)
	if _, err := s.Submit("x"); err != nil {
		t.Fatalf("submit after the fault: %v", err)
	}
	close(ft.agent.step)
	ft.tbl.wg.Wait()
	if err := ft.flush(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if evs := v.events(t); len(evs) != 2 || evs[1].Type != "message.complete" {
		t.Errorf("after a submit that worked: %+v, want message.start and message.complete", evs)
	}
}

// TestStorageFaultDirectWritesCounted: a write made directly, not
// through the journal (create's CreateSession, prompt.submit's
// StartTurn, the cursor a resume's recover writes), that fails with a
// storage fault while the journal is idle and healthy, is counted in
// tether_store_errors_total and logged at error level, at most once per
// faultLogEvery.
func TestStorageFaultDirectWritesCounted(t *testing.T) {
	ctx := context.Background()
	var logs syncBuffer
	ft := newFaultTable(t, filepath.Join(t.TempDir(), "state.db"), func(c *Config) { c.Log = zerolog.New(&logs) })
	defer ft.stop(t)
	v := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}}
	var snap Snapshot
	if err := ft.tbl.Create(ctx, v, CreateOptions{ForkCount: -1}, capture(v, &snap)); err != nil {
		t.Fatal(err)
	}
	var stored Snapshot
	if err := ft.tbl.Create(ctx, v, CreateOptions{ForkCount: -1, Title: "stored"}, capture(v, &stored)); err != nil {
		t.Fatal(err)
	}
	if ok, err := ft.tbl.Close(ctx, stored.SessionID); !ok || err != nil {
		t.Fatalf("close: %v, %v", ok, err)
	}
	if err := ft.flush(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n := testCounter(t, ft.m.StoreErrors); n != 0 {
		t.Fatalf("tether_store_errors_total = %v before any fault, want 0", n)
	}
	s, _ := ft.tbl.Lookup(snap.SessionID)

	ft.st.SetWriteFault(func() error { return errDiskFull })
	calls := []struct {
		name string
		call func() error
	}{
		{"prompt.submit (StartTurn)", func() error { _, err := s.Submit("x"); return err }},
		{"session.create (CreateSession)", func() error {
			var sn Snapshot
			return ft.tbl.Create(ctx, v, CreateOptions{ForkCount: -1}, capture(v, &sn))
		}},
		{"session.resume of a stored session (recover's SetCursor)", func() error {
			var sn Snapshot
			return ft.tbl.Resume(ctx, v, stored.SessionKey, capture(v, &sn))
		}},
	}
	for i, c := range calls {
		if err := ft.tbl.journal.health(); err != nil {
			t.Fatalf("before %s the journal is failing (%v); want it idle and healthy", c.name, err)
		}
		if err := c.call(); !errors.Is(err, ErrStorageUnavailable) {
			t.Errorf("%s with a full disk: %v, want ErrStorageUnavailable", c.name, err)
		}
		if n := testCounter(t, ft.m.StoreErrors); n < float64(i+1) {
			t.Errorf("after %s failed: tether_store_errors_total = %v, want at least %d", c.name, n, i+1)
		}
	}
	ft.st.SetWriteFault(nil)
	if got := strings.Count(logs.String(), "cannot write the database"); got != 1 {
		t.Errorf("%d error lines for %d failed writes within %v, want 1 (rate-limited)\n%s", got, len(calls), faultLogEvery, logs.String())
	}
	if !strings.Contains(logs.String(), `"level":"error"`) {
		t.Errorf("the failed write was not logged at error level:\n%s", logs.String())
	}
	close(ft.agent.step)
}

// syncBuffer is a log sink safe for concurrent writes and reads.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestEventsSinceFromTheJournalHidesUncommitted: an events.since that
// reaches back past the ring (so it reads the journal, then the ring)
// answers only the events the journal has committed, as the ring-only
// answer does: an event still withheld (its commit failing) is neither
// in the answer nor counted in latest_seq, so a client is never shown a
// seq that a crash could lose.
func TestEventsSinceFromTheJournalHidesUncommitted(t *testing.T) {
	ctx := context.Background()
	ft := newFaultTable(t, filepath.Join(t.TempDir(), "state.db"), func(c *Config) { c.RingSize = 3 })
	defer ft.stop(t)
	s, _ := ft.open(t, &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}})
	if _, err := s.Submit("hello"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		ft.say("w ")
	}
	if err := ft.flush(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	// Seqs 1-6 are stored; 7 and 8 are withheld, and the ring (3) holds
	// 6-8.
	ft.st.SetWriteFault(func() error { return errDiskFull })
	ft.say("x ")
	ft.say("y ")
	res, err := s.EventsSince(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, raw := range res.Events {
		var e struct{ Seq uint64 }
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, e.Seq)
	}
	if res.LatestSeq != 6 || len(seqs) != 6 || seqs[len(seqs)-1] != 6 || res.Truncated {
		t.Errorf("events.since 0 from the journal while 7-8 are withheld: latest_seq %d, seqs %v, truncated %v; want latest_seq 6 and seqs 1-6",
			res.LatestSeq, seqs, res.Truncated)
	}
	ft.st.SetWriteFault(nil)
	close(ft.agent.step)
	ft.tbl.wg.Wait()
	if err := ft.flush(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestStorageFaultCloseUnstoredEnd: a close on a healthy-looking table
// whose storage then fails to take the session's end answers
// ErrStorageUnavailable (5003) — the session is no longer live, and its
// end is stored once the storage takes writes again — never a plain
// success.
func TestStorageFaultCloseUnstoredEnd(t *testing.T) {
	ft := newFaultTable(t, filepath.Join(t.TempDir(), "state.db"))
	defer ft.stop(t)
	v := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}}
	s, snap := ft.open(t, v)
	ft.st.SetWriteFault(func() error { return errDiskFull })
	start := time.Now()
	closed, err := ft.tbl.Close(context.Background(), s.id)
	if !errors.Is(err, ErrStorageUnavailable) || !closed {
		t.Fatalf("close with a full disk: %v, %v; want closed with ErrStorageUnavailable", closed, err)
	}
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("close took %v; want it bounded", took)
	}
	if _, err := ft.tbl.Lookup(snap.SessionID); err == nil {
		t.Error("the session is still live after its close")
	}
	ft.st.SetWriteFault(nil)
	if err := ft.flush(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	got, err := ft.st.GetSession(context.Background(), snap.SessionKey)
	if err != nil || got.EndReason != "closed" {
		t.Errorf("stored after the fault: %+v, %v; want end reason closed", got, err)
	}
}
