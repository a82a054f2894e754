package e2e_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/ptyclient"
	"github.com/tether-agent/tether/testing/wsclient"
)

var (
	chaosRounds = flag.Int("chaos.rounds", 6, "kill -9 rounds of TestChaos")
	chaosSeed   = flag.Uint64("chaos.seed", 0, "seed of TestChaos (0: from the clock; logged)")
)

// eventAccount keeps a client's account of one session's events across
// kills: which seqs reached it (live or through events.since), the last
// one, and per connection the last live seq (live events on one
// connection come in strictly increasing order; a resumed connection may
// also get live events events.since already returned, dropped by seq).
type eventAccount struct {
	t        *testing.T
	seen     map[uint64]bool
	lastSeen uint64
	liveSeq  map[*wsclient.Client]uint64
}

func newEventAccount(t *testing.T) *eventAccount {
	return &eventAccount{t: t, seen: map[uint64]bool{}, liveSeq: map[*wsclient.Client]uint64{}}
}

// collect reads cl's live events for d.
func (a *eventAccount) collect(cl *wsclient.Client, d time.Duration) {
	t := a.t
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ev, err := cl.NextEvent(ctxT(t, time.Until(deadline)+time.Millisecond))
		if err != nil {
			return
		}
		if ev.SessionID == "" {
			continue
		}
		if prev := a.liveSeq[cl]; ev.Seq <= prev {
			t.Fatalf("live event seq %d after seq %d on one connection", ev.Seq, prev)
		}
		a.liveSeq[cl] = ev.Seq
		a.seen[ev.Seq] = true
		a.lastSeen = max(a.lastSeen, ev.Seq)
	}
}

// recover fetches events.since(lastSeen) of sid through c after a kill
// (what) and checks that the journal continues the account with no gap
// and that every seq up to the latest reached the client or the journal.
func (a *eventAccount) recover(c *wsclient.Client, sid, what string) {
	t := a.t
	var since sinceResult
	call(t, c, "session.events.since", map[string]any{"session_id": sid, "last_seen": a.lastSeen}, &since)
	if since.Truncated {
		t.Fatalf("%s: events.since(%d) truncated", what, a.lastSeen)
	}
	for i, e := range decodeEvents(t, since.Events) {
		if e.Seq != a.lastSeen+uint64(i)+1 {
			t.Fatalf("%s: events.since(%d) item %d has seq %d: not contiguous", what, a.lastSeen, i, e.Seq)
		}
		a.seen[e.Seq] = true
	}
	a.lastSeen = max(a.lastSeen, since.LatestSeq)
	for seq := uint64(1); seq <= since.LatestSeq; seq++ {
		if !a.seen[seq] {
			t.Fatalf("%s: seq %d of %d never reached the client nor events.since", what, seq, since.LatestSeq)
		}
	}
}

// TestChaos runs a scripted workload — a session with prompts streaming,
// and a PTY printing a numbered sequence — and kills with SIGKILL, at
// random points, the WebSocket plugin, the PTY plugin or the host itself.
// After each recovery every session event is accounted for (the events a
// client saw plus events.since from its cursor are contiguous, under one
// epoch) and every PTY byte too (the numbers continue with no gap and no
// repeat, except across a PTY plugin kill, whose PTYs die with it: then
// the reattach must say so with a reset).
func TestChaos(t *testing.T) {
	checkNoLeaks(t)
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("chaos seed %d (rerun with -chaos.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed))

	args := []string{"--echo-delay", "20ms", "--orphan-grace", "0", "--pty-command", counter}
	s := e2e.Start(t, e2e.Config{Args: args})
	stateDir := s.StateDir

	// The session workload.
	c := s.Dial(t)
	var snap snapshot
	call(t, c, "session.create", map[string]any{"title": "chaos"}, &snap)
	key, epoch := snap.SessionKey, snap.Epoch
	acct := newEventAccount(t)
	prompt := strings.Repeat("w ", 200) // 4 s of streaming at 20 ms a word

	// The PTY workload.
	tok := attachToken(t)
	pc := ptyDial(t, s, "attach="+tok)
	pr := replayOf(t, pc)
	ptyEpoch := pr.Epoch
	var stream []byte // every byte of the current PTY, in order
	var offset int64

	for round := range *chaosRounds {
		// Keep a run streaming (4009 when the previous one still runs).
		var sid snapshot
		call(t, c, "session.activate", map[string]any{"session_id": snapIDFor(t, c, key)}, &sid)
		_ = c.Call(ctxT(t, 5*time.Second), "prompt.submit", map[string]any{"session_id": sid.SessionID, "text": prompt}, nil)
		acct.collect(c, time.Duration(50+rng.IntN(250))*time.Millisecond)

		victim := []string{"ws", "pty", "host"}[rng.IntN(3)]
		t.Logf("round %d: kill -9 %s", round, victim)
		switch victim {
		case "ws":
			pid := pluginPID(t, s, countLogLines(s, "ws")) // the current ws process
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill ws plugin %d: %v", pid, err)
			}
		case "pty":
			rec := readPTYRecord(t, stateDir)
			if err := syscall.Kill(rec.PID, syscall.SIGKILL); err != nil {
				t.Fatalf("kill pty plugin %d: %v", rec.PID, err)
			}
		case "host":
			if err := s.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_, _ = s.Wait(5 * time.Second)
			s = e2e.Start(t, e2e.Config{Args: args, StateDir: stateDir})
		}
		// Whatever reached the clients before they noticed counts.
		acct.collect(c, 300*time.Millisecond)
		pc.Drop()
		got := pc.Output()
		stream = append(stream, got...)
		offset += int64(len(got))

		// Recover the session: reconnect, resume, fetch what was missed.
		c = dialRetry(t, s)
		var resumed snapshot
		call(t, c, "session.resume", map[string]any{"session_id": key}, &resumed)
		if resumed.Epoch != epoch {
			t.Fatalf("round %d (%s): epoch %q, want %q", round, victim, resumed.Epoch, epoch)
		}
		acct.recover(c, resumed.SessionID, fmt.Sprintf("round %d (%s)", round, victim))

		// Recover the PTY: reattach with the cursor.
		pc = ptyDialRetry(t, s, fmt.Sprintf("attach=%s&offset=%d&epoch=%s", tok, offset, ptyEpoch))
		pr = replayOf(t, pc)
		switch {
		case victim == "pty":
			if !pr.Reset || pr.Epoch == ptyEpoch {
				t.Fatalf("round %d: after the PTY plugin died, reattach %+v, want a reset and a new epoch", round, pr)
			}
			sequenceOK(t, stream)
			stream, offset, ptyEpoch = nil, pr.StartOffset, pr.Epoch
		case pr.Reset || pr.Epoch != ptyEpoch:
			t.Fatalf("round %d (%s): PTY reattach at %d got %+v, want an exact resume", round, victim, offset, pr)
		}
	}
	if err := pc.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool { return strings.Contains(string(b), "\r\n") }); err != nil {
		t.Fatal(err)
	}
	pc.Drop()
	stream = append(stream, pc.Output()...)
	if n := sequenceOK(t, stream); n == 0 {
		t.Fatalf("no PTY output after the last round")
	}
}

// snapIDFor returns the runtime id of the live session of key.
func snapIDFor(t *testing.T, c *wsclient.Client, key string) string {
	t.Helper()
	live := liveForKey(activeList(t, c), key)
	if len(live) != 1 {
		t.Fatalf("live sessions for %s: %+v, want one", key, live)
	}
	return live[0].ID
}

// countLogLines is how many ws plugins the host has started so far.
func countLogLines(s *e2e.Server, plugin string) int {
	n := 0
	for _, line := range strings.Split(s.Stderr.String(), "\n") {
		var l struct{ Message, Plugin string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Message == "plugin started" && l.Plugin == plugin {
			n++
		}
	}
	return max(n, 1)
}

// dialRetry dials /api/ws until the (restarting) transport admits it.
func dialRetry(t *testing.T, s *e2e.Server) *wsclient.Client {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := wsclient.Dial(ctxT(t, 5*time.Second), "ws://"+s.Addr+"/api/ws", wsclient.Options{Token: s.Token})
		if err == nil {
			if ev, err := c.NextEvent(ctxT(t, 5*time.Second)); err == nil && ev.Type == "gateway.ready" {
				t.Cleanup(func() { _ = c.Close() })
				return c
			}
			_ = c.Drop()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no gateway after 15 s: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // the plugin is restarting
	}
}

// ptyDialRetry attaches until the (restarting) backend answers.
func ptyDialRetry(t *testing.T, s *e2e.Server, query string) *ptyclient.Client {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := ptyclient.Dial(ctxT(t, 5*time.Second), s.WSURL("/api/pty?"+query))
		if err == nil {
			if _, rerr := c.Replay(ctxT(t, 5*time.Second)); rerr == nil {
				t.Cleanup(c.Drop)
				return c
			}
			c.Drop()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no PTY attach after 15 s")
		}
		time.Sleep(50 * time.Millisecond) // the plugin is restarting
	}
}
