package owners

import (
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/cluster/clustertest"
	"github.com/tether-agent/tether/host/internal/ownership"
)

// TestHostOwnersTakeover: a create of a key owned by a live host's
// process answers HeldError naming it (a conflict); one owned by this
// very process, or by a process of a host that restarted since, is taken
// over at once; one whose host stopped beating is taken over once the
// TTL has passed, by a revision-checked update, and counted.
func TestHostOwnersTakeover(t *testing.T) {
	e := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, e.ClientURL())
	bucket := clustertest.NewBucket()
	const ttl = 600 * time.Millisecond
	regA := openRegistry(t, js, bucket, "a", ttl)
	regB := openRegistry(t, js, bucket, "b", ttl)
	kv := openOwners(t, js, KVConfig{Bucket: clustertest.NewBucket()})
	a := NewTakeover(kv, regA, zerolog.Nop())
	ctx := t.Context()
	mine := ownership.Owner{Host: "a", Instance: "a-1", SessionID: "s-a", Gen: 1}

	if _, err := kv.Create(ctx, "k1", ownership.Owner{Host: "b", Instance: "b-1", SessionID: "s-b", Gen: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := a.Create(ctx, "k1", mine)
	var held *ownership.HeldError
	if !errors.As(err, &held) || !errors.Is(err, ownership.ErrConflict) || held.Host != "b" || held.SessionID != "s-b" || held.Instance != "b-1" {
		t.Fatalf("create of b's live key: %v, want HeldError naming b's s-b", err)
	}

	// Entries of this process, and of an earlier process of b, go at once.
	if _, err := kv.Create(ctx, "k2", ownership.Owner{Host: "a", Instance: "a-1", SessionID: "old"}); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "k3", ownership.Owner{Host: "b", Instance: "b-0", SessionID: "older"}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"k2", "k3"} {
		if _, err := a.Create(ctx, key, mine); err != nil {
			t.Fatalf("create of %s: %v, want a takeover", key, err)
		}
		if o, _, err := kv.Get(ctx, key); err != nil || o.SessionID != "s-a" {
			t.Fatalf("owner of %s after the takeover: %+v, %v", key, o, err)
		}
	}

	// b stops beating: k1 is held until the TTL, then taken over.
	close(regB.stop)
	regB.wg.Wait()
	stopped := time.Now()
	for {
		_, err := a.Create(ctx, "k1", mine)
		if err == nil {
			break
		}
		if !errors.As(err, &held) {
			t.Fatalf("create of k1 after b stopped: %v", err)
		}
		if time.Since(stopped) > 10*ttl {
			t.Fatalf("k1 still held %v after b's last beat", time.Since(stopped))
		}
		time.Sleep(20 * time.Millisecond) // polling a TTL clock
	}
	if took := time.Since(stopped); took < ttl/3 {
		t.Errorf("k1 taken %v after b's last beat, before its heartbeat could be a TTL old", took)
	}
	if n := a.Takeovers.Load(); n != 3 {
		t.Errorf("takeovers = %d, want 3", n)
	}
}
