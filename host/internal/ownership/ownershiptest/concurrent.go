package ownershiptest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/ownership"
	"pgregory.net/rapid"
)

// race runs fn(i) on Racers goroutines released at once and returns
// their errors.
func race(fn func(i int) error) []error {
	errs := make([]error, Racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range Racers {
		wg.Go(func() {
			<-start
			errs[i] = fn(i)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// oneWinner fails unless exactly one of errs is nil and every other is
// ErrConflict; it returns the winner's index.
func oneWinner(tb testing.TB, what string, errs []error) int {
	tb.Helper()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			tb.Fatalf("%s: racers %d and %d both won", what, winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, ownership.ErrConflict):
			tb.Fatalf("%s: racer %d: %v, want ErrConflict", what, i, err)
		}
	}
	if winner < 0 {
		tb.Fatalf("%s: no racer won: %v", what, errs)
	}
	return winner
}

func testConcurrentCreates(t *testing.T, s ownership.Store) {
	for round := range Rounds {
		k := Key(round)
		revs := make([]uint64, Racers)
		errs := race(func(i int) (err error) {
			revs[i], err = s.Create(context.Background(), k, owner(i))
			return err
		})
		w := oneWinner(t, fmt.Sprintf("round %d: create", round), errs)
		wantEntry(t, s, k, owner(w), revs[w])
	}
}

// testConcurrentCreatesAfterDelete: a deleted key raced by several
// creators gets exactly one owner, round after round (a store that keeps
// a tombstone must not let two creators each take it).
func testConcurrentCreatesAfterDelete(t *testing.T, s ownership.Store) {
	ctx := context.Background()
	k := Key(1)
	rev := mustCreate(t, s, k, owner(100))
	for round := range Rounds {
		if err := s.Delete(ctx, k, rev); err != nil {
			t.Fatalf("round %d: delete: %v", round, err)
		}
		revs := make([]uint64, Racers)
		errs := race(func(i int) (err error) {
			revs[i], err = s.Create(ctx, k, owner(round*Racers+i))
			return err
		})
		w := oneWinner(t, fmt.Sprintf("round %d: create after delete", round), errs)
		wantEntry(t, s, k, owner(round*Racers+w), revs[w])
		rev = revs[w]
	}
}

func testConcurrentUpdates(t *testing.T, s ownership.Store) {
	k := Key(1)
	rev := mustCreate(t, s, k, owner(100))
	for round := range Rounds {
		revs := make([]uint64, Racers)
		errs := race(func(i int) (err error) {
			revs[i], err = s.Update(context.Background(), k, owner(round*Racers+i), rev)
			return err
		})
		w := oneWinner(t, fmt.Sprintf("round %d: update", round), errs)
		wantEntry(t, s, k, owner(round*Racers+w), revs[w])
		rev = revs[w]
	}
}

// testConcurrentDeleteAndUpdate: teardowns (deletes) and binds (updates)
// racing at one revision: exactly one of them takes effect.
func testConcurrentDeleteAndUpdate(t *testing.T, s ownership.Store) {
	ctx := context.Background()
	for round := range Rounds {
		k := Key(round)
		rev := mustCreate(t, s, k, owner(100))
		revs := make([]uint64, Racers)
		errs := race(func(i int) (err error) {
			if i%2 == 0 {
				return s.Delete(ctx, k, rev)
			}
			revs[i], err = s.Update(ctx, k, owner(i), rev)
			return err
		})
		w := oneWinner(t, fmt.Sprintf("round %d: delete or update", round), errs)
		if w%2 == 0 {
			wantNoOwner(t, s, k)
		} else {
			wantEntry(t, s, k, owner(w), revs[w])
		}
	}
}

// outcome is the class of a store's answer.
type outcome string

const (
	ok       outcome = "ok"
	conflict outcome = "conflict"
	noOwner  outcome = "no owner"
)

func classify(err error) (outcome, error) {
	switch {
	case err == nil:
		return ok, nil
	case errors.Is(err, ownership.ErrConflict):
		return conflict, nil
	case errors.Is(err, ownership.ErrNoOwner):
		return noOwner, nil
	}
	return "", err
}

// side is one store of the comparison with the revisions it gave.
type side struct {
	s    ownership.Store
	revs map[string][]uint64 // by key, every revision a write returned
	last uint64              // the greatest revision returned so far
}

// testMatchesMem runs random operations on s and on a fresh Mem (one
// per rapid check; s is shared, each check using keys of its own) and
// requires the same outcome from both every time, the same entries after
// every step, and revisions that only grow. A revision is drawn by
// position (the i-th one this key's writes returned, the same on both
// sides), or is 0, or is another key's current one.
func testMatchesMem(t *testing.T, s ownership.Store) {
	ctx := context.Background()
	var instance int
	rapid.Check(t, func(rt *rapid.T) {
		instance++
		keys := make([]string, 3)
		for i := range keys {
			keys[i] = fmt.Sprintf("model%d_k%d", instance, i)
		}
		sut := &side{s: s, revs: map[string][]uint64{}}
		ref := &side{s: ownership.NewMem(), revs: map[string][]uint64{}}
		sides := []*side{sut, ref}
		names := []string{"store", "mem"}

		drawOwner := func(rt *rapid.T) ownership.Owner {
			o := ownership.Owner{
				Host:      rapid.SampledFrom([]string{"", "a", "b"}).Draw(rt, "host"),
				SessionID: fmt.Sprintf("%08x", rapid.Uint32().Draw(rt, "session")),
				Gen:       rapid.Uint64Range(0, 1<<40).Draw(rt, "gen"),
			}
			for range rapid.IntRange(0, 3).Draw(rt, "viewers") {
				o.Viewers = append(o.Viewers, contract.TransportID{
					Instance: rapid.SampledFrom([]string{"ws-1", "ws-2"}).Draw(rt, "instance"),
					Conn:     rapid.Uint64Range(1, 100).Draw(rt, "conn"),
				})
			}
			return o
		}
		// drawRev picks a revision for key, the same choice on each side.
		drawRev := func(rt *rapid.T, key string) func(sd *side) uint64 {
			n := len(ref.revs[key])
			kinds := []string{"zero", "other key"}
			if n > 0 {
				kinds = append(kinds, "returned", "returned", "returned")
			}
			switch rapid.SampledFrom(kinds).Draw(rt, "revision kind") {
			case "returned":
				i := rapid.IntRange(0, n-1).Draw(rt, "revision index")
				if rapid.Bool().Draw(rt, "latest") {
					i = n - 1
				}
				return func(sd *side) uint64 { return sd.revs[key][i] }
			case "other key":
				other := rapid.SampledFrom(keys).Draw(rt, "other key")
				return func(sd *side) uint64 {
					if other == key || len(sd.revs[other]) == 0 {
						return 0
					}
					r := sd.revs[other]
					return r[len(r)-1]
				}
			}
			return func(*side) uint64 { return 0 }
		}
		// both runs op on each side and requires one outcome.
		both := func(rt *rapid.T, what string, op func(sd *side) (uint64, error)) {
			var got [2]outcome
			var revs [2]uint64
			for i, sd := range sides {
				rev, err := op(sd)
				o, unexpected := classify(err)
				if unexpected != nil {
					rt.Fatalf("%s on %s: unexpected error %v", what, names[i], unexpected)
				}
				got[i], revs[i] = o, rev
			}
			if got[0] != got[1] {
				rt.Fatalf("%s: store says %s, mem says %s", what, got[0], got[1])
			}
			for i, sd := range sides {
				if revs[i] == 0 {
					continue
				}
				if revs[i] <= sd.last {
					rt.Fatalf("%s on %s: revision %d, not greater than the last one %d", what, names[i], revs[i], sd.last)
				}
				sd.last = revs[i]
			}
		}
		rt.Repeat(map[string]func(*rapid.T){
			"create": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				o := drawOwner(rt)
				both(rt, "create "+key, func(sd *side) (uint64, error) {
					rev, err := sd.s.Create(ctx, key, o)
					if err == nil {
						sd.revs[key] = append(sd.revs[key], rev)
					}
					return rev, err
				})
			},
			"update": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				o := drawOwner(rt)
				rev := drawRev(rt, key)
				both(rt, "update "+key, func(sd *side) (uint64, error) {
					next, err := sd.s.Update(ctx, key, o, rev(sd))
					if err == nil {
						sd.revs[key] = append(sd.revs[key], next)
					}
					return next, err
				})
			},
			"delete": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				rev := drawRev(rt, key)
				both(rt, "delete "+key, func(sd *side) (uint64, error) {
					return 0, sd.s.Delete(ctx, key, rev(sd))
				})
			},
			"": func(rt *rapid.T) {
				// After every step both sides hold the same entries, each
				// at the revision its last write returned.
				for _, key := range keys {
					var owners [2]ownership.Owner
					var got [2]outcome
					for i, sd := range sides {
						o, rev, err := sd.s.Get(ctx, key)
						c, unexpected := classify(err)
						if unexpected != nil {
							rt.Fatalf("get %s on %s: unexpected error %v", key, names[i], unexpected)
						}
						if c == ok {
							r := sd.revs[key]
							if len(r) == 0 || rev != r[len(r)-1] {
								rt.Fatalf("get %s on %s: revision %d, want the last one written %v", key, names[i], rev, r)
							}
						}
						owners[i], got[i] = o, c
					}
					if got[0] != got[1] || !Equal(owners[0], owners[1]) {
						rt.Fatalf("get %s: store %s %+v, mem %s %+v", key, got[0], owners[0], got[1], owners[1])
					}
				}
			},
		})
	})
}
