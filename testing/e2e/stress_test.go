package e2e_test

// Race stress (issue 6, reliability suites): the stale-disconnect and
// resume-storm scenarios of sessions_test.go at 1,000 rounds each against
// the real binary, several rounds at a time on distinct sessions. After
// all rounds nothing is lost, orphaned or duplicated — every round's
// stored session is listed exactly once with its messages, no session is
// live, the table's gauges are back to 0, every agent built was closed or
// discarded — and the host's goroutines are back to their baseline.
//
// The default is CI-sized; soak with
//
//	go test ./testing/e2e -run Stress -stress.n=20000 -timeout 2h

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

var stressN = flag.Int("stress.n", 1000, "rounds of each race-stress scenario (TestStress*)")

const (
	// stressWorkers run rounds at once, each on sessions of its own.
	stressWorkers = 4
	// stressStorm is the number of sockets resuming one key in a storm
	// round.
	stressStorm = 4
	// stressStep bounds one call or wait of a round.
	stressStep = 20 * time.Second
	// goroutineSlack is how far above its baseline the host's goroutine
	// count may settle (an HTTP scrape, a timer between runs).
	goroutineSlack = 5
	// settleWithin bounds the wait for the host to return to baseline.
	settleWithin = 20 * time.Second
)

// stressRounds is the number of rounds of each scenario.
func stressRounds(tb testing.TB) int {
	tb.Helper()
	if *stressN < 1 {
		tb.Fatalf("-stress.n=%d: want at least 1", *stressN)
	}
	return *stressN
}

// stressDial connects a client to /api/ws and waits for gateway.ready. It
// returns an error rather than failing, so that workers can use it.
func stressDial(s *e2e.Server) (*wsclient.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), stressStep)
	defer cancel()
	c, err := s.DialRaw(ctx, "/api/ws", wsclient.Options{Token: s.Token})
	if err != nil {
		return nil, err
	}
	e, err := c.NextEvent(ctx)
	if err != nil || e.Type != "gateway.ready" {
		c.Drop()
		return nil, fmt.Errorf("first event %s, %v; want gateway.ready", e.Raw, err)
	}
	return c, nil
}

// stressCall is Call with the step timeout.
func stressCall(c *wsclient.Client, method string, params, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), stressStep)
	defer cancel()
	if err := c.Call(ctx, method, params, out); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	return nil
}

// stressRun submits text on session sid through c and waits for its
// message.complete, which must carry the whole text.
func stressRun(c *wsclient.Client, sid, text string) error {
	if err := stressCall(c, "prompt.submit", map[string]any{"session_id": sid, "text": text}, nil); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), stressStep)
	defer cancel()
	ev, err := c.WaitEvent(ctx, func(e wsclient.Event) bool {
		return e.Type == "message.complete" && e.SessionID == sid
	})
	if err != nil {
		return fmt.Errorf("waiting for message.complete of %s: %w", sid, err)
	}
	var p struct{ Text, Status string }
	if err := ev.Decode(&p); err != nil {
		return err
	}
	if p.Text != text || p.Status != "complete" {
		return fmt.Errorf("run on %s ended %q %q, want %q complete", sid, p.Text, p.Status, text)
	}
	return nil
}

// stressActive returns session.active_list through c.
func stressActive(c *wsclient.Client) ([]activeEntry, error) {
	var res struct {
		Sessions []activeEntry `json:"sessions"`
	}
	err := stressCall(c, "session.active_list", nil, &res)
	return res.Sessions, err
}

// stressParallel runs round(i, w) for i in [0, n), spread over workers;
// worker w runs rounds w, w+workers, ... A worker stops at its first
// error; the test fails with every worker's first error.
func stressParallel(t *testing.T, n, workers int, round func(i, w int) error) {
	t.Helper()
	var failed atomic.Bool
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n && !failed.Load(); i += workers {
				if err := round(i, w); err != nil {
					errs[w] = fmt.Errorf("round %d: %w", i, err)
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// hostGoroutines returns the host's goroutine count from the admin
// listener's pprof.
func hostGoroutines(tb testing.TB, s *e2e.Server) int {
	tb.Helper()
	body := adminGet(tb, s, "/debug/pprof/goroutine?debug=1")
	first, _, _ := strings.Cut(body, "\n")
	n, err := strconv.Atoi(strings.TrimPrefix(first, "goroutine profile: total "))
	if err != nil {
		tb.Fatalf("goroutine profile: first line %q, want %q", first, "goroutine profile: total N")
	}
	return n
}

// adminGet fetches path from the admin listener without keeping the
// connection, and fails the test unless it answers 200.
func adminGet(tb testing.TB, s *e2e.Server, path string) string {
	tb.Helper()
	if s.AdminURL == "" {
		tb.Fatalf("no admin URL: start the server with --admin-listen 127.0.0.1:0")
	}
	cl := &http.Client{Timeout: stressStep, Transport: &http.Transport{DisableKeepAlives: true}}
	req, err := http.NewRequest(http.MethodGet, s.AdminURL+path, nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.Token)
	resp, err := cl.Do(req)
	if err != nil {
		tb.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		tb.Fatalf("GET %s: status %d, %v", path, resp.StatusCode, err)
	}
	return string(b)
}

// goroutineBaseline waits for the host's goroutine count to hold still
// (the same count twice, 200 ms apart, within 10 s) and returns it.
func goroutineBaseline(tb testing.TB, s *e2e.Server) int {
	tb.Helper()
	prev := hostGoroutines(tb, s)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond) // sampling a count, not synchronising
		n := hostGoroutines(tb, s)
		if n == prev {
			return n
		}
		prev = n
	}
	return prev
}

// waitGoroutines polls until the host's goroutine count is at most
// baseline + goroutineSlack, and fails with the goroutine profile if it
// is not within settleWithin.
func waitGoroutines(tb testing.TB, s *e2e.Server, baseline int) {
	tb.Helper()
	deadline := time.Now().Add(settleWithin)
	n := hostGoroutines(tb, s)
	for n > baseline+goroutineSlack && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond) // polling the host's teardown
		n = hostGoroutines(tb, s)
	}
	if n > baseline+goroutineSlack {
		tb.Errorf("host goroutines: %d after %v, baseline %d (slack %d): leaked\n%s",
			n, settleWithin, baseline, goroutineSlack, adminGet(tb, s, "/debug/pprof/goroutine?debug=1"))
		return
	}
	tb.Logf("host goroutines: baseline %d, after %d", baseline, n)
}

// waitGauges polls until the table's gauges read 0 live sessions, 0
// parked and 0 viewers, and fails if they do not within settleWithin.
func waitGauges(tb testing.TB, s *e2e.Server) {
	tb.Helper()
	names := []string{"tether_live_sessions", "tether_parked_sessions", "tether_viewers"}
	deadline := time.Now().Add(settleWithin)
	for {
		var got []string
		for _, name := range names {
			if v := s.Metric(tb, name); v != 0 {
				got = append(got, fmt.Sprintf("%s=%v", name, v))
			}
		}
		if len(got) == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Errorf("after %v: %s; want every one 0 (orphaned sessions or viewers)", settleWithin, strings.Join(got, " "))
			return
		}
		time.Sleep(50 * time.Millisecond) // polling the host's teardown
	}
}

// checkAgents checks that every agent the host built was closed or
// discarded: none outlives its session.
func checkAgents(tb testing.TB, s *e2e.Server) {
	tb.Helper()
	built := s.Metric(tb, "tether_agent_builds_total")
	discarded := s.Metric(tb, "tether_agent_discards_total")
	closed := s.Metric(tb, "tether_agent_closes_total")
	if alive := built - discarded - closed; alive != 0 {
		tb.Errorf("agents: %v built, %v discarded, %v closed: %v alive with no live session, want 0", built, discarded, closed, alive)
	}
	tb.Logf("agents: %v built, %v discarded by losing resumes, %v closed; %v teardown CAS conflicts",
		built, discarded, closed, s.Metric(tb, "tether_teardown_cas_conflicts_total"))
}

// checkStored checks that session.list holds exactly the stored sessions
// in want (key → title), each once, with messages message rows and one of
// the end reasons ends: none lost, none duplicated.
func checkStored(tb testing.TB, c *wsclient.Client, want map[string]string, messages int, ends ...string) {
	tb.Helper()
	const listMax = 10000 // session.list's cap
	var res struct {
		Sessions []struct {
			ID           string `json:"id"`
			Title        string `json:"title"`
			EndReason    string `json:"end_reason"`
			MessageCount int    `json:"message_count"`
		} `json:"sessions"`
	}
	if err := stressCall(c, "session.list", map[string]any{"limit": listMax}, &res); err != nil {
		tb.Fatal(err)
	}
	if len(want) >= listMax {
		tb.Logf("stored sessions: %d rounds is more than session.list returns; checked the newest %d", len(want), len(res.Sessions))
	} else if len(res.Sessions) != len(want) {
		tb.Errorf("session.list: %d stored sessions, want %d (one per round)", len(res.Sessions), len(want))
	}
	seen := make(map[string]bool, len(res.Sessions))
	bad := 0
	for _, r := range res.Sessions {
		title, ok := want[r.ID]
		switch {
		case seen[r.ID]:
			tb.Errorf("stored session %s listed twice", r.ID)
		case !ok:
			tb.Errorf("stored session %s (%q) is no round's", r.ID, r.Title)
		case r.Title != title || !slices.Contains(ends, r.EndReason) || r.MessageCount != messages:
			if bad++; bad <= 10 {
				tb.Errorf("stored session %s: title %q, end %q, %d messages; want %q, one of %q, %d", r.ID, r.Title, r.EndReason, r.MessageCount, title, ends, messages)
			}
		}
		seen[r.ID] = true
	}
	if len(want) < listMax {
		missing := 0
		for key := range want {
			if !seen[key] {
				if missing++; missing <= 10 {
					tb.Errorf("stored session %s (%q) is lost", key, want[key])
				}
			}
		}
	}
}

// TestStressStaleDisconnect is TestStaleDisconnectNeverKillsResumedSession
// at -stress.n rounds: socket A creates a session, socket B resumes it
// while A's TCP connection is reset at a random moment. Every round B gets
// the session, runs a prompt on it and sees exactly one live session for
// its key, then closes it. Rounds alternate close_on_disconnect.
func TestStressStaleDisconnect(t *testing.T) {
	n := stressRounds(t)
	s := e2e.Start(t, e2e.Config{Args: []string{"--orphan-grace", "0", "--admin-listen", "127.0.0.1:0", "--pprof", "--log-level", "info"}})
	observer := s.Dial(t)
	baseline := goroutineBaseline(t, s)

	bs := make([]*wsclient.Client, stressWorkers)
	for w := range bs {
		bs[w] = s.Dial(t)
	}
	var mu sync.Mutex
	stored := make(map[string]string, n) // key → title
	var rebuilt atomic.Int64
	start := time.Now()
	stressParallel(t, n, stressWorkers, func(i, w int) error {
		b := bs[w]
		cod := i%2 == 1
		title := fmt.Sprintf("stale %d", i)
		a, err := stressDial(s)
		if err != nil {
			return err
		}
		defer a.Drop()
		var created snapshot
		if err := stressCall(a, "session.create", map[string]any{"close_on_disconnect": cod, "title": title}, &created); err != nil {
			return err
		}
		mu.Lock()
		stored[created.SessionKey] = title
		mu.Unlock()

		delay := time.Duration(rand.IntN(3000)) * time.Microsecond
		var resumed snapshot
		var resumeErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			resumeErr = stressCall(b, "session.resume", map[string]any{"session_id": created.SessionKey}, &resumed)
		})
		wg.Go(func() {
			time.Sleep(delay) // randomised interleaving, not synchronisation
			a.Drop()
		})
		wg.Wait()
		if resumeErr != nil {
			return resumeErr
		}
		if resumed.SessionKey != created.SessionKey {
			return fmt.Errorf("resumed key %s, want %s", resumed.SessionKey, created.SessionKey)
		}
		if resumed.SessionID != created.SessionID {
			if !cod {
				return fmt.Errorf("a parked session was rebuilt (%s → %s), want the same runtime id", created.SessionID, resumed.SessionID)
			}
			rebuilt.Add(1)
		}
		if err := stressRun(b, resumed.SessionID, "round "+strconv.Itoa(i)); err != nil {
			return err
		}
		active, err := stressActive(b)
		if err != nil {
			return err
		}
		if live := liveForKey(active, created.SessionKey); len(live) != 1 || live[0].ID != resumed.SessionID || live[0].Viewers < 1 {
			return fmt.Errorf("live sessions for key %s: %+v, want exactly %s with B viewing", created.SessionKey, live, resumed.SessionID)
		}
		var closed struct {
			Closed bool `json:"closed"`
		}
		if err := stressCall(b, "session.close", map[string]any{"session_id": resumed.SessionID}, &closed); err != nil {
			return err
		}
		if !closed.Closed {
			return fmt.Errorf("session.close of %s: closed false, want true (it was live)", resumed.SessionID)
		}
		return nil
	})
	t.Logf("%d rounds on %d workers in %v; %d close_on_disconnect sessions closed by the drop before the resume and rebuilt",
		n, stressWorkers, time.Since(start).Round(time.Millisecond), rebuilt.Load())

	if active := activeList(t, observer); len(active) != 0 {
		t.Errorf("session.active_list after all rounds: %d live (%+v), want none", len(active), active[:min(len(active), 5)])
	}
	checkStored(t, observer, stored, 2, "closed")
	for _, b := range bs {
		b.Close()
	}
	waitGauges(t, s)
	checkAgents(t, s)
	waitGoroutines(t, s, baseline)
	errsNoErrorLogs(t, s)
}

// TestStressResumeStorm: each worker stores one session with one turn;
// each round, stressStorm sockets resume its key at once while one of them
// is reset at a random moment. Even rounds storm the stored session (every
// resume rebuilds it from the database and all but one must lose, their
// agents discarded); odd rounds storm it while it is live (every resume
// joins it) and then close it. Every resume on a socket left open gets the
// same runtime id and the stored turn; exactly one session is live for the
// key and its viewers are the sockets still open. The reset socket is
// replaced for the next round.
//
// A resume the reset socket sent may still be running in the host after
// the session was closed; it then rebuilds the session for a socket that
// is gone, which parks it (docs/PROTOCOL.md, section 8) until --orphan-grace reaps it. The
// grace is short here so that such sessions are gone by the end, and the
// end checks wait for it: nothing may stay live.
func TestStressResumeStorm(t *testing.T) {
	n := stressRounds(t)
	const grace = 2 * time.Second
	s := e2e.Start(t, e2e.Config{Args: []string{"--admin-listen", "127.0.0.1:0", "--pprof", "--orphan-grace", grace.String(), "--log-level", "info"}})
	observer := s.Dial(t)
	baseline := goroutineBaseline(t, s)

	type worker struct {
		pool []*wsclient.Client
		key  string
		turn string
	}
	workers := make([]*worker, stressWorkers)
	stored := make(map[string]string, stressWorkers)
	for w := range workers {
		wk := &worker{turn: fmt.Sprintf("turn of worker %d", w)}
		for range stressStorm {
			c, err := stressDial(s)
			if err != nil {
				t.Fatal(err)
			}
			wk.pool = append(wk.pool, c)
		}
		title := fmt.Sprintf("storm %d", w)
		var created snapshot
		call(t, wk.pool[0], "session.create", map[string]any{"title": title}, &created)
		if err := stressRun(wk.pool[0], created.SessionID, wk.turn); err != nil {
			t.Fatal(err)
		}
		call(t, wk.pool[0], "session.close", map[string]any{"session_id": created.SessionID}, nil)
		wk.key = created.SessionKey
		stored[wk.key] = title
		workers[w] = wk
	}

	// resume resumes key on c, retrying while the host answers "no longer
	// live; retry resume" (a parked session being reaped as it is
	// resumed, 4007 in docs/PROTOCOL.md, section 11).
	resume := func(c *wsclient.Client, key string) (snapshot, error) {
		for try := 0; ; try++ {
			var snap snapshot
			err := stressCall(c, "session.resume", map[string]any{"session_id": key}, &snap)
			if wsclient.ErrorCode(err) == 4007 && try < 5 {
				continue
			}
			return snap, err
		}
	}

	var dropsWon atomic.Int64 // resumes that completed although their socket was reset
	start := time.Now()
	stressParallel(t, n, stressWorkers, func(i, w int) error {
		wk := workers[w]
		pool := wk.pool
		owner := pool[0] // never reset
		victim := 1 + rand.IntN(len(pool)-1)
		delay := time.Duration(rand.IntN(2000)) * time.Microsecond
		ids := make([]string, len(pool))
		errs := make([]error, len(pool))
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for k, c := range pool {
			wg.Go(func() {
				<-gate
				snap, err := resume(c, wk.key)
				if err != nil {
					errs[k] = err
					return
				}
				if len(snap.Messages) != 2 || snap.Messages[0].Text != wk.turn || snap.Messages[1].Text != wk.turn {
					errs[k] = fmt.Errorf("resume %d: messages %+v, want the stored turn %q", k, snap.Messages, wk.turn)
					return
				}
				ids[k] = snap.SessionID
			})
		}
		wg.Go(func() {
			<-gate
			time.Sleep(delay) // randomised interleaving, not synchronisation
			pool[victim].Drop()
		})
		close(gate)
		wg.Wait()
		for k := range pool {
			if k == victim {
				// Reset mid-call: any outcome on that socket, as long as
				// the table converges (checked below).
				if errs[k] == nil {
					dropsWon.Add(1)
				}
				continue
			}
			if errs[k] != nil {
				return errs[k]
			}
			if ids[k] != ids[0] {
				return fmt.Errorf("resume %d got session %s, resume 0 got %s: the storm did not converge", k, ids[k], ids[0])
			}
		}
		if ids[victim] != "" && ids[victim] != ids[0] {
			return fmt.Errorf("the reset socket's resume got session %s, the others %s", ids[victim], ids[0])
		}
		// The reset socket's viewer goes when its close is processed.
		deadline := time.Now().Add(stressStep)
		for {
			active, err := stressActive(owner)
			if err != nil {
				return err
			}
			live := liveForKey(active, wk.key)
			if len(live) != 1 || live[0].ID != ids[0] {
				return fmt.Errorf("live sessions for key %s: %+v, want exactly %s", wk.key, live, ids[0])
			}
			if live[0].Viewers == len(pool)-1 {
				break
			}
			if time.Now().After(deadline) || live[0].Viewers > len(pool) {
				return fmt.Errorf("session %s has %d viewers, want %d (the sockets still open)", ids[0], live[0].Viewers, len(pool)-1)
			}
			time.Sleep(5 * time.Millisecond) // polling the reset's teardown
		}
		if i/stressWorkers%2 == 1 || i+stressWorkers >= n {
			// Stored again for the next (rebuilding) storm, and at the
			// end.
			var closed struct {
				Closed bool `json:"closed"`
			}
			if err := stressCall(owner, "session.close", map[string]any{"session_id": ids[0]}, &closed); err != nil {
				return err
			}
			if !closed.Closed {
				return fmt.Errorf("session.close of %s: closed false, want true", ids[0])
			}
		}
		c, err := stressDial(s)
		if err != nil {
			return err
		}
		pool[victim] = c
		return nil
	})
	t.Logf("%d storms of %d sockets on %d workers in %v; %d reset sockets still got their resume answered",
		n, stressStorm, stressWorkers, time.Since(start).Round(time.Millisecond), dropsWon.Load())

	for _, wk := range workers {
		for _, c := range wk.pool {
			c.Close()
		}
	}
	waitGauges(t, s) // waits out the grace of sessions rebuilt for reset sockets
	if active := activeList(t, observer); len(active) != 0 {
		t.Errorf("session.active_list after all rounds: %d live (%+v), want none", len(active), active[:min(len(active), 5)])
	}
	checkStored(t, observer, stored, 2, "closed", "orphan_reap")
	checkAgents(t, s)
	waitGoroutines(t, s, baseline)
	errsNoErrorLogs(t, s)
}
