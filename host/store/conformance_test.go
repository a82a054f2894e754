package store_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/host/store/storetest"
)

// TestConformance runs the store conformance suite on SQLite.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Store {
		s, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		return s
	})
}

// TestCredentialsConformance runs the credential store checks on SQLite.
func TestCredentialsConformance(t *testing.T) {
	storetest.RunCredentials(t, func(t *testing.T) store.CredentialStore {
		s, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}
