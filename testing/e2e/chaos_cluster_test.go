package e2e_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/ptyclient"
	"github.com/tether-agent/tether/testing/wsclient"
	"github.com/tether-agent/tether/wire"
)

// TestChaosCluster is TestChaos on a cluster of three real hosts, each
// with its embedded NATS server: a session with prompts streaming and a
// PTY printing a numbered sequence (both started through h1), reached
// through a host picked at random each round, while kill -9 hits, at
// random, a host's WebSocket plugin, the PTY plugin, or a whole host —
// its NATS server, one of three, with it — which is then started again on
// its state dir. After each round every session event is accounted for
// under one epoch (what the client saw, plus events.since from its
// cursor, contiguous), and every PTY byte too (no gap, no repeat; a reset
// only when the PTY plugin died with its PTYs).
func TestChaosCluster(t *testing.T) {
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("chaos seed %d (rerun with -chaos.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	const ttl = 2 * time.Second
	hosts := startCluster3(t, "--echo-delay", "20ms", "--orphan-grace", "0", "--pty-command", counter, "--cluster-ttl", ttl.String())
	pick := func() *clusterHost { return hosts[rng.IntN(3)] }

	c := hosts[0].Dial(t)
	var snap snapshot
	call(t, c, "session.create", map[string]any{"title": "cluster chaos"}, &snap)
	key, epoch, sid := snap.SessionKey, snap.Epoch, snap.SessionID
	acct := newEventAccount(t)
	prompt := strings.Repeat("w ", 200)

	tok := attachToken(t)
	pc := ptyDial(t, hosts[0].Server, "attach="+tok)
	ptyEpoch := replayOf(t, pc).Epoch
	var stream []byte
	var offset int64

	for round := range *chaosRounds {
		_ = c.Call(ctxT(t, 5*time.Second), "prompt.submit", map[string]any{"session_id": sid, "text": prompt}, nil)
		acct.collect(c, time.Duration(50+rng.IntN(250))*time.Millisecond)

		victim := []string{"ws", "pty", "host"}[rng.IntN(3)]
		h := pick()
		switch victim {
		case "ws":
			t.Logf("round %d: kill -9 the ws plugin of %s", round, h.ID)
			pid := pluginPID(t, h.Server, countLogLines(h.Server, "ws"))
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill ws plugin %d: %v", pid, err)
			}
		case "pty":
			h = hosts[0] // the PTY's host
			t.Logf("round %d: kill -9 the pty plugin of %s", round, h.ID)
			rec := readPTYRecord(t, h.StateDir)
			if err := syscall.Kill(rec.PID, syscall.SIGKILL); err != nil {
				t.Fatalf("kill pty plugin %d: %v", rec.PID, err)
			}
		case "host":
			t.Logf("round %d: kill -9 host %s", round, h.ID)
			if err := h.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_, _ = h.Wait(5 * time.Second)
			h.restart(t)
		}
		acct.collect(c, 300*time.Millisecond)
		pc.Drop()
		got := pc.Output()
		stream = append(stream, got...)
		offset += int64(len(got))

		// Recover the session through a host picked at random: reconnect,
		// resume (retrying 5002/5003 until the TTL has passed and the
		// NATS streams have leaders again), fetch what was missed.
		via := pick()
		_ = c.Drop()
		c = dialRetry(t, via.Server)
		var resumed snapshot
		deadline := time.Now().Add(ttl + 30*time.Second)
		for {
			err := c.Call(ctxT(t, 10*time.Second), "session.resume", map[string]any{"session_id": key}, &resumed)
			if err == nil {
				break
			}
			if code := wsclient.ErrorCode(err); code != wire.CodeOwnerUnreachable && code != wire.CodeStorageUnavailable || time.Now().After(deadline) {
				t.Fatalf("round %d (%s): resume through %s: %v", round, victim, via.ID, err)
			}
			time.Sleep(100 * time.Millisecond) // the client's retry backoff
		}
		if resumed.Epoch != epoch {
			t.Fatalf("round %d (%s): epoch %q, want %q", round, victim, resumed.Epoch, epoch)
		}
		sid = resumed.SessionID
		acct.recover(c, sid, fmt.Sprintf("round %d (%s)", round, victim))

		// Recover the PTY through a host picked at random.
		pvia := pick()
		var pr wire.Replay
		pc, pr = ptyDialRetryCluster(t, pvia, fmt.Sprintf("attach=%s&offset=%d&epoch=%s", tok, offset, ptyEpoch))
		switch {
		case victim == "pty":
			if !pr.Reset || pr.Epoch == ptyEpoch {
				t.Fatalf("round %d: after the PTY plugin died, reattach %+v, want a reset and a new epoch", round, pr)
			}
			sequenceOK(t, stream)
			stream, offset, ptyEpoch = nil, pr.StartOffset, pr.Epoch
		case pr.Reset || pr.Epoch != ptyEpoch:
			t.Fatalf("round %d (%s): PTY reattach through %s at %d got %+v, want an exact resume", round, victim, pvia.ID, offset, pr)
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

// ptyDialRetryCluster attaches through h until the PTY's host answers
// (a restarting plugin or host; 1013 while the PTY's host is unreachable)
// and returns the socket and its replay header.
func ptyDialRetryCluster(t *testing.T, h *clusterHost, query string) (*ptyclient.Client, wire.Replay) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := ptyclient.Dial(ctxT(t, 5*time.Second), h.WSURL("/api/pty?"+query))
		if err == nil {
			r, rerr := c.Replay(ctxT(t, 10*time.Second))
			if rerr == nil {
				t.Cleanup(c.Drop)
				return c, r
			}
			c.Drop()
			err = rerr
		}
		if time.Now().After(deadline) {
			t.Fatalf("no PTY attach through %s after 30 s: %v", h.ID, err)
		}
		time.Sleep(100 * time.Millisecond) // the plugin or host is restarting
	}
}
