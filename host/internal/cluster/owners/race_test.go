package owners

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tether-agent/tether/host/internal/cluster/clustertest"
	"github.com/tether-agent/tether/host/internal/cluster/embedded"
	"github.com/tether-agent/tether/host/internal/ownership"
)

// clusterOwners opens one KV per node, each on a connection to that
// node, on one bucket of 3 replicas. Creating a replicated bucket can
// fail while the servers are still learning of each other: it is tried
// again until clustertest.Timeout.
func clusterOwners(tb testing.TB, nodes []*embedded.Server) []*KV {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clustertest.Timeout)
	defer cancel()
	owners := make([]*KV, len(nodes))
	for i, e := range nodes {
		_, js := clustertest.ConnectNode(tb, e)
		for {
			k, err := NewKV(ctx, js, KVConfig{Replicas: len(nodes)})
			if err == nil {
				owners[i] = k
				break
			}
			if ctx.Err() != nil {
				tb.Fatalf("open owners on node %d: %v", i, err)
			}
			clustertest.Retry(ctx)
		}
	}
	return owners
}

// result is one racer's answer.
type result struct {
	o   ownership.Owner
	rev uint64
	err error
}

// raceAll runs op for every racer at once (racers per KV) and
// returns the results in racer order.
func raceAll(owners []*KV, perOwner int, op func(k *KV, o ownership.Owner) (uint64, error), tag string) []result {
	res := make([]result, len(owners)*perOwner)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range res {
		k := owners[i%len(owners)]
		o := ownership.Owner{Host: fmt.Sprint("host", i%len(owners)), SessionID: fmt.Sprint(tag, "-", i), Gen: 1}
		wg.Go(func() {
			<-start
			rev, err := op(k, o)
			res[i] = result{o: o, rev: rev, err: err}
		})
	}
	close(start)
	wg.Wait()
	return res
}

// winner returns the index of the one nil error among res (-1 if none);
// it fails on two, and on errors other than the classes allowed.
func winner(tb testing.TB, what string, res []result, allowUnavailable bool) int {
	tb.Helper()
	w := -1
	for i, r := range res {
		switch {
		case r.err == nil && w >= 0:
			tb.Fatalf("%s: racers %d and %d both won (%+v and %+v)", what, w, i, res[w].o, r.o)
		case r.err == nil:
			w = i
		case errors.Is(r.err, ownership.ErrConflict):
		case allowUnavailable && errors.Is(r.err, ownership.ErrUnavailable):
		default:
			tb.Fatalf("%s: racer %d: %v", what, i, r.err)
		}
	}
	return w
}

// TestClusterOneWinner: on three routed servers, a bucket of 3 replicas,
// racers on connections to different servers: every round of creates,
// updates, and deletes against updates has exactly one winner, and every
// server's client reads the winner's entry.
func TestClusterOneWinner(t *testing.T) {
	nodes := clustertest.StartCluster(t, 3)
	owners := clusterOwners(t, nodes)
	ctx := t.Context()
	for round := range 10 {
		key := fmt.Sprintf("20250101_000000_%06x", round)
		res := raceAll(owners, 2, func(k *KV, o ownership.Owner) (uint64, error) { return k.Create(ctx, key, o) }, fmt.Sprint("c", round))
		w := winner(t, fmt.Sprintf("round %d: create", round), res, false)
		if w < 0 {
			t.Fatalf("round %d: no create won", round)
		}
		rev := res[w].rev
		res = raceAll(owners, 2, func(k *KV, o ownership.Owner) (uint64, error) { return k.Update(ctx, key, o, rev) }, fmt.Sprint("u", round))
		w = winner(t, fmt.Sprintf("round %d: update", round), res, false)
		if w < 0 {
			t.Fatalf("round %d: no update won", round)
		}
		for i, k := range owners {
			o, got, err := k.Get(ctx, key)
			if err != nil || got != res[w].rev || o.SessionID != res[w].o.SessionID {
				t.Fatalf("round %d: node %d reads %+v at %d, %v; want %+v at %d", round, i, o, got, err, res[w].o, res[w].rev)
			}
		}
		rev = res[w].rev
		res = raceAll(owners, 2, func(k *KV, o ownership.Owner) (uint64, error) {
			if o.SessionID[len(o.SessionID)-1]%2 == 0 {
				return 0, k.Delete(ctx, key, rev)
			}
			return k.Update(ctx, key, o, rev)
		}, fmt.Sprint("d", round))
		if w = winner(t, fmt.Sprintf("round %d: delete or update", round), res, false); w < 0 {
			t.Fatalf("round %d: no delete or update won", round)
		}
	}
}

// TestClusterNodeLoss: the stream leader of a 3-replica bucket is shut
// down while creators race on fresh keys: no committed entry is lost or
// changed, no key ever has two winners (and a key whose racers were all
// left unsure holds at most one racer's owner), and once a new leader is
// elected the two servers left keep giving one winner per round.
func TestClusterNodeLoss(t *testing.T) {
	nodes := clustertest.StartCluster(t, 3)
	owners := clusterOwners(t, nodes)
	ctx := t.Context()

	// Committed entries: created and updated once, from every server.
	type committed struct {
		o   ownership.Owner
		rev uint64
	}
	want := map[string]committed{}
	for i := range 30 {
		key := fmt.Sprintf("20250102_000000_%06x", i)
		k := owners[i%len(owners)]
		o := ownership.Owner{Host: "h", SessionID: fmt.Sprint("s", i), Gen: 1}
		rev, err := k.Create(ctx, key, o)
		if err != nil {
			t.Fatal(err)
		}
		o.Gen = 2
		if rev, err = k.Update(ctx, key, o, rev); err != nil {
			t.Fatal(err)
		}
		want[key] = committed{o, rev}
	}

	leader := -1
	for i, e := range nodes {
		if e.Server().JetStreamIsStreamLeader("$G", "KV_"+Bucket) {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no server leads the bucket's stream")
	}

	// Creators race round after round; the leader goes down after the
	// second round, while the third is racing.
	const rounds = 8
	raced := make([][]result, rounds)
	kill := make(chan struct{})
	killed := make(chan struct{})
	go func() {
		<-kill
		nodes[leader].Shutdown()
		close(killed)
	}()
	for round := range rounds {
		if round == 2 {
			close(kill)
		}
		key := fmt.Sprintf("20250103_000000_%06x", round)
		raced[round] = raceAll(owners, 2, func(k *KV, o ownership.Owner) (uint64, error) {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			return k.Create(cctx, key, o)
		}, fmt.Sprint("k", round))
	}
	<-killed

	var alive []*KV
	for i, k := range owners {
		if i != leader {
			alive = append(alive, k)
		}
	}
	// Reads retried while the two servers left elect a leader.
	get := func(k *KV, key string) (ownership.Owner, uint64, error) {
		rctx, cancel := context.WithTimeout(ctx, clustertest.Timeout)
		defer cancel()
		for {
			o, rev, err := k.Get(rctx, key)
			if !errors.Is(err, ownership.ErrUnavailable) || rctx.Err() != nil {
				return o, rev, err
			}
			clustertest.Retry(rctx)
		}
	}
	for key, c := range want {
		for i, k := range alive {
			o, rev, err := get(k, key)
			if err != nil || rev != c.rev || o.SessionID != c.o.SessionID || o.Gen != c.o.Gen {
				t.Fatalf("after the leader's loss, survivor %d reads %s = %+v at %d, %v; want %+v at %d", i, key, o, rev, err, c.o, c.rev)
			}
		}
	}
	for round, res := range raced {
		key := fmt.Sprintf("20250103_000000_%06x", round)
		w := winner(t, fmt.Sprintf("round %d (leader lost in round 2)", round), res, true)
		unsure := 0
		for _, r := range res {
			if errors.Is(r.err, ownership.ErrUnavailable) {
				unsure++
			}
		}
		t.Logf("round %d: winner %d, %d of %d racers unsure", round, w, unsure, len(res))
		o, rev, err := get(alive[0], key)
		switch {
		case w >= 0:
			if err != nil || rev != res[w].rev || o.SessionID != res[w].o.SessionID {
				t.Fatalf("round %d: %s = %+v at %d, %v; want the winner's %+v at %d", round, key, o, rev, err, res[w].o, res[w].rev)
			}
		case errors.Is(err, ownership.ErrNoOwner):
			// Every racer was left unsure, and none got in.
		case err != nil:
			t.Fatalf("round %d: get %s: %v", round, key, err)
		default:
			// Every racer was left unsure, and one got in: one of them.
			found := false
			for _, r := range res {
				found = found || (r.o.SessionID == o.SessionID && errors.Is(r.err, ownership.ErrUnavailable))
			}
			if !found {
				t.Fatalf("round %d: %s = %+v, which no unsure racer wrote", round, key, o)
			}
		}
	}

	// The two servers left still decide every race.
	for round := range 5 {
		key := fmt.Sprintf("20250104_000000_%06x", round)
		res := raceAll(alive, 3, func(k *KV, o ownership.Owner) (uint64, error) { return k.Create(ctx, key, o) }, fmt.Sprint("a", round))
		if w := winner(t, fmt.Sprintf("after the loss, round %d", round), res, false); w < 0 {
			t.Fatalf("after the loss, round %d: no create won", round)
		}
	}
}

// TestClusterBackToBackWrites: many sessions' lives at once on a bucket
// of 3 replicas, each write at the revision the previous one returned the
// moment it returned. The stream leader acknowledges a write before it
// forgets the write in process, and refuses the key's next conditional
// write meanwhile (10164): KV asks again, so no life sees an error.
func TestClusterBackToBackWrites(t *testing.T) {
	nodes := clustertest.StartCluster(t, 3)
	owners := clusterOwners(t, nodes)
	ctx := t.Context()
	const workers, lives = 12, 15
	var wg sync.WaitGroup
	for w := range workers {
		k := owners[w%len(owners)]
		wg.Go(func() {
			for l := range lives {
				key := fmt.Sprintf("20250106_000000_%03x%03x", w, l)
				o := ownership.Owner{Host: "h", SessionID: key[16:], Gen: 1}
				rev, err := k.Create(ctx, key, o)
				for i := 0; err == nil && i < 4; i++ {
					o.Gen++
					rev, err = k.Update(ctx, key, o, rev)
				}
				if err == nil {
					err = k.Delete(ctx, key, rev)
				}
				if err != nil {
					t.Errorf("worker %d, life %d: %v", w, l, err)
					return
				}
			}
		})
	}
	wg.Wait()
	var retries uint64
	for _, k := range owners {
		retries += k.busyRetries.Load()
	}
	t.Logf("%d writes asked again after a busy answer", retries)
}
