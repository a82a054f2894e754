package jsstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/cluster/clustertest"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/host/store/storetest"
)

// TestCredentialsConformance runs the credential store checks on the
// cluster's bucket.
func TestCredentialsConformance(t *testing.T) {
	e := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, e.ClientURL())
	storetest.RunCredentials(t, func(t *testing.T) store.CredentialStore {
		c, err := openCredentials(context.Background(), js, clustertest.NewBucket(), 1, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	})
}

// TestCredentialsWatch: a host watching the bucket gets every credential
// in it first, then each put and delete another host makes, so that a
// credential made (or revoked) on one host is accepted (or refused) on
// every other.
func TestCredentialsWatch(t *testing.T) {
	e := clustertest.StartServer(t)
	_, jsA := clustertest.Connect(t, e.ClientURL())
	_, jsB := clustertest.Connect(t, e.ClientURL())
	bucket := clustertest.NewBucket()
	ctx := context.Background()
	a, err := openCredentials(ctx, jsA, bucket, 1, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	first := store.Credential{Hash: "11", ID: "admin@a", Name: "admin", Kind: "token", Scopes: []string{"admin"}, Created: time.Now().UTC().Truncate(time.Second)}
	if err := a.PutCredential(ctx, first); err != nil {
		t.Fatal(err)
	}

	b, err := openCredentials(ctx, jsB, bucket, 1, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	var mu sync.Mutex
	seen := map[string]bool{}
	changed := make(chan struct{}, 16)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.Watch(wctx, func(c store.Credential, deleted bool) {
		mu.Lock()
		seen[c.Hash] = !deleted
		mu.Unlock()
		changed <- struct{}{}
	}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if !seen["11"] {
		t.Errorf("Watch returned before the existing credential was applied: %v", seen)
	}
	mu.Unlock()
	waitSeen := func(hash string, want bool) {
		t.Helper()
		for {
			mu.Lock()
			got, ok := seen[hash]
			mu.Unlock()
			if ok && got == want {
				return
			}
			select {
			case <-changed:
			case <-wctx.Done():
				t.Fatalf("credential %s: never seen as present=%v", hash, want)
			}
		}
	}
	// a changes its access token: b sees the new one and the old one go.
	next := first
	next.Hash = "22"
	if err := a.PutCredential(ctx, next); err != nil {
		t.Fatal(err)
	}
	waitSeen("22", true)
	waitSeen("11", false)
	if err := a.DeleteCredential(ctx, "22"); err != nil {
		t.Fatal(err)
	}
	waitSeen("22", false)
}
