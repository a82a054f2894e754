package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

type message struct {
	Role string `json:"role"`
	Text string `json:"text"`
}

type snapshot struct {
	SessionID    string    `json:"session_id"`
	SessionKey   string    `json:"session_key"`
	Resumed      string    `json:"resumed"`
	Title        string    `json:"title"`
	MessageCount int       `json:"message_count"`
	Messages     []message `json:"messages"`
	Status       string    `json:"status"`
	Running      bool      `json:"running"`
	StartedAt    int64     `json:"started_at"`
	LatestSeq    uint64    `json:"latest_seq"`
	Epoch        string    `json:"epoch"`
}

type activeEntry struct {
	ID           string `json:"id"`
	SessionKey   string `json:"session_key"`
	Title        string `json:"title"`
	Status       string `json:"status"`
	MessageCount int    `json:"message_count"`
	Viewers      int    `json:"viewers"`
}

func ctxT(tb testing.TB, d time.Duration) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

func call(tb testing.TB, c *wsclient.Client, method string, params, out any) {
	tb.Helper()
	if err := c.Call(ctxT(tb, 10*time.Second), method, params, out); err != nil {
		tb.Fatalf("%s: %v", method, err)
	}
}

func activeList(tb testing.TB, c *wsclient.Client) []activeEntry {
	tb.Helper()
	var res struct {
		Sessions []activeEntry `json:"sessions"`
	}
	call(tb, c, "session.active_list", nil, &res)
	return res.Sessions
}

func liveForKey(entries []activeEntry, key string) []activeEntry {
	var out []activeEntry
	for _, e := range entries {
		if e.SessionKey == key {
			out = append(out, e)
		}
	}
	return out
}

// waitComplete waits for message.complete of session sid and returns its
// payload.
func waitComplete(tb testing.TB, c *wsclient.Client, sid string) (text, status string) {
	tb.Helper()
	ev, err := c.WaitEvent(ctxT(tb, 15*time.Second), func(e wsclient.Event) bool {
		return e.Type == "message.complete" && e.SessionID == sid
	})
	if err != nil {
		tb.Fatalf("waiting for message.complete of %s: %v", sid, err)
	}
	var p struct{ Text, Status string }
	if err := ev.Decode(&p); err != nil {
		tb.Fatalf("decode message.complete: %v", err)
	}
	return p.Text, p.Status
}

// TestStaleDisconnectNeverKillsResumedSession is the seed bug: socket A
// owns a session, socket B resumes it, and A's TCP connection is dropped
// abruptly while B's resume is in flight, with randomised timing. After
// every round the session is live, B can submit a prompt on it, and there
// is exactly one live session for the key.
func TestStaleDisconnectNeverKillsResumedSession(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--orphan-grace", "0"}})
	observer := s.Dial(t)
	for _, cod := range []bool{false, true} {
		t.Run(fmt.Sprintf("close_on_disconnect=%v", cod), func(t *testing.T) {
			const rounds = 200
			for round := range rounds {
				a := s.Dial(t)
				var created snapshot
				call(t, a, "session.create", map[string]any{"close_on_disconnect": cod, "title": fmt.Sprintf("race %v %d", cod, round)}, &created)
				b := s.Dial(t)

				delay := time.Duration(rand.IntN(3000)) * time.Microsecond
				var wg sync.WaitGroup
				var resumed snapshot
				var resumeErr error
				wg.Go(func() {
					resumeErr = b.Call(ctxT(t, 10*time.Second), "session.resume", map[string]any{"session_id": created.SessionKey}, &resumed)
				})
				wg.Go(func() {
					time.Sleep(delay) // randomised interleaving, not synchronisation
					_ = a.Drop()
				})
				wg.Wait()
				if resumeErr != nil {
					t.Fatalf("round %d: resume: %v", round, resumeErr)
				}
				if resumed.SessionKey != created.SessionKey {
					t.Fatalf("round %d: resumed key %s, want %s", round, resumed.SessionKey, created.SessionKey)
				}
				var sub struct {
					Status string `json:"status"`
					RunID  string `json:"run_id"`
				}
				call(t, b, "prompt.submit", map[string]any{"session_id": resumed.SessionID, "text": "still here"}, &sub)
				if text, status := waitComplete(t, b, resumed.SessionID); text != "still here" || status != "complete" {
					t.Fatalf("round %d: run ended %q %q, want %q complete", round, text, status, "still here")
				}
				live := liveForKey(activeList(t, observer), created.SessionKey)
				if len(live) != 1 || live[0].ID != resumed.SessionID {
					t.Fatalf("round %d: live sessions for key: %+v, want exactly %s", round, live, resumed.SessionID)
				}
				if !cod && resumed.SessionID != created.SessionID {
					t.Fatalf("round %d: a parked session was rebuilt (%s → %s), want the same runtime id", round, created.SessionID, resumed.SessionID)
				}
				var closed struct {
					Closed bool `json:"closed"`
				}
				call(t, b, "session.close", map[string]any{"session_id": resumed.SessionID}, &closed)
				b.Close()
			}
		})
	}
}

// TestResumeStormConverges resumes one stored key from 40 sockets at
// once: all get the same runtime id, one live record exists, and every
// agent a losing resume built was closed.
func TestResumeStormConverges(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--admin-listen", "127.0.0.1:0"}})
	c := s.Dial(t)
	var created snapshot
	call(t, c, "session.create", map[string]any{"title": "storm"}, &created)
	call(t, c, "prompt.submit", map[string]any{"session_id": created.SessionID, "text": "before the storm"}, nil)
	waitComplete(t, c, created.SessionID)
	call(t, c, "session.close", map[string]any{"session_id": created.SessionID}, nil)

	const n = 40
	clients := make([]*wsclient.Client, n)
	for i := range clients {
		clients[i] = s.Dial(t)
	}
	ids := make([]string, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, cl := range clients {
		wg.Go(func() {
			<-start
			var snap snapshot
			if err := cl.Call(ctxT(t, 20*time.Second), "session.resume", map[string]any{"session_id": created.SessionKey}, &snap); err != nil {
				t.Errorf("resume %d: %v", i, err)
				return
			}
			if len(snap.Messages) != 2 || snap.Messages[1].Text != "before the storm" {
				t.Errorf("resume %d: messages %+v, want the stored turn", i, snap.Messages)
			}
			ids[i] = snap.SessionID
		})
	}
	close(start)
	wg.Wait()
	for i, id := range ids {
		if id != ids[0] {
			t.Fatalf("resume %d got session %s, want %s like resume 0", i, id, ids[0])
		}
	}
	live := liveForKey(activeList(t, c), created.SessionKey)
	if len(live) != 1 || live[0].Viewers != n {
		t.Fatalf("live for key: %+v, want one session with %d viewers", live, n)
	}
	built := s.Metric(t, "tether_agent_builds_total")
	discarded := s.Metric(t, "tether_agent_discards_total")
	closed := s.Metric(t, "tether_agent_closes_total")
	if alive := built - discarded - closed; alive != 1 {
		t.Errorf("agents built %v, discarded %v, closed %v: %v alive, want 1", built, discarded, closed, alive)
	}
	t.Logf("resume storm: %v agents built, %v discarded by losers", built, discarded)
}

// TestLivePayload checks that a resume snapshot holds the stored rows and
// the live rows, and, while a run streams, the partial answer.
func TestLivePayload(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--echo-delay", "150ms"}})
	a := s.Dial(t)
	var created snapshot
	call(t, a, "session.create", map[string]any{"title": "payload"}, &created)
	call(t, a, "prompt.submit", map[string]any{"session_id": created.SessionID, "text": "first turn"}, nil)
	waitComplete(t, a, created.SessionID)

	b := s.Dial(t)
	var snap snapshot
	call(t, b, "session.resume", map[string]any{"session_id": created.SessionKey}, &snap)
	want := []message{{"user", "first turn"}, {"assistant", "first turn"}}
	if fmt.Sprint(snap.Messages) != fmt.Sprint(want) || snap.MessageCount != 2 || snap.Status != "idle" || snap.SessionID != created.SessionID || snap.Resumed != created.SessionKey {
		t.Fatalf("idle resume snapshot: %+v, want messages %v, idle, same id, resumed key", snap, want)
	}

	// Mid-run: a second prompt streams word by word.
	long := "one two three four five six seven eight nine ten"
	call(t, a, "prompt.submit", map[string]any{"session_id": created.SessionID, "text": long}, nil)
	if _, err := a.WaitEvent(ctxT(t, 10*time.Second), func(e wsclient.Event) bool {
		return e.Type == "message.delta" && e.SessionID == created.SessionID
	}); err != nil {
		t.Fatalf("waiting for the first delta: %v", err)
	}
	c := s.Dial(t)
	var mid snapshot
	call(t, c, "session.resume", map[string]any{"session_id": created.SessionKey}, &mid)
	if mid.Status != "working" || !mid.Running {
		t.Fatalf("mid-run snapshot status %q running %v, want working true", mid.Status, mid.Running)
	}
	if len(mid.Messages) != 4 || mid.MessageCount != 4 {
		t.Fatalf("mid-run messages %+v (count %d), want 4 rows", mid.Messages, mid.MessageCount)
	}
	if m := mid.Messages[2]; m.Role != "user" || m.Text != long {
		t.Errorf("mid-run prompt row %+v, want the user prompt", m)
	}
	partial := mid.Messages[3]
	if partial.Role != "assistant" || partial.Text == "" || partial.Text == long || !strings.HasPrefix(long, partial.Text) {
		t.Errorf("mid-run answer row %+v, want a non-empty strict prefix of %q", partial, long)
	}
	// The events after the snapshot continue its text exactly, starting at
	// latest_seq+1.
	text := partial.Text
	next := mid.LatestSeq + 1
	for {
		ev, err := c.NextEvent(ctxT(t, 10*time.Second))
		if err != nil {
			t.Fatalf("events after snapshot: %v", err)
		}
		if ev.Seq != next {
			t.Fatalf("event %s seq %d, want %d", ev.Type, ev.Seq, next)
		}
		next++
		var p struct{ Text, Status string }
		if err := ev.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if ev.Type == "message.delta" {
			text += p.Text
			continue
		}
		if ev.Type != "message.complete" || p.Text != long || text != long || p.Status != "complete" {
			t.Fatalf("end: %s %+v, streamed %q; want message.complete of %q", ev.Type, p, text, long)
		}
		break
	}
}

// TestParkAndReap checks the orphan-grace timer: a session whose only
// socket drops is reaped after the grace, unless a resume comes first; a
// session whose run is streaming is not reaped while it streams.
func TestParkAndReap(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--orphan-grace", "1s", "--echo-delay", "250ms"}})
	observer := s.Dial(t)

	waitGone := func(t *testing.T, key string, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < within {
			if len(liveForKey(activeList(t, observer), key)) == 0 {
				return time.Since(start)
			}
			time.Sleep(50 * time.Millisecond) // polling a timer-driven outcome
		}
		t.Fatalf("session %s still live after %v", key, within)
		return 0
	}
	storedEnd := func(t *testing.T, key string) string {
		t.Helper()
		var res struct {
			Sessions []struct {
				ID        string `json:"id"`
				EndReason string `json:"end_reason"`
			} `json:"sessions"`
		}
		call(t, observer, "session.list", map[string]any{"limit": 100}, &res)
		for _, r := range res.Sessions {
			if r.ID == key {
				return r.EndReason
			}
		}
		t.Fatalf("stored session %s not listed", key)
		return ""
	}
	// waitEnded waits for the stored end of a released session: a
	// release takes the session out of the table at once and stores its
	// end after (docs/PROTOCOL.md, "Session lifecycle": "Release"), so
	// its leaving session.active_list is no barrier for session.list.
	waitEnded := func(t *testing.T, key string, within time.Duration) string {
		t.Helper()
		for deadline := time.Now().Add(within); ; {
			if r := storedEnd(t, key); r != "" {
				return r
			}
			if time.Now().After(deadline) {
				t.Fatalf("session %s released but no end stored after %v", key, within)
			}
			time.Sleep(50 * time.Millisecond) // polling the store's write behind the release
		}
	}

	t.Run("reaped after grace", func(t *testing.T) {
		a := s.Dial(t)
		var snap snapshot
		call(t, a, "session.create", map[string]any{"title": "reap me"}, &snap)
		dropped := time.Now()
		_ = a.Drop()
		// The drop may not be processed yet; the session is live either way.
		if live := liveForKey(activeList(t, observer), snap.SessionKey); len(live) != 1 {
			t.Fatalf("right after the drop: %+v, want the session still live", live)
		}
		waitGone(t, snap.SessionKey, 10*time.Second)
		if held := time.Since(dropped); held < 900*time.Millisecond {
			t.Errorf("reaped %v after the drop, want at least the 1s grace", held)
		}
		if r := waitEnded(t, snap.SessionKey, 10*time.Second); r != "orphan_reap" {
			t.Errorf("end reason %q, want orphan_reap", r)
		}
	})

	t.Run("rebind cancels the timer", func(t *testing.T) {
		a := s.Dial(t)
		var snap snapshot
		call(t, a, "session.create", map[string]any{"title": "keep me"}, &snap)
		_ = a.Drop()
		b := s.Dial(t)
		var resumed snapshot
		call(t, b, "session.resume", map[string]any{"session_id": snap.SessionKey}, &resumed)
		if resumed.SessionID != snap.SessionID {
			t.Fatalf("resume got %s, want the parked %s", resumed.SessionID, snap.SessionID)
		}
		// Well past the grace, it is still the same live session.
		time.Sleep(2 * time.Second) // letting a (cancelled) timer's deadline pass
		live := liveForKey(activeList(t, observer), snap.SessionKey)
		if len(live) != 1 || live[0].ID != snap.SessionID || live[0].Viewers != 1 {
			t.Fatalf("after the grace: %+v, want %s live with one viewer", live, snap.SessionID)
		}
	})

	t.Run("not reaped while a run streams", func(t *testing.T) {
		a := s.Dial(t)
		var snap snapshot
		call(t, a, "session.create", map[string]any{"title": "streaming"}, &snap)
		words := strings.Repeat("word ", 12) // 12 × 250ms = 3s of streaming
		call(t, a, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": words}, nil)
		_ = a.Drop()
		time.Sleep(2 * time.Second) // past the grace, mid-run
		live := liveForKey(activeList(t, observer), snap.SessionKey)
		if len(live) != 1 || live[0].Status != "working" {
			t.Fatalf("mid-run past the grace: %+v, want the session live and working", live)
		}
		waitGone(t, snap.SessionKey, 10*time.Second)
		// The run was never interrupted: the whole answer is stored.
		b := s.Dial(t)
		var resumed snapshot
		call(t, b, "session.resume", map[string]any{"session_id": snap.SessionKey}, &resumed)
		if len(resumed.Messages) != 2 || resumed.Messages[1].Text != words {
			t.Fatalf("after reap, stored answer %+v, want the full %q", resumed.Messages, words)
		}
	})
}

// TestRunSurvivesDisconnect: a client drops mid-run and a new socket
// resumes; the run completes and the missed events come back from
// session.events.since with contiguous seqs.
func TestRunSurvivesDisconnect(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--echo-delay", "100ms"}})
	a := s.Dial(t)
	var snap snapshot
	call(t, a, "session.create", nil, &snap)
	text := "alpha beta gamma delta epsilon zeta eta theta"
	call(t, a, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": text}, nil)
	first, err := a.WaitEvent(ctxT(t, 5*time.Second), func(e wsclient.Event) bool { return e.Type == "message.delta" })
	if err != nil {
		t.Fatal(err)
	}
	lastSeen := first.Seq
	_ = a.Drop()

	b := s.Dial(t)
	var resumed snapshot
	call(t, b, "session.resume", map[string]any{"session_id": snap.SessionKey}, &resumed)
	waitComplete(t, b, resumed.SessionID)
	var since struct {
		Events    []json.RawMessage `json:"events"`
		LatestSeq uint64            `json:"latest_seq"`
		Truncated bool              `json:"truncated"`
		Epoch     string            `json:"epoch"`
	}
	call(t, b, "session.events.since", map[string]any{"session_id": resumed.SessionID, "last_seen": lastSeen}, &since)
	if since.Truncated || since.Epoch != snap.Epoch {
		t.Fatalf("events.since truncated %v epoch %q, want false and %q", since.Truncated, since.Epoch, snap.Epoch)
	}
	got := ""
	want := lastSeen + 1
	for _, raw := range since.Events {
		var ev struct {
			Type    string
			Seq     uint64
			Payload struct{ Text, Status string }
		}
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Seq != want {
			t.Fatalf("missed events: seq %d, want %d", ev.Seq, want)
		}
		want++
		if ev.Type == "message.delta" {
			got += ev.Payload.Text
		}
		if ev.Type == "message.complete" && (ev.Payload.Status != "complete" || ev.Payload.Text != text) {
			t.Fatalf("complete %+v, want %q complete", ev.Payload, text)
		}
	}
	var firstDelta struct{ Text string }
	_ = first.Decode(&firstDelta)
	if firstDelta.Text+got != text || want-1 != since.LatestSeq {
		t.Fatalf("replayed %q after %q, last seq %d of %d; want the rest of %q", got, firstDelta.Text, want-1, since.LatestSeq, text)
	}
}

// TestBranchShowsParentPrefix: a branch (by runtime id or stored key) and
// a session created with parent_session_id show the parent's rows up to
// the fork, then their own; the parent is unchanged.
func TestBranchShowsParentPrefix(t *testing.T) {
	s := e2e.Start(t, e2e.Config{})
	c := s.Dial(t)
	var parent snapshot
	call(t, c, "session.create", map[string]any{"title": "parent"}, &parent)
	call(t, c, "prompt.submit", map[string]any{"session_id": parent.SessionID, "text": "one"}, nil)
	waitComplete(t, c, parent.SessionID)

	for _, tc := range []struct {
		name   string
		method string
		params map[string]any
	}{
		{"branch by runtime id", "session.branch", map[string]any{"session_id": parent.SessionID}},
		{"branch by stored key", "session.branch", map[string]any{"session_id": parent.SessionKey}},
		{"create with parent", "session.create", map[string]any{"parent_session_id": parent.SessionKey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var child snapshot
			call(t, c, tc.method, tc.params, &child)
			if child.SessionKey == parent.SessionKey || child.SessionID == parent.SessionID {
				t.Fatalf("child %s/%s is the parent", child.SessionID, child.SessionKey)
			}
			want := []message{{"user", "one"}, {"assistant", "one"}}
			if fmt.Sprint(child.Messages) != fmt.Sprint(want) {
				t.Fatalf("child messages %v, want the parent prefix %v", child.Messages, want)
			}
			call(t, c, "prompt.submit", map[string]any{"session_id": child.SessionID, "text": "two"}, nil)
			waitComplete(t, c, child.SessionID)
			call(t, c, "session.close", map[string]any{"session_id": child.SessionID}, nil)
			var again snapshot
			call(t, c, "session.resume", map[string]any{"session_id": child.SessionKey}, &again)
			want = append(want, message{"user", "two"}, message{"assistant", "two"})
			if fmt.Sprint(again.Messages) != fmt.Sprint(want) {
				t.Fatalf("resumed child messages %v, want %v", again.Messages, want)
			}
		})
	}
	var p snapshot
	call(t, c, "session.activate", map[string]any{"session_id": parent.SessionID}, &p)
	if len(p.Messages) != 2 {
		t.Fatalf("parent messages %v, want its own 2 rows", p.Messages)
	}
	if e := c.Call(ctxT(t, 5*time.Second), "session.branch", map[string]any{"session_id": "20200101_000000_abcdef"}, nil); wsclient.ErrorCode(e) != 4007 {
		t.Errorf("branch of a missing stored key: %v, want 4007", e)
	}
}
