package session

import (
	"context"
	"testing"

	"github.com/tether-agent/tether/contract"
)

// TestDecide is the funnel's decision table: every reason against the
// views that change its outcome.
func TestDecide(t *testing.T) {
	live := view{live: true, current: true}
	with := func(v view, f func(*view)) view { f(&v); return v }
	tests := []struct {
		name string
		why  Reason
		v    view
		want verdict
	}{
		{"released already: nothing", Closed, view{}, verdict{}},
		{"released already, stale disconnect: no conflict", Disconnected, view{viewer: true, viewers: 1}, verdict{}},
		{"close", Closed, with(live, func(v *view) { v.viewers, v.run = 2, true }), verdict{close: true, end: Closed}},
		{"close with a stale view", Closed, with(live, func(v *view) { v.current = false }), verdict{close: true, end: Closed}},
		{"shutdown", Shutdown, with(live, func(v *view) { v.viewers = 3 }), verdict{close: true, end: Shutdown}},
		{"idle reap of a parked idle session", IdleReap, live, verdict{close: true, end: IdleReap}},
		{"idle reap, bound since", IdleReap, with(live, func(v *view) { v.current = false }), verdict{conflict: true}},
		{"idle reap, a viewer now", IdleReap, with(live, func(v *view) { v.viewers = 1 }), verdict{conflict: true}},
		{"idle reap, running now", IdleReap, with(live, func(v *view) { v.run = true }), verdict{conflict: true}},
		{"eviction", Evicted, live, verdict{close: true, end: Evicted}},
		{"eviction, bound since", Evicted, with(live, func(v *view) { v.current = false }), verdict{conflict: true}},
		{"a viewer of several leaves", Disconnected, with(live, func(v *view) { v.viewer, v.viewers = true, 2 }), verdict{drop: true}},
		{"a stale viewer of several leaves: no conflict", Disconnected, with(live, func(v *view) { v.viewer, v.viewers, v.current = true, 2, false }), verdict{drop: true}},
		{"the last viewer leaves: parked", Disconnected, with(live, func(v *view) { v.viewer, v.viewers = true, 1 }), verdict{drop: true, park: true}},
		{"not a viewer: nothing", Disconnected, with(live, func(v *view) { v.viewers = 1 }), verdict{}},
		{"last viewer of close_on_disconnect: closed", Disconnected, with(live, func(v *view) { v.viewer, v.viewers, v.closeOnDisconnect = true, 1, true }),
			verdict{drop: true, close: true, end: Disconnected}},
		{"last viewer of close_on_disconnect, stale: parked, conflict", Disconnected,
			with(live, func(v *view) { v.viewer, v.viewers, v.closeOnDisconnect, v.current = true, 1, true, false }),
			verdict{drop: true, park: true, conflict: true}},
		{"last viewer of close_on_disconnect with a run: parked", Disconnected,
			with(live, func(v *view) { v.viewer, v.viewers, v.closeOnDisconnect, v.run = true, 1, true, true }),
			verdict{drop: true, park: true}},
		{"reap of a parked idle session", OrphanReap, live, verdict{close: true, end: OrphanReap}},
		{"stale reap timer", OrphanReap, with(live, func(v *view) { v.current = false }), verdict{conflict: true}},
		{"reap timer with a viewer", OrphanReap, with(live, func(v *view) { v.viewers = 1 }), verdict{conflict: true}},
		{"reap while a run streams: wait another grace", OrphanReap, with(live, func(v *view) { v.run = true }), verdict{reapPending: true, park: true}},
		{"reap of a stale run: interrupt it", OrphanReap, with(live, func(v *view) { v.run, v.runStale = true, true }), verdict{reapPending: true, interrupt: true}},
		{"reap of a run waiting for a permission answer: not stale", OrphanReap, with(live, func(v *view) { v.run, v.runStale, v.runAsking = true, true, true }), verdict{reapPending: true, park: true}},
		{"reap of a stale run asked to stop already", OrphanReap, with(live, func(v *view) { v.run, v.runStale, v.runInterrupted = true, true, true }), verdict{reapPending: true}},
		{"a run settles, nothing deferred", settled, live, verdict{}},
		{"a run settles: deferred close_on_disconnect", settled, with(live, func(v *view) { v.closeOnDisconnect = true }), verdict{close: true, end: Disconnected}},
		{"a run settles: deferred reap", settled, with(live, func(v *view) { v.reapPending = true }), verdict{close: true, end: OrphanReap}},
		{"a run settles, bound since", settled, with(live, func(v *view) { v.reapPending, v.current = true, false }), verdict{}},
		{"a run settles with a viewer", settled, with(live, func(v *view) { v.closeOnDisconnect, v.viewers = true, 1 }), verdict{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := decide(tt.v, tt.why); got != tt.want {
				t.Errorf("decide(%+v, %v) = %+v, want %+v", tt.v, tt.why, got, tt.want)
			}
		})
	}
}

// TestStaleDisconnectParks replays the seed race at the table: a
// close_on_disconnect session is taken over by a second socket; the first
// socket's late disconnect must only drop its own viewer, and the second
// socket's leaving later — presenting a binding older than the session's —
// parks the session instead of closing it.
func TestStaleDisconnectParks(t *testing.T) {
	tbl, _, _ := newTestTable(t, 0)
	ctx := context.Background()
	a := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}}
	b := &fakeViewer{id: contract.TransportID{Instance: "b", Conn: 1}}
	var snap Snapshot
	if err := tbl.Create(ctx, a, CreateOptions{CloseOnDisconnect: true, ForkCount: -1}, capture(a, &snap)); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Activate(ctx, b, snap.SessionID, capture(b, &snap)); err != nil {
		t.Fatal(err)
	}
	stale := b.binding(snap.SessionID)
	if err := tbl.Activate(ctx, a, snap.SessionID, capture(a, &snap)); err != nil {
		t.Fatal(err)
	}
	tbl.Detach(a.id, a.binding(snap.SessionID))
	tbl.Detach(b.id, stale)
	active := tbl.Active()
	if len(active) != 1 || active[0].Viewers != 0 {
		t.Fatalf("active = %+v, want the session parked with no viewer", active)
	}
	if got := testCounter(t, tbl.metrics.CASConflicts); got != 1 {
		t.Errorf("cas conflicts = %v, want 1 (the stale close refused)", got)
	}
}
