package session

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/ownership"
)

// testOwners is an in-memory ownership store the test can break: while
// fault is set every call fails with it, and the hooks, when set, run
// before a Create or Delete reaches the store (a hook that blocks holds
// the call).
type testOwners struct {
	*ownership.Mem

	mu       sync.Mutex // guards the fields below
	fault    error
	onCreate func()
	onDelete func()
}

var _ ownership.Store = (*testOwners)(nil)

// setFault makes every call fail with err (nil: the store works again).
func (o *testOwners) setFault(err error) {
	o.mu.Lock()
	o.fault = err
	o.mu.Unlock()
}

// now returns the fault and the hooks as they are set.
func (o *testOwners) now() (onCreate, onDelete func(), fault error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.onCreate, o.onDelete, o.fault
}

func (o *testOwners) Create(ctx context.Context, key string, ow ownership.Owner) (uint64, error) {
	hook, _, fault := o.now()
	if hook != nil {
		hook()
	}
	if fault != nil {
		return 0, fmt.Errorf("create %s: %w", key, fault)
	}
	return o.Mem.Create(ctx, key, ow)
}

func (o *testOwners) Get(ctx context.Context, key string) (ownership.Owner, uint64, error) {
	if _, _, fault := o.now(); fault != nil {
		return ownership.Owner{}, 0, fmt.Errorf("get %s: %w", key, fault)
	}
	return o.Mem.Get(ctx, key)
}

func (o *testOwners) Update(ctx context.Context, key string, ow ownership.Owner, rev uint64) (uint64, error) {
	if _, _, fault := o.now(); fault != nil {
		return 0, fmt.Errorf("update %s: %w", key, fault)
	}
	return o.Mem.Update(ctx, key, ow, rev)
}

func (o *testOwners) Delete(ctx context.Context, key string, rev uint64) error {
	_, hook, fault := o.now()
	if hook != nil {
		hook()
	}
	if fault != nil {
		return fmt.Errorf("delete %s: %w", key, fault)
	}
	return o.Mem.Delete(ctx, key, rev)
}

// TestClaimGivenBackOutsideTheLock: a create whose claim the store
// records after the table closed gives the claim back with no table lock
// held. While the store holds that Delete, Active and Lookup answer; the
// create then fails with ErrTableClosed, its agent is closed and the
// store is left empty.
func TestClaimGivenBackOutsideTheLock(t *testing.T) {
	createIn, createGo := make(chan struct{}), make(chan struct{})
	deleteIn, deleteGo := make(chan struct{}), make(chan struct{})
	createEntered := sync.OnceFunc(func() { close(createIn) })
	deleteEntered := sync.OnceFunc(func() { close(deleteIn) })
	owners := &testOwners{
		Mem:      ownership.NewMem(),
		onCreate: func() { createEntered(); <-createGo },
		onDelete: func() { deleteEntered(); <-deleteGo },
	}
	tbl, _, f := newTestTableOwners(t, 0, owners)
	ctx := context.Background()
	v := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}}
	created := make(chan error, 1)
	go func() {
		var snap Snapshot
		created <- tbl.Create(ctx, v, CreateOptions{ForkCount: -1}, capture(v, &snap))
	}()

	<-createIn // the claim is on its way to the store
	if err := tbl.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	close(createGo)
	<-deleteIn // the store holds the give-back

	answered := make(chan struct{})
	go func() {
		defer close(answered)
		tbl.Active()
		_, _ = tbl.Lookup("deadbeef")
	}()
	select {
	case <-answered:
	case <-time.After(5 * time.Second):
		t.Error("Active and Lookup blocked while the ownership store held a Delete: the give-back holds the table lock")
	}
	close(deleteGo)
	<-answered

	if err := <-created; !errors.Is(err, ErrTableClosed) {
		t.Errorf("create racing shutdown: got %v, want ErrTableClosed", err)
	}
	if n := owners.Len(); n != 0 {
		t.Errorf("ownership store has %d keys after the claim was given back, want 0", n)
	}
	if n := len(tbl.Active()); n != 0 {
		t.Errorf("table has %d live sessions, want 0", n)
	}
	f.mu.Lock()
	built, closed := f.built, f.closed
	f.mu.Unlock()
	if built != 1 || closed != 1 {
		t.Errorf("agents built %d, closed %d; want 1 and 1", built, closed)
	}
}

// TestOwnersUnavailable runs the table against an ownership store that
// cannot be reached, then recovers:
//
//   - create, a resume that must rebuild and a resume of a live session
//     fail with ErrOwnersUnavailable (rpc answers it with 5002,
//     owner unreachable; retry) and leave no new live session, binding or agent;
//   - a viewer that leaves meanwhile is still dropped locally (its
//     session parks), and the store's refusal is counted in
//     tether_owner_errors_total;
//   - once the store answers again, the next bind succeeds from the
//     revision the store last confirmed, and so do create and resume.
func TestOwnersUnavailable(t *testing.T) {
	owners := &testOwners{Mem: ownership.NewMem()}
	tbl, _, f := newTestTableOwners(t, 0, owners)
	ctx := context.Background()
	viewer := func(conn uint64) *fakeViewer {
		return &fakeViewer{id: contract.TransportID{Instance: "a", Conn: conn}}
	}
	alive := func() int {
		t.Helper()
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.built - f.closed
	}

	// One live session, and one stored (closed) session.
	first := viewer(1)
	var live Snapshot
	if err := tbl.Create(ctx, first, CreateOptions{ForkCount: -1}, capture(first, &live)); err != nil {
		t.Fatal(err)
	}
	other := viewer(2)
	var stored Snapshot
	if err := tbl.Create(ctx, other, CreateOptions{ForkCount: -1}, capture(other, &stored)); err != nil {
		t.Fatal(err)
	}
	if ok, err := tbl.Close(ctx, stored.SessionID); !ok || err != nil {
		t.Fatalf("close: %v, %v", ok, err)
	}
	baseErrors := testCounter(t, tbl.metrics.OwnerErrors)
	baseAgents := alive()

	owners.setFault(ownership.ErrUnavailable)
	late := viewer(3)
	for name, call := range map[string]func() error{
		"create": func() error {
			var sn Snapshot
			return tbl.Create(ctx, late, CreateOptions{ForkCount: -1}, capture(late, &sn))
		},
		"resume of a stored session": func() error {
			var sn Snapshot
			return tbl.Resume(ctx, late, stored.SessionKey, capture(late, &sn))
		},
		"resume of a live session": func() error {
			var sn Snapshot
			return tbl.Resume(ctx, late, live.SessionKey, capture(late, &sn))
		},
	} {
		if err := call(); !errors.Is(err, ErrOwnersUnavailable) {
			t.Errorf("%s with the store unreachable: got %v, want ErrOwnersUnavailable", name, err)
		}
	}
	active := tbl.Active()
	if len(active) != 1 || active[0].ID != live.SessionID || active[0].Viewers != 1 {
		t.Fatalf("after the refused binds: active %+v, want only %s with its one viewer", active, live.SessionID)
	}
	if b := late.binding(live.SessionID); b != nil {
		t.Errorf("the refused resume gave its viewer a binding %v", b)
	}
	if n := alive() - baseAgents; n != 0 {
		t.Errorf("the refused binds left %d agents open, want 0", n)
	}

	// The viewer leaves while the store is unreachable: the session
	// parks all the same.
	tbl.Detach(first.ID(), first.binding(live.SessionID))
	active = tbl.Active()
	if len(active) != 1 || active[0].ID != live.SessionID || active[0].Viewers != 0 {
		t.Fatalf("after the viewer left: active %+v, want %s parked with no viewer", active, live.SessionID)
	}
	if got := testCounter(t, tbl.metrics.OwnerErrors) - baseErrors; got != 1 {
		t.Errorf("tether_owner_errors_total rose by %v, want 1", got)
	}

	// The store answers again.
	owners.setFault(nil)
	var again Snapshot
	if err := tbl.Resume(ctx, late, live.SessionKey, capture(late, &again)); err != nil {
		t.Fatalf("resume of the live session after the fault: %v", err)
	}
	if again.SessionID != live.SessionID {
		t.Errorf("resume after the fault got session %s, want the live %s", again.SessionID, live.SessionID)
	}
	o, _, err := owners.Get(ctx, live.SessionKey)
	if err != nil || o.SessionID != live.SessionID || len(o.Viewers) != 1 || o.Viewers[0] != late.ID() {
		t.Errorf("owner of %s = %+v, %v; want session %s with viewer %v only", live.SessionKey, o, err, live.SessionID, late.ID())
	}
	var rebuilt, made Snapshot
	if err := tbl.Resume(ctx, late, stored.SessionKey, capture(late, &rebuilt)); err != nil {
		t.Errorf("resume of the stored session after the fault: %v", err)
	}
	if err := tbl.Create(ctx, late, CreateOptions{ForkCount: -1}, capture(late, &made)); err != nil {
		t.Errorf("create after the fault: %v", err)
	}
	if n, want := len(tbl.Active()), 3; n != want {
		t.Errorf("after the fault: %d live sessions, want %d", n, want)
	}
	if n, want := owners.Len(), 3; n != want {
		t.Errorf("after the fault: the store has %d keys, want %d", n, want)
	}
}

// TestCreateDrawsAnotherKey: two creates in one second can draw the same
// stored key (the second plus 24 random bits); the second one draws again
// instead of failing, and the agent built for the taken key is closed.
func TestCreateDrawsAnotherKey(t *testing.T) {
	tbl, st, f := newTestTable(t, time.Minute)
	keys := []string{"20261202_030000_aaaaaa", "20261202_030000_aaaaaa", "20261202_030000_aaaaaa", "20261202_030000_bbbbbb"}
	tbl.newKey = func(time.Time) string {
		k := keys[0]
		keys = keys[1:]
		return k
	}
	ctx := context.Background()
	var first, second Snapshot
	a := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}}
	b := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 2}}
	if err := tbl.Create(ctx, a, CreateOptions{}, capture(a, &first)); err != nil {
		t.Fatalf("first create: %v", err)
	}
	if err := tbl.Create(ctx, b, CreateOptions{}, capture(b, &second)); err != nil {
		t.Fatalf("second create, its key taken: %v", err)
	}
	if first.SessionKey != "20261202_030000_aaaaaa" || second.SessionKey != "20261202_030000_bbbbbb" {
		t.Errorf("keys: got %s and %s, want the drawn ones in order", first.SessionKey, second.SessionKey)
	}
	for _, k := range []string{first.SessionKey, second.SessionKey} {
		if _, err := st.GetSession(ctx, k); err != nil {
			t.Errorf("stored %s: %v", k, err)
		}
	}
	f.mu.Lock()
	built, closed := f.built, f.closed
	f.mu.Unlock()
	if built != 4 || closed != 2 {
		t.Errorf("agents: built %d, closed %d; want 4 built (one per draw) and the 2 of taken keys closed", built, closed)
	}
}
