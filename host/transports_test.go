package host

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"

	"pgregory.net/rapid"

	"github.com/tether-agent/tether/contract"
)

func TestCheckTransportName(t *testing.T) {
	for _, name := range []string{"unix", "ws2", "term-client", "a_b", "x"} {
		if err := CheckTransportName(name); err != nil {
			t.Errorf("CheckTransportName(%q) = %v, want nil", name, err)
		}
	}
	for name, want := range map[string]error{
		"":                                  ErrBadTransportName,
		"Unix":                              ErrBadTransportName,
		"9lives":                            ErrBadTransportName,
		"a/b":                               ErrBadTransportName,
		"../x":                              ErrBadTransportName,
		"averyveryverylongtransportname-xy": ErrBadTransportName, // 33 bytes
		"ws":                                ErrTransportExists,
		"pty":                               ErrBadTransportName,
	} {
		if err := CheckTransportName(name); !errors.Is(err, want) {
			t.Errorf("CheckTransportName(%q) = %v, want %v", name, err, want)
		}
	}
}

// TestInstanceIDsNeverRepeat makes the generator repeat itself and checks
// that the registry still never hands out an id twice.
func TestInstanceIDsNeverRepeat(t *testing.T) {
	r := newInstanceIDs()
	seq := []string{"a", "a", "b", "a", "b", "c"}
	r.gen = func() string {
		id := seq[0]
		seq = seq[1:]
		return id
	}
	got := []string{r.next("ws"), r.next("unix"), r.next("ws")}
	if fmt.Sprint(got) != "[a b c]" {
		t.Fatalf("ids = %v, want [a b c] (repeats skipped)", got)
	}
}

// TestTransportIdentitiesAcrossTransportsAndRestarts drives the table
// with connections from two transports whose processes restart, each
// process numbering its connections from 1 as real transports do, and
// checks after every step: no transport identity is ever issued twice,
// and the table's viewers per session and per transport match the
// model — in particular, a teardown from a dead process's connection
// never removes the live connection that reuses its number on the
// restarted process.
func TestTransportIdentitiesAcrossTransportsAndRestarts(t *testing.T) {
	tbl, _, _ := newTestTable(t, 0)
	ctx := context.Background()
	ids := newInstanceIDs() // one per host, shared by every transport
	names := []string{"ws", "unix"}
	type proc struct {
		instance string
		next     uint64 // the process's connection counter
	}
	type conn struct {
		v    *fakeViewer
		sess map[string]*record // sessions it is bound to
	}
	rapid.Check(t, func(rt *rapid.T) {
		procs := map[string]*proc{}
		start := func(name string) { procs[name] = &proc{instance: ids.next(name)} }
		for _, n := range names {
			start(n)
		}
		issued := map[contract.TransportID]bool{}
		open := map[contract.TransportID]*conn{} // connections not yet gone
		dead := []contract.TransportID{}         // connections whose teardown already ran
		var sessions []string                    // live runtime ids, creation order
		recOf := func(id string) *record {
			tbl.mu.Lock()
			defer tbl.mu.Unlock()
			return tbl.byID[id]
		}
		sortedOpen := func() []contract.TransportID {
			out := make([]contract.TransportID, 0, len(open))
			for id := range open {
				out = append(out, id)
			}
			sort.Slice(out, func(i, j int) bool {
				if out[i].Instance != out[j].Instance {
					return out[i].Instance < out[j].Instance
				}
				return out[i].Conn < out[j].Conn
			})
			return out
		}
		drop := func(id contract.TransportID) {
			c := open[id]
			recs := make([]*record, 0, len(c.sess))
			for _, rec := range c.sess {
				recs = append(recs, rec)
			}
			tbl.Detach(id, recs)
			delete(open, id)
			dead = append(dead, id)
		}

		rt.Repeat(map[string]func(*rapid.T){
			"connect": func(rt *rapid.T) {
				name := rapid.SampledFrom(names).Draw(rt, "transport")
				p := procs[name]
				p.next++
				id := contract.TransportID{Instance: p.instance, Conn: p.next}
				if issued[id] {
					rt.Fatalf("transport identity %v issued twice", id)
				}
				issued[id] = true
				c := &conn{v: &fakeViewer{id: id, transport: name}, sess: map[string]*record{}}
				open[id] = c
				if len(sessions) == 0 || rapid.Bool().Draw(rt, "create") {
					var snap Snapshot
					if err := tbl.Create(ctx, c.v, CreateOptions{ForkCount: -1}, capture(&snap)); err != nil {
						rt.Fatalf("create: %v", err)
					}
					sessions = append(sessions, snap.SessionID)
					c.sess[snap.SessionID] = recOf(snap.SessionID)
					return
				}
				sid := rapid.SampledFrom(sessions).Draw(rt, "session")
				var snap Snapshot
				if err := tbl.Activate(c.v, sid, capture(&snap)); err != nil {
					rt.Fatalf("activate %s: %v", sid, err)
				}
				c.sess[sid] = recOf(sid)
			},
			"drop": func(rt *rapid.T) {
				ids := sortedOpen()
				if len(ids) == 0 {
					rt.Skip("no connection")
				}
				drop(rapid.SampledFrom(ids).Draw(rt, "connection"))
			},
			"restart": func(rt *rapid.T) {
				// The process dies: its link detaches every connection;
				// a new process numbers from 1 again.
				name := rapid.SampledFrom(names).Draw(rt, "transport")
				for _, id := range sortedOpen() {
					if id.Instance == procs[name].instance {
						drop(id)
					}
				}
				start(name)
			},
			"stale teardown": func(rt *rapid.T) {
				// A teardown of a connection that is already gone, arriving
				// late (say, a dead process's close racing its restart):
				// it must not touch any live viewer.
				if len(dead) == 0 {
					rt.Skip("no dead connection")
				}
				id := rapid.SampledFrom(dead).Draw(rt, "dead connection")
				recs := make([]*record, 0, len(sessions))
				for _, sid := range sessions {
					recs = append(recs, recOf(sid))
				}
				tbl.Detach(id, recs)
			},
			"": func(rt *rapid.T) {
				want := map[string]map[string]int{} // session → transport → viewers
				for _, sid := range sessions {
					want[sid] = map[string]int{}
				}
				for _, c := range open {
					for sid := range c.sess {
						want[sid][c.v.transport]++
					}
				}
				active := tbl.Active()
				if len(active) != len(sessions) {
					rt.Fatalf("table has %d live sessions, want %d (orphan grace 0 parks forever; nothing may be removed)", len(active), len(sessions))
				}
				for _, e := range active {
					w := want[e.ID]
					total := 0
					for name, n := range w {
						if e.Transports[name] != n {
							rt.Fatalf("session %s: %d viewers on %s, want %d (transports %v)", e.ID, e.Transports[name], name, n, e.Transports)
						}
						total += n
					}
					if e.Viewers != total {
						rt.Fatalf("session %s: %d viewers, want %d", e.ID, e.Viewers, total)
					}
				}
			},
		})
		for _, sid := range sessions {
			if _, err := tbl.Close(ctx, sid); err != nil {
				rt.Fatalf("cleanup close: %v", err)
			}
		}
	})
}

// TestTransportIdentitiesThousands opens thousands of connections across
// two transports and two restarts of each, and checks that no identity
// repeats and that every one reaches the table as a viewer of its own.
func TestTransportIdentitiesThousands(t *testing.T) {
	tbl, _, _ := newTestTable(t, 0)
	ctx := context.Background()
	ids := newInstanceIDs()
	var v0 fakeViewer
	v0.id = contract.TransportID{Instance: "seed", Conn: 1}
	var snap Snapshot
	if err := tbl.Create(ctx, &v0, CreateOptions{ForkCount: -1}, capture(&snap)); err != nil {
		t.Fatal(err)
	}
	seen := map[contract.TransportID]bool{}
	const perLife = 1000
	for life := 0; life < 3; life++ { // the first start and two restarts
		for _, name := range []string{"ws", "unix"} {
			instance := ids.next(name)
			viewers := make([]*fakeViewer, 0, perLife)
			for conn := uint64(1); conn <= perLife; conn++ {
				id := contract.TransportID{Instance: instance, Conn: conn}
				if seen[id] {
					t.Fatalf("identity %v issued twice", id)
				}
				seen[id] = true
				v := &fakeViewer{id: id, transport: name}
				var s Snapshot
				if err := tbl.Activate(v, snap.SessionID, capture(&s)); err != nil {
					t.Fatal(err)
				}
				viewers = append(viewers, v)
			}
			if got := tbl.Active()[0].Transports[name]; got != perLife {
				t.Fatalf("life %d: %d viewers on %s, want %d: identities collided in the table", life, got, name, perLife)
			}
			rec, _ := tbl.Lookup(snap.SessionID)
			for _, v := range viewers { // the process dies
				tbl.Detach(v.id, []*record{rec})
			}
		}
	}
	if len(seen) != 6*perLife {
		t.Fatalf("%d identities, want %d", len(seen), 6*perLife)
	}
	if e := tbl.Active()[0]; e.Viewers != 1 || e.Transports["fake"] != 1 {
		t.Fatalf("after every connection left: %d viewers %v, want only the seed", e.Viewers, e.Transports)
	}
}
