package e2e_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/wsclient"
	"github.com/tether-agent/tether/wire"
)

// stressResume is session.resume with the clients' retry on 5002 and
// 5003 (a claim or a leader election in flight), at most a few seconds.
func stressResume(c *wsclient.Client, key string, out any) error {
	deadline := time.Now().Add(stressStep)
	for {
		err := stressCall(c, "session.resume", map[string]any{"session_id": key}, out)
		code := wsclient.ErrorCode(err)
		if err == nil || code != wire.CodeOwnerUnreachable && code != wire.CodeStorageUnavailable || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond) // the client's retry backoff
	}
}

// TestStressClusterStaleDisconnect is the seed race across hosts at
// -stress.n rounds on a cluster of three real hosts: socket A creates a
// session on one host, socket B resumes it on another while A's TCP
// connection is reset at a random moment. Every round B gets the session
// (the same runtime id unless A's drop closed a close_on_disconnect
// session first), runs a prompt on it through whichever host serves it,
// and every host's active_list shows exactly one live session for the key,
// B viewing; then B closes it. In the end nothing is live on any host,
// every round's session is stored once with its turn, and every agent a
// host built was closed or discarded.
func TestStressClusterStaleDisconnect(t *testing.T) {
	n := stressRounds(t)
	hosts := startCluster3(t, "--orphan-grace", "0", "--admin-listen", "127.0.0.1:0", "--log-level", "info")
	bs := make([]*wsclient.Client, stressWorkers)
	for w := range bs {
		bs[w] = hosts[(w+1)%3].Dial(t)
	}
	var mu sync.Mutex
	stored := make(map[string]string, n)
	var rebuilt, relayed atomic.Int64
	start := time.Now()
	stressParallel(t, n, stressWorkers, func(i, w int) error {
		b := bs[w]
		cod := i%2 == 1
		title := fmt.Sprintf("cluster stale %d", i)
		a, err := stressDial(hosts[w%3].Server)
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
		wg.Go(func() { resumeErr = stressResume(b, created.SessionKey, &resumed) })
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
		} else {
			relayed.Add(1)
		}
		if err := stressRun(b, resumed.SessionID, "round "+strconv.Itoa(i)); err != nil {
			return err
		}
		for _, h := range hosts {
			c, err := stressDial(h.Server)
			if err != nil {
				return err
			}
			active, err := stressActive(c)
			c.Drop()
			if err != nil {
				return err
			}
			if live := liveForKey(active, created.SessionKey); len(live) != 1 || live[0].ID != resumed.SessionID || live[0].Viewers < 1 {
				return fmt.Errorf("%s: live sessions for key %s: %+v, want exactly %s with B viewing", h.ID, created.SessionKey, live, resumed.SessionID)
			}
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
	t.Logf("%d rounds on %d workers over 3 hosts in %v; %d served by the creating host through the relay, %d close_on_disconnect sessions closed by the drop and rebuilt",
		n, stressWorkers, time.Since(start).Round(time.Millisecond), relayed.Load(), rebuilt.Load())
	observer := hosts[0].Dial(t)
	if active := activeList(t, observer); len(active) != 0 {
		t.Errorf("session.active_list after all rounds: %d live (%+v), want none", len(active), active[:min(len(active), 5)])
	}
	checkStored(t, observer, stored, 2, "closed")
	for _, b := range bs {
		b.Close()
	}
	for _, h := range hosts {
		waitGauges(t, h.Server)
		checkAgents(t, h.Server)
	}
}

// TestStressClusterResumeStorm: each worker stores one session with one
// turn; each round, six sockets — two on each of the three hosts — resume
// its key at once. Every resume gets the same runtime id and the stored
// turn, whichever host rebuilt it (the claim comes before the build: one
// host wins, the others relay to it); every host's active_list shows
// exactly one live session for the key with the six viewers; then the
// session is closed, so that the next round rebuilds it again. In the end
// nothing is live on any host and every agent a host built was closed or
// discarded.
func TestStressClusterResumeStorm(t *testing.T) {
	n := stressRounds(t)
	hosts := startCluster3(t, "--admin-listen", "127.0.0.1:0", "--log-level", "info")
	type worker struct {
		pool []*wsclient.Client
		key  string
		turn string
	}
	workers := make([]*worker, stressWorkers)
	stored := make(map[string]string, stressWorkers)
	for w := range workers {
		wk := &worker{turn: fmt.Sprintf("turn of worker %d", w)}
		for k := range 6 {
			c, err := stressDial(hosts[k%3].Server)
			if err != nil {
				t.Fatal(err)
			}
			wk.pool = append(wk.pool, c)
		}
		title := fmt.Sprintf("cluster storm %d", w)
		var created snapshot
		call(t, wk.pool[0], "session.create", map[string]any{"title": title}, &created)
		if err := stressRun(wk.pool[0], created.SessionID, wk.turn); err != nil {
			t.Fatal(err)
		}
		call(t, wk.pool[0], "session.close", map[string]any{"session_id": created.SessionID}, nil)
		wk.key, stored[created.SessionKey] = created.SessionKey, title
		workers[w] = wk
	}
	observers := make([]*wsclient.Client, 3)
	for i, h := range hosts {
		observers[i] = h.Dial(t)
	}
	var omu sync.Mutex // the observers are shared by the workers
	start := time.Now()
	stressParallel(t, n, stressWorkers, func(i, w int) error {
		wk := workers[w]
		ids := make([]string, len(wk.pool))
		errs := make([]error, len(wk.pool))
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for k, c := range wk.pool {
			wg.Go(func() {
				<-gate
				var snap snapshot
				if errs[k] = stressResume(c, wk.key, &snap); errs[k] != nil {
					return
				}
				if len(snap.Messages) != 2 || snap.Messages[1].Text != wk.turn {
					errs[k] = fmt.Errorf("resume %d: messages %+v, want the stored turn", k, snap.Messages)
				}
				ids[k] = snap.SessionID
			})
		}
		close(gate)
		wg.Wait()
		for k := range wk.pool {
			if errs[k] != nil {
				return fmt.Errorf("resume %d (h%d): %w", k, k%3+1, errs[k])
			}
			if ids[k] != ids[0] {
				return fmt.Errorf("resume %d (h%d) got session %s, resume 0 got %s: the storm did not converge", k, k%3+1, ids[k], ids[0])
			}
		}
		omu.Lock()
		for j, o := range observers {
			active, err := stressActive(o)
			if err != nil {
				omu.Unlock()
				return err
			}
			if live := liveForKey(active, wk.key); len(live) != 1 || live[0].ID != ids[0] || live[0].Viewers != len(wk.pool) {
				omu.Unlock()
				return fmt.Errorf("h%d: live sessions for key %s: %+v, want exactly %s with %d viewers", j+1, wk.key, live, ids[0], len(wk.pool))
			}
		}
		omu.Unlock()
		var closed struct {
			Closed bool `json:"closed"`
		}
		if err := stressCall(wk.pool[i%len(wk.pool)], "session.close", map[string]any{"session_id": ids[0]}, &closed); err != nil {
			return err
		}
		if !closed.Closed {
			return fmt.Errorf("session.close of %s: closed false, want true", ids[0])
		}
		return nil
	})
	t.Logf("%d storms of 6 resumes over 3 hosts on %d workers in %v", n, stressWorkers, time.Since(start).Round(time.Millisecond))
	if active := activeList(t, observers[0]); len(active) != 0 {
		t.Errorf("session.active_list after all rounds: %d live, want none", len(active))
	}
	checkStored(t, observers[0], stored, 2, "closed")
	for _, wk := range workers {
		for _, c := range wk.pool {
			c.Close()
		}
	}
	for _, h := range hosts {
		waitGauges(t, h.Server)
		checkAgents(t, h.Server)
	}
}
