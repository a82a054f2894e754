package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tether-agent/tether/host/store"
)

// RunCredentials runs the checks of a credential store against stores
// made by open: what is put is listed as it was put (times to the
// second), a put with the ID of another credential replaces it, a delete
// removes one and is no error when nothing is there.
func RunCredentials(t *testing.T, open func(t *testing.T) store.CredentialStore) {
	ctx := context.Background()
	created := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	admin := store.Credential{Hash: "aa", ID: "admin", Name: "admin", Kind: "token", Scopes: []string{"admin"}, Created: created}
	page := store.Credential{Hash: "bb", ID: "page-1", Name: "admin", Kind: "page", Scopes: []string{"admin"},
		Parent: "admin", ParentHash: "aa", Created: created.Add(time.Second), Expires: created.Add(time.Hour)}
	t.Run("PutListDelete", func(t *testing.T) {
		s := open(t)
		if got, err := s.Credentials(ctx); err != nil || len(got) != 0 {
			t.Fatalf("empty store: %v, %v", got, err)
		}
		for _, c := range []store.Credential{admin, page} {
			if err := s.PutCredential(ctx, c); err != nil {
				t.Fatalf("PutCredential(%s): %v", c.ID, err)
			}
		}
		got := byHash(t, s)
		for _, want := range []store.Credential{admin, page} {
			if g, ok := got[want.Hash]; !ok || !sameCredential(g, want) {
				t.Errorf("listed %+v, want %+v", g, want)
			}
		}
		if err := s.DeleteCredential(ctx, "bb"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteCredential(ctx, "nothing"); err != nil {
			t.Errorf("deleting a credential that is not there: %v", err)
		}
		if got := byHash(t, s); len(got) != 1 || got["aa"].ID != "admin" {
			t.Errorf("after delete: %+v, want only admin", got)
		}
	})
	t.Run("SameIDReplaces", func(t *testing.T) {
		s := open(t)
		if err := s.PutCredential(ctx, admin); err != nil {
			t.Fatal(err)
		}
		changed := admin
		changed.Hash = "cc"
		if err := s.PutCredential(ctx, changed); err != nil {
			t.Fatal(err)
		}
		if got := byHash(t, s); len(got) != 1 || got["cc"].ID != "admin" {
			t.Errorf("after a put with admin's id and a new hash: %+v, want only the new one", got)
		}
	})
}

func byHash(t *testing.T, s store.CredentialStore) map[string]store.Credential {
	t.Helper()
	cs, err := s.Credentials(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[string]store.Credential)
	for _, c := range cs {
		m[c.Hash] = c
	}
	return m
}

func sameCredential(a, b store.Credential) bool {
	return a.Hash == b.Hash && a.ID == b.ID && a.Name == b.Name && a.Kind == b.Kind && slices.Equal(a.Scopes, b.Scopes) &&
		a.Parent == b.Parent && a.ParentHash == b.ParentHash && a.Created.Equal(b.Created) && a.Expires.Equal(b.Expires) &&
		a.LastUsed.Equal(b.LastUsed)
}
