package e2e_test

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

type sinceResult struct {
	Events    []json.RawMessage `json:"events"`
	LatestSeq uint64            `json:"latest_seq"`
	Truncated bool              `json:"truncated"`
	Epoch     string            `json:"epoch"`
}

type journaled struct {
	Type      string `json:"type"`
	SessionID string `json:"session_id"`
	Seq       uint64 `json:"seq"`
	Payload   struct {
		Text   string `json:"text"`
		Status string `json:"status"`
		RunID  string `json:"run_id"`
	} `json:"payload"`
}

func decodeEvents(tb testing.TB, raws []json.RawMessage) []journaled {
	tb.Helper()
	out := make([]journaled, len(raws))
	for i, r := range raws {
		if err := json.Unmarshal(r, &out[i]); err != nil {
			tb.Fatalf("event %s: %v", r, err)
		}
	}
	return out
}

type runsResult struct {
	Runs []struct {
		RunID     string `json:"run_id"`
		Status    string `json:"status"`
		StartedAt int64  `json:"started_at"`
		EndedAt   *int64 `json:"ended_at"`
	} `json:"runs"`
}

// TestReconnectAfterTwoSecondsGetsExactlyTheMissedEvents: a client drops
// mid-run and comes back 2 s later; resume + events.since(last_seen)
// returns exactly the events it missed, contiguous, none twice, and the
// run completes.
func TestReconnectAfterTwoSecondsGetsExactlyTheMissedEvents(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--echo-delay", "100ms"}})
	a := s.Dial(t)
	var snap snapshot
	call(t, a, "session.create", nil, &snap)
	text := strings.Repeat("word ", 40) // 4 s of streaming
	call(t, a, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": text}, nil)
	var seen []wsclient.Event
	for len(seen) < 4 {
		ev, err := a.NextEvent(ctxT(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, ev)
	}
	_ = a.Drop()
	time.Sleep(2 * time.Second) // the client is away for 2 s

	b := s.Dial(t)
	var resumed snapshot
	call(t, b, "session.resume", map[string]any{"session_id": snap.SessionKey}, &resumed)
	lastSeen := seen[len(seen)-1].Seq
	var since sinceResult
	call(t, b, "session.events.since", map[string]any{"session_id": resumed.SessionID, "last_seen": lastSeen}, &since)
	if since.Truncated || since.Epoch != snap.Epoch {
		t.Fatalf("since %d: truncated %v epoch %q; want false and %q", lastSeen, since.Truncated, since.Epoch, snap.Epoch)
	}
	got := decodeEvents(t, since.Events)
	for i, e := range got {
		if e.Seq != lastSeen+uint64(i)+1 {
			t.Fatalf("missed event %d has seq %d, want %d", i, e.Seq, lastSeen+uint64(i)+1)
		}
	}
	// Then the live events continue right after since.latest_seq.
	next := since.LatestSeq + 1
	streamed := ""
	for _, e := range seen {
		var p struct{ Text string }
		_ = e.Decode(&p)
		if e.Type == "message.delta" {
			streamed += p.Text
		}
	}
	for _, e := range got {
		if e.Type == "message.delta" {
			streamed += e.Payload.Text
		}
	}
	for !strings.HasSuffix(streamed, "word ") || len(streamed) < len(text) {
		ev, err := b.NextEvent(ctxT(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if ev.Seq < next {
			continue // already in events.since (the resume raced the stream)
		}
		if ev.Seq != next {
			t.Fatalf("live event seq %d, want %d", ev.Seq, next)
		}
		next++
		var p struct{ Text, Status string }
		_ = ev.Decode(&p)
		if ev.Type == "message.delta" {
			streamed += p.Text
		}
		if ev.Type == "message.complete" {
			if p.Status != "complete" || p.Text != text {
				t.Fatalf("complete %+v, want %q complete", p, text)
			}
			break
		}
	}
	if streamed != text {
		t.Fatalf("streamed %q, want %q", streamed, text)
	}
}

// TestSIGTERMMidRunThenRestart: the host is stopped mid-run and started
// again on the same state dir: resume shows the interrupted run and its
// partial text, and events.since from the client's cursor returns the rest
// with the same epoch.
func TestSIGTERMMidRunThenRestart(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--echo-delay", "100ms"}})
	c := s.Dial(t)
	var snap snapshot
	call(t, c, "session.create", nil, &snap)
	text := strings.Repeat("word ", 100)
	call(t, c, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": text}, nil)
	var cursor uint64
	for cursor < 3 {
		ev, err := c.NextEvent(ctxT(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		cursor = ev.Seq
	}
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s.Wait(5 * time.Second); err != nil || code != 0 {
		t.Fatalf("exit %d %v", code, err)
	}

	s2 := e2e.Start(t, e2e.Config{StateDir: s.StateDir})
	c2 := s2.Dial(t)
	var resumed snapshot
	call(t, c2, "session.resume", map[string]any{"session_id": snap.SessionKey}, &resumed)
	if resumed.Epoch != snap.Epoch {
		t.Fatalf("epoch after restart %q, want %q", resumed.Epoch, snap.Epoch)
	}
	if len(resumed.Messages) != 2 || resumed.Messages[1].Text == "" || !strings.HasPrefix(text, resumed.Messages[1].Text) || resumed.Messages[1].Text == text {
		t.Fatalf("resumed messages %+v, want the prompt and a partial answer", resumed.Messages)
	}
	var runs runsResult
	call(t, c2, "session.runs", map[string]any{"session_id": resumed.SessionID}, &runs)
	if len(runs.Runs) != 1 || runs.Runs[0].Status != "interrupted" || runs.Runs[0].EndedAt == nil {
		t.Fatalf("runs after restart %+v, want one interrupted run", runs.Runs)
	}
	var since sinceResult
	call(t, c2, "session.events.since", map[string]any{"session_id": resumed.SessionID, "last_seen": cursor}, &since)
	evs := decodeEvents(t, since.Events)
	if since.Truncated || since.Epoch != snap.Epoch || len(evs) == 0 || since.LatestSeq != resumed.LatestSeq {
		t.Fatalf("since %d after restart: %+v", cursor, since)
	}
	last := evs[len(evs)-1]
	if last.Type != "message.complete" || last.Payload.Status != "interrupted" || last.Payload.Text != resumed.Messages[1].Text {
		t.Fatalf("last replayed event %+v, want message.complete interrupted with %q", last, resumed.Messages[1].Text)
	}
	for i, e := range evs {
		if e.Seq != cursor+uint64(i)+1 {
			t.Fatalf("replayed seq %d at %d, want %d", e.Seq, i, cursor+uint64(i)+1)
		}
	}
}

// TestSIGKILLMidRunLosesNothingSent: the host is killed mid-run; after a
// restart every event the client had received is in the journal,
// identical, under the same epoch, and the run is recorded interrupted
// with the text that was streamed.
func TestSIGKILLMidRunLosesNothingSent(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--echo-delay", "30ms"}})
	c := s.Dial(t)
	var snap snapshot
	call(t, c, "session.create", nil, &snap)
	text := strings.Repeat("x ", 400)
	call(t, c, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": text}, nil)
	var received []wsclient.Event
	for len(received) < 20 {
		ev, err := c.NextEvent(ctxT(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		received = append(received, ev)
	}
	if err := s.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = s.Wait(5 * time.Second)
	// Whatever else reached the socket before the kill counts as sent.
	for {
		ev, err := c.NextEvent(ctxT(t, 2*time.Second))
		if err != nil {
			break
		}
		received = append(received, ev)
	}

	s2 := e2e.Start(t, e2e.Config{StateDir: s.StateDir})
	c2 := s2.Dial(t)
	var resumed snapshot
	call(t, c2, "session.resume", map[string]any{"session_id": snap.SessionKey}, &resumed)
	if resumed.Epoch != snap.Epoch {
		t.Fatalf("epoch after kill -9 %q, want %q", resumed.Epoch, snap.Epoch)
	}
	var since sinceResult
	call(t, c2, "session.events.since", map[string]any{"session_id": resumed.SessionID, "last_seen": 0}, &since)
	if since.Truncated {
		t.Fatalf("journal truncated after kill -9: %+v", since)
	}
	journal := decodeEvents(t, since.Events)
	bySeq := map[uint64]journaled{}
	for _, e := range journal {
		bySeq[e.Seq] = e
	}
	streamed := ""
	for _, ev := range received {
		j, ok := bySeq[ev.Seq]
		if !ok {
			t.Fatalf("event seq %d (%s) was sent to the client but is missing from the journal", ev.Seq, ev.Type)
		}
		var p struct{ Text string }
		_ = ev.Decode(&p)
		if j.Type != ev.Type || j.Payload.Text != p.Text {
			t.Fatalf("journal seq %d is %+v, client got %s %q", ev.Seq, j, ev.Type, p.Text)
		}
		if ev.Type == "message.delta" {
			streamed += p.Text
		}
	}
	var runs runsResult
	call(t, c2, "session.runs", map[string]any{"session_id": resumed.SessionID}, &runs)
	if len(runs.Runs) != 1 || runs.Runs[0].Status != "interrupted" {
		t.Fatalf("runs after kill -9: %+v, want one interrupted", runs.Runs)
	}
	answer := resumed.Messages[len(resumed.Messages)-1].Text
	if !strings.HasPrefix(answer, streamed) || !strings.HasPrefix(text, answer) {
		t.Fatalf("recovered answer %q does not extend what the client saw %q", answer, streamed)
	}
}

// TestJournalRetentionTruncates: with a small per-session journal, a
// cursor older than the pruned range after a restart gets truncated: true
// and a consistent view (the newest events, up to latest_seq).
func TestJournalRetentionTruncates(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--journal-per-session", "5"}})
	c := s.Dial(t)
	var snap snapshot
	call(t, c, "session.create", nil, &snap)
	call(t, c, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": "a b c d e f g h"}, nil)
	waitComplete(t, c, snap.SessionID)
	call(t, c, "session.close", map[string]any{"session_id": snap.SessionID}, nil)

	var resumed snapshot
	call(t, c, "session.resume", map[string]any{"session_id": snap.SessionKey}, &resumed)
	var since sinceResult
	call(t, c, "session.events.since", map[string]any{"session_id": resumed.SessionID, "last_seen": 1}, &since)
	evs := decodeEvents(t, since.Events)
	// 11 events: the run's 10 (start, 8 deltas, complete) and the
	// close's session.closed.
	if !since.Truncated || len(evs) != 5 || evs[len(evs)-1].Seq != since.LatestSeq || since.LatestSeq != 11 || evs[len(evs)-1].Type != "session.closed" {
		t.Fatalf("since 1 with 5 kept: truncated %v, %d events, latest %d; want truncated, the last 5 of 11 ending with session.closed", since.Truncated, len(evs), since.LatestSeq)
	}
	call(t, c, "session.events.since", map[string]any{"session_id": resumed.SessionID, "last_seen": 7}, &since)
	if since.Truncated || len(since.Events) != 4 {
		t.Fatalf("since 7: truncated %v, %d events; want 4, not truncated", since.Truncated, len(since.Events))
	}
}

// TestIdleReaperAndCap: only parked idle sessions are released by the
// session TTL and evicted by the live cap; with nothing evictable a create
// fails with 5000.
func TestIdleReaperAndCap(t *testing.T) {
	storedReason := func(t *testing.T, c *wsclient.Client, key string) string {
		t.Helper()
		var res struct {
			Sessions []struct {
				ID        string `json:"id"`
				EndReason string `json:"end_reason"`
			} `json:"sessions"`
		}
		call(t, c, "session.list", nil, &res)
		for _, r := range res.Sessions {
			if r.ID == key {
				return r.EndReason
			}
		}
		return "missing"
	}

	t.Run("session ttl", func(t *testing.T) {
		s := e2e.Start(t, e2e.Config{Args: []string{"--orphan-grace", "0", "--session-ttl", "1s"}})
		obs := s.Dial(t)
		var kept, parked snapshot
		call(t, obs, "session.create", nil, &kept)
		a := s.Dial(t)
		call(t, a, "session.create", nil, &parked)
		_ = a.Drop()
		deadline := time.Now().Add(10 * time.Second)
		for storedReason(t, obs, parked.SessionKey) != "idle_reap" {
			if time.Now().After(deadline) {
				t.Fatalf("parked idle session not reaped by the 1s TTL")
			}
			time.Sleep(100 * time.Millisecond) // polling a timer-driven outcome
		}
		if r := storedReason(t, obs, kept.SessionKey); r != "" {
			t.Fatalf("a session with a viewer was released (%q)", r)
		}
	})

	t.Run("live cap", func(t *testing.T) {
		s := e2e.Start(t, e2e.Config{Args: []string{"--orphan-grace", "0", "--max-live-sessions", "2"}})
		obs := s.Dial(t)
		var first, second, third snapshot
		call(t, obs, "session.create", nil, &first)
		b := s.Dial(t)
		call(t, b, "session.create", nil, &second)
		_ = b.Drop()
		// Wait until the drop parked the second session.
		deadline := time.Now().Add(5 * time.Second)
		for {
			live := liveForKey(activeList(t, obs), second.SessionKey)
			if len(live) == 1 && live[0].Viewers == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("dropped session never parked")
			}
			time.Sleep(20 * time.Millisecond) // waiting for the async detach
		}
		call(t, obs, "session.create", nil, &third)
		// The evicted session is persisted by its teardown, just after.
		deadline = time.Now().Add(5 * time.Second)
		for r := storedReason(t, obs, second.SessionKey); r != "evicted"; r = storedReason(t, obs, second.SessionKey) {
			if time.Now().After(deadline) {
				t.Fatalf("parked session end reason %q, want evicted", r)
			}
			time.Sleep(20 * time.Millisecond) // waiting for the async teardown
		}
		if live := liveForKey(activeList(t, obs), second.SessionKey); len(live) != 0 {
			t.Fatalf("evicted session still live: %+v", live)
		}
		if r := storedReason(t, obs, first.SessionKey); r != "" {
			t.Fatalf("a session with a viewer was evicted (%q)", r)
		}
		err := obs.Call(ctxT(t, 5*time.Second), "session.create", nil, nil)
		if wsclient.ErrorCode(err) != 5000 {
			t.Fatalf("create with the cap full of viewed sessions: %v, want 5000", err)
		}
	})
}
