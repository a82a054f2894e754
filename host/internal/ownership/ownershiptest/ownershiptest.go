// Package ownershiptest checks an ownership.Store against the contract of
// the interface: named conformance checks for each operation and each
// known pitfall of a store built on a replicated log (revision 0, stale
// and foreign revisions, create after delete, concurrent writers), and a
// rapid state-machine test that runs every operation on the store under
// test and on ownership.Mem and compares the outcomes one by one.
//
// Like testing/fstest, it is called from the tests of each store:
//
//	func TestConformance(t *testing.T) {
//		ownershiptest.Run(t, func(tb testing.TB) ownership.Store { return newStore(tb) })
//	}
package ownershiptest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/ownership"
)

// NewStore returns an empty store for one check; it registers its own
// cleanup with tb.
type NewStore func(tb testing.TB) ownership.Store

// Racers is how many goroutines the concurrency checks run at once.
const Racers = 8

// Rounds is how many times each concurrency check races.
const Rounds = 10

// Run runs every check on stores made by newStore, each as a subtest.
func Run(t *testing.T, newStore NewStore) {
	checks := []struct {
		name string
		fn   func(*testing.T, ownership.Store)
	}{
		{"CreateThenGet", testCreateThenGet},
		{"CreateExisting", testCreateExisting},
		{"GetMissing", testGetMissing},
		{"UpdateAtRevision", testUpdateAtRevision},
		{"UpdateStale", testUpdateStale},
		{"UpdateMissing", testUpdateMissing},
		{"RevisionZero", testRevisionZero},
		{"RevisionOfAnotherKey", testRevisionOfAnotherKey},
		{"DeleteAtRevision", testDeleteAtRevision},
		{"DeleteStale", testDeleteStale},
		{"CreateAfterDelete", testCreateAfterDelete},
		{"RevisionsGrow", testRevisionsGrow},
		{"ReturnedOwnerIsACopy", testReturnedOwnerIsACopy},
		{"ConcurrentCreates", testConcurrentCreates},
		{"ConcurrentCreatesAfterDelete", testConcurrentCreatesAfterDelete},
		{"ConcurrentUpdates", testConcurrentUpdates},
		{"ConcurrentDeleteAndUpdate", testConcurrentDeleteAndUpdate},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) { c.fn(t, newStore(t)) })
	}
	t.Run("MatchesMem", func(t *testing.T) { testMatchesMem(t, newStore(t)) })
}

// Key returns a stored-session-shaped key, distinct for each i.
func Key(i int) string { return fmt.Sprintf("20250101_000000_%06x", i) }

// owner returns a distinct owner record for n.
func owner(n int) ownership.Owner {
	return ownership.Owner{
		Host:      fmt.Sprint("host", n%3),
		SessionID: fmt.Sprintf("%08x", n),
		Gen:       uint64(n),
		Viewers:   []contract.TransportID{{Instance: fmt.Sprint("i", n), Conn: uint64(n)}},
	}
}

// Equal reports whether two owner records are the same (an empty viewer
// list equals a nil one).
func Equal(a, b ownership.Owner) bool {
	return a.Host == b.Host && a.SessionID == b.SessionID && a.Gen == b.Gen &&
		len(a.Viewers) == len(b.Viewers) && (len(a.Viewers) == 0 || slices.Equal(a.Viewers, b.Viewers))
}

func mustCreate(tb testing.TB, s ownership.Store, key string, o ownership.Owner) uint64 {
	tb.Helper()
	rev, err := s.Create(context.Background(), key, o)
	if err != nil {
		tb.Fatalf("create %s: %v", key, err)
	}
	if rev == 0 {
		tb.Fatalf("create %s: revision 0", key)
	}
	return rev
}

func mustUpdate(tb testing.TB, s ownership.Store, key string, o ownership.Owner, rev uint64) uint64 {
	tb.Helper()
	next, err := s.Update(context.Background(), key, o, rev)
	if err != nil {
		tb.Fatalf("update %s at %d: %v", key, rev, err)
	}
	return next
}

// wantEntry fails unless key's entry is o at rev.
func wantEntry(tb testing.TB, s ownership.Store, key string, o ownership.Owner, rev uint64) {
	tb.Helper()
	got, gotRev, err := s.Get(context.Background(), key)
	if err != nil {
		tb.Fatalf("get %s: %v, want %+v at %d", key, err, o, rev)
	}
	if !Equal(got, o) || gotRev != rev {
		tb.Fatalf("get %s = %+v at %d, want %+v at %d", key, got, gotRev, o, rev)
	}
}

// wantNoOwner fails unless key has no entry.
func wantNoOwner(tb testing.TB, s ownership.Store, key string) {
	tb.Helper()
	o, rev, err := s.Get(context.Background(), key)
	if !errors.Is(err, ownership.ErrNoOwner) {
		tb.Fatalf("get %s = %+v at %d, %v; want ErrNoOwner", key, o, rev, err)
	}
}

func wantConflict(tb testing.TB, what string, err error) {
	tb.Helper()
	if !errors.Is(err, ownership.ErrConflict) {
		tb.Fatalf("%s: %v, want ErrConflict", what, err)
	}
}

func testCreateThenGet(t *testing.T, s ownership.Store) {
	rev := mustCreate(t, s, Key(1), owner(1))
	wantEntry(t, s, Key(1), owner(1), rev)
	// An owner with no viewers reads back as one.
	bare := ownership.Owner{SessionID: "bare"}
	rev2 := mustCreate(t, s, Key(2), bare)
	wantEntry(t, s, Key(2), bare, rev2)
}

func testCreateExisting(t *testing.T, s ownership.Store) {
	rev := mustCreate(t, s, Key(1), owner(1))
	_, err := s.Create(context.Background(), Key(1), owner(2))
	wantConflict(t, "second create", err)
	wantEntry(t, s, Key(1), owner(1), rev)
}

func testGetMissing(t *testing.T, s ownership.Store) {
	wantNoOwner(t, s, Key(1))
}

func testUpdateAtRevision(t *testing.T, s ownership.Store) {
	rev := mustCreate(t, s, Key(1), owner(1))
	next := mustUpdate(t, s, Key(1), owner(2), rev)
	if next <= rev {
		t.Fatalf("update at %d returned revision %d, want a greater one", rev, next)
	}
	wantEntry(t, s, Key(1), owner(2), next)
	last := mustUpdate(t, s, Key(1), owner(3), next)
	wantEntry(t, s, Key(1), owner(3), last)
}

func testUpdateStale(t *testing.T, s ownership.Store) {
	rev := mustCreate(t, s, Key(1), owner(1))
	next := mustUpdate(t, s, Key(1), owner(2), rev)
	_, err := s.Update(context.Background(), Key(1), owner(3), rev)
	wantConflict(t, "update at the revision before the last", err)
	wantEntry(t, s, Key(1), owner(2), next)
}

func testUpdateMissing(t *testing.T, s ownership.Store) {
	other := mustCreate(t, s, Key(2), owner(2))
	_, err := s.Update(context.Background(), Key(1), owner(1), other)
	wantConflict(t, "update of a key never created", err)
	wantNoOwner(t, s, Key(1))
}

// testRevisionZero: revision 0 is nobody's. A store on a log whose
// "expected last sequence 0" means "no message yet" (or "no check at
// all", for a delete) must not let Update create an entry or Delete
// remove one unconditionally.
func testRevisionZero(t *testing.T, s ownership.Store) {
	ctx := context.Background()
	_, err := s.Update(ctx, Key(1), owner(1), 0)
	wantConflict(t, "update of a missing key at revision 0", err)
	wantNoOwner(t, s, Key(1))
	wantConflict(t, "delete of a missing key at revision 0", s.Delete(ctx, Key(1), 0))
	wantNoOwner(t, s, Key(1))

	rev := mustCreate(t, s, Key(2), owner(2))
	_, err = s.Update(ctx, Key(2), owner(3), 0)
	wantConflict(t, "update of a live key at revision 0", err)
	wantConflict(t, "delete of a live key at revision 0", s.Delete(ctx, Key(2), 0))
	wantEntry(t, s, Key(2), owner(2), rev)
}

// testRevisionOfAnotherKey: a revision is an entry's, not a counter; the
// current revision of one key never passes for another's.
func testRevisionOfAnotherKey(t *testing.T, s ownership.Store) {
	ctx := context.Background()
	r1 := mustCreate(t, s, Key(1), owner(1))
	r2 := mustCreate(t, s, Key(2), owner(2))
	_, err := s.Update(ctx, Key(1), owner(3), r2)
	wantConflict(t, "update of key 1 at key 2's revision", err)
	wantConflict(t, "delete of key 2 at key 1's revision", s.Delete(ctx, Key(2), r1))
	wantEntry(t, s, Key(1), owner(1), r1)
	wantEntry(t, s, Key(2), owner(2), r2)
}

func testDeleteAtRevision(t *testing.T, s ownership.Store) {
	rev := mustCreate(t, s, Key(1), owner(1))
	next := mustUpdate(t, s, Key(1), owner(2), rev)
	if err := s.Delete(context.Background(), Key(1), next); err != nil {
		t.Fatalf("delete at the current revision: %v", err)
	}
	wantNoOwner(t, s, Key(1))
	wantConflict(t, "second delete", s.Delete(context.Background(), Key(1), next))
	wantNoOwner(t, s, Key(1))
}

func testDeleteStale(t *testing.T, s ownership.Store) {
	rev := mustCreate(t, s, Key(1), owner(1))
	next := mustUpdate(t, s, Key(1), owner(2), rev)
	wantConflict(t, "delete at the revision before the last", s.Delete(context.Background(), Key(1), rev))
	wantEntry(t, s, Key(1), owner(2), next)
}

// testCreateAfterDelete: a deleted key can be created again, once; the
// revisions of its earlier life are stale for the new one (no ABA).
func testCreateAfterDelete(t *testing.T, s ownership.Store) {
	ctx := context.Background()
	first := mustCreate(t, s, Key(1), owner(1))
	if err := s.Delete(ctx, Key(1), first); err != nil {
		t.Fatalf("delete: %v", err)
	}
	again := mustCreate(t, s, Key(1), owner(2))
	if again <= first {
		t.Fatalf("create after delete: revision %d, want one greater than the first life's %d", again, first)
	}
	_, err := s.Create(ctx, Key(1), owner(3))
	wantConflict(t, "second create after delete", err)
	_, err = s.Update(ctx, Key(1), owner(3), first)
	wantConflict(t, "update at the first life's revision", err)
	wantConflict(t, "delete at the first life's revision", s.Delete(ctx, Key(1), first))
	wantEntry(t, s, Key(1), owner(2), again)
}

// testRevisionsGrow: every write returns a revision greater than every
// earlier one, whichever key it was for.
func testRevisionsGrow(t *testing.T, s ownership.Store) {
	ctx := context.Background()
	var last uint64
	revs := map[string]uint64{}
	for i := range 12 {
		k := Key(i % 3)
		var rev uint64
		var err error
		if r, ok := revs[k]; ok {
			if i%4 == 3 {
				if err := s.Delete(ctx, k, r); err != nil {
					t.Fatalf("delete %s: %v", k, err)
				}
				delete(revs, k)
				continue
			}
			rev, err = s.Update(ctx, k, owner(i), r)
		} else {
			rev, err = s.Create(ctx, k, owner(i))
		}
		if err != nil {
			t.Fatalf("write %d to %s: %v", i, k, err)
		}
		if rev <= last {
			t.Fatalf("write %d to %s: revision %d, not greater than the last one %d", i, k, rev, last)
		}
		last, revs[k] = rev, rev
	}
}

func testReturnedOwnerIsACopy(t *testing.T, s ownership.Store) {
	o := owner(1)
	rev := mustCreate(t, s, Key(1), o)
	o.Viewers[0].Conn = 99 // the caller's slice, after Create
	got, _, err := s.Get(context.Background(), Key(1))
	if err != nil {
		t.Fatal(err)
	}
	got.Viewers[0].Conn = 98 // the returned slice
	wantEntry(t, s, Key(1), owner(1), rev)
}
