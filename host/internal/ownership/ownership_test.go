package ownership_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/tether-agent/tether/host/internal/ownership"
	"github.com/tether-agent/tether/host/internal/ownership/ownershiptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestMemConformance holds the in-memory store to the contract every
// store is held to (the comparison with itself is a smoke test of the
// model).
func TestMemConformance(t *testing.T) {
	ownershiptest.Run(t, func(testing.TB) ownership.Store { return ownership.NewMem() })
}

func TestMemLen(t *testing.T) {
	m := ownership.NewMem()
	if n := m.Len(); n != 0 {
		t.Fatalf("empty store: Len = %d, want 0", n)
	}
	rev, err := m.Create(t.Context(), ownershiptest.Key(1), ownership.Owner{SessionID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(t.Context(), ownershiptest.Key(2), ownership.Owner{SessionID: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Delete(t.Context(), ownershiptest.Key(1), rev); err != nil {
		t.Fatal(err)
	}
	if n := m.Len(); n != 1 {
		t.Fatalf("after two creates and a delete: Len = %d, want 1", n)
	}
}
