package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestPushSubscriptions(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	at := time.UnixMilli(1_700_000_000_123)
	a := PushSubscription{Endpoint: "https://push.example/a", P256dh: "pa", Auth: "aa", Credential: "c1", Created: at}
	b := PushSubscription{Endpoint: "https://push.example/b", P256dh: "pb", Auth: "ab", Credential: "c2", Created: at.Add(time.Second)}
	for _, p := range []PushSubscription{b, a, {Endpoint: "https://push.example/gone", Credential: "c1", Created: at}} {
		if err := s.PutPushSubscription(ctx, p); err != nil {
			t.Fatalf("PutPushSubscription: %v", err)
		}
	}
	if err := s.PutPushSubscription(ctx, PushSubscription{Endpoint: "https://x", Credential: ""}); !errors.Is(err, ErrInvalid) {
		t.Errorf("PutPushSubscription with no credential: got %v, want %v", err, ErrInvalid)
	}
	// The same endpoint again replaces it (a browser subscribing anew).
	a.Auth = "aa2"
	if err := s.PutPushSubscription(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletePushSubscription(ctx, "https://push.example/gone"); err != nil {
		t.Fatalf("DeletePushSubscription: %v", err)
	}
	if err := s.DeletePushSubscription(ctx, "https://push.example/none"); err != nil {
		t.Errorf("DeletePushSubscription of none: got %v, want nil", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest2(t, path)
	got, err := s.PushSubscriptions(ctx)
	if err != nil {
		t.Fatalf("PushSubscriptions: %v", err)
	}
	want := []PushSubscription{a, b}
	if len(got) != len(want) {
		t.Fatalf("PushSubscriptions after a reopen: got %+v, want %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Endpoint != w.Endpoint || g.P256dh != w.P256dh || g.Auth != w.Auth || g.Credential != w.Credential || !g.Created.Equal(w.Created) {
			t.Errorf("subscription %d: got %+v, want %+v", i, g, w)
		}
	}
}
