package session

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
)

// testOwners is an in-memory ownership store the test can break: while
// fault is set every call fails with it, and the hooks, when set, run
// before a Create or Delete reaches the store (a hook that blocks holds
// the call).
type testOwners struct {
	*MemOwners

	mu       sync.Mutex // guards the fields below
	fault    error
	onCreate func()
	onDelete func()
}

var _ Owners = (*testOwners)(nil)

// setFault makes every call fail with err (nil: the store works again).
func (o *testOwners) setFault(err error) {
	o.mu.Lock()
	o.fault = err
	o.mu.Unlock()
}

// now returns the fault and the hooks as they are set.
func (o *testOwners) now() (fault error, onCreate, onDelete func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.fault, o.onCreate, o.onDelete
}

func (o *testOwners) Create(ctx context.Context, key string, ow Owner) (uint64, error) {
	fault, hook, _ := o.now()
	if hook != nil {
		hook()
	}
	if fault != nil {
		return 0, fmt.Errorf("create %s: %w", key, fault)
	}
	return o.MemOwners.Create(ctx, key, ow)
}

func (o *testOwners) Get(ctx context.Context, key string) (Owner, uint64, error) {
	if fault, _, _ := o.now(); fault != nil {
		return Owner{}, 0, fmt.Errorf("get %s: %w", key, fault)
	}
	return o.MemOwners.Get(ctx, key)
}

func (o *testOwners) Update(ctx context.Context, key string, ow Owner, rev uint64) (uint64, error) {
	if fault, _, _ := o.now(); fault != nil {
		return 0, fmt.Errorf("update %s: %w", key, fault)
	}
	return o.MemOwners.Update(ctx, key, ow, rev)
}

func (o *testOwners) Delete(ctx context.Context, key string, rev uint64) error {
	fault, _, hook := o.now()
	if hook != nil {
		hook()
	}
	if fault != nil {
		return fmt.Errorf("delete %s: %w", key, fault)
	}
	return o.MemOwners.Delete(ctx, key, rev)
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
		MemOwners: NewMemOwners(),
		onCreate:  func() { createEntered(); <-createGo },
		onDelete:  func() { deleteEntered(); <-deleteGo },
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
