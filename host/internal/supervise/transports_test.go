package supervise

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"testing"

	"pgregory.net/rapid"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/host/store"
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
	tbl := newTestTable(t)
	ctx := context.Background()
	ids := newInstanceIDs() // one per host, shared by every transport
	names := []string{"ws", "unix"}
	type proc struct {
		instance string
		next     uint64 // the process's connection counter
	}
	rapid.Check(t, func(rt *rapid.T) {
		procs := map[string]*proc{}
		start := func(name string) { procs[name] = &proc{instance: ids.next(name)} }
		for _, n := range names {
			start(n)
		}
		issued := map[contract.TransportID]bool{}
		open := map[contract.TransportID]*conn{} // connections not yet gone
		var dead []*conn                         // connections whose teardown already ran
		var sessions []string                    // live runtime ids, creation order
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
			tbl.Detach(id, c.bindings())
			delete(open, id)
			dead = append(dead, c)
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
				c := &conn{v: &fakeViewer{id: id, transport: name}, sess: map[string]session.Binding{}}
				open[id] = c
				if len(sessions) == 0 || rapid.Bool().Draw(rt, "create") {
					var snap session.Snapshot
					if err := tbl.Create(ctx, c.v, session.CreateOptions{ForkCount: -1}, c.capture(&snap)); err != nil {
						rt.Fatalf("create: %v", err)
					}
					sessions = append(sessions, snap.SessionID)
					return
				}
				sid := rapid.SampledFrom(sessions).Draw(rt, "session")
				var snap session.Snapshot
				if err := tbl.Activate(ctx, c.v, sid, c.capture(&snap)); err != nil {
					rt.Fatalf("activate %s: %v", sid, err)
				}
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
				c := rapid.SampledFrom(dead).Draw(rt, "dead connection")
				tbl.Detach(c.v.id, c.bindings())
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
	tbl := newTestTable(t)
	ctx := context.Background()
	ids := newInstanceIDs()
	v0 := &fakeViewer{id: contract.TransportID{Instance: "seed", Conn: 1}, transport: "fake"}
	var snap session.Snapshot
	var none session.Binding
	if err := tbl.Create(ctx, v0, session.CreateOptions{ForkCount: -1}, capture(&snap, &none)); err != nil {
		t.Fatal(err)
	}
	seen := map[contract.TransportID]bool{}
	const perLife = 1000
	for life := 0; life < 3; life++ { // the first start and two restarts
		for _, name := range []string{"ws", "unix"} {
			instance := ids.next(name)
			viewers := make([]*fakeViewer, 0, perLife)
			bindings := make([]session.Binding, 0, perLife)
			for conn := uint64(1); conn <= perLife; conn++ {
				id := contract.TransportID{Instance: instance, Conn: conn}
				if seen[id] {
					t.Fatalf("identity %v issued twice", id)
				}
				seen[id] = true
				v := &fakeViewer{id: id, transport: name}
				var s session.Snapshot
				var b session.Binding
				if err := tbl.Activate(ctx, v, snap.SessionID, capture(&s, &b)); err != nil {
					t.Fatal(err)
				}
				viewers = append(viewers, v)
				bindings = append(bindings, b)
			}
			if got := tbl.Active()[0].Transports[name]; got != perLife {
				t.Fatalf("life %d: %d viewers on %s, want %d: identities collided in the table", life, got, name, perLife)
			}
			for i, v := range viewers { // the process dies
				tbl.Detach(v.id, bindings[i:i+1])
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

// fakeViewer is a session viewer that drops its frames.
type fakeViewer struct {
	id        contract.TransportID
	transport string
}

func (v *fakeViewer) ID() contract.TransportID  { return v.id }
func (v *fakeViewer) Transport() string         { return v.transport }
func (v *fakeViewer) Send([]byte)               {}
func (v *fakeViewer) Released(*session.Session) {}

// conn is a modelled connection: its viewer and what its binds gave it.
type conn struct {
	v    *fakeViewer
	sess map[string]session.Binding
}

func (c *conn) capture(snap *session.Snapshot) session.Reply {
	return func(b session.Binding, s session.Snapshot, _ func([]byte)) {
		*snap = s
		c.sess[s.SessionID] = b
	}
}

func (c *conn) bindings() []session.Binding {
	out := make([]session.Binding, 0, len(c.sess))
	for _, b := range c.sess {
		out = append(out, b)
	}
	return out
}

func capture(snap *session.Snapshot, b *session.Binding) session.Reply {
	return func(got session.Binding, s session.Snapshot, _ func([]byte)) { *snap, *b = s, got }
}

// newTestTable returns a table over a fresh database with echo agents
// that park sessions forever.
func newTestTable(tb testing.TB) *session.Table {
	tb.Helper()
	st, err := store.Open(context.Background(), filepath.Join(tb.TempDir(), "state.db"))
	if err != nil {
		tb.Fatalf("open store: %v", err)
	}
	tbl := session.NewTable(session.Config{Store: st, Agents: agent.NewEchoFactory(0), Log: zerolog.Nop()})
	tb.Cleanup(func() {
		if err := tbl.Shutdown(context.Background()); err != nil {
			tb.Errorf("shutdown: %v", err)
		}
		st.Close()
	})
	return tbl
}

func TestHostListens(t *testing.T) {
	tests := []struct {
		listen string
		want   bool
	}{
		{"127.0.0.1:7717", true},
		{"127.0.0.1:0", true},
		{":7717", true},
		{"localhost:7717", true},
		{"[::1]:0", true},
		{"unix:/tmp/tether.sock", false},
		{"/tmp/tether.sock", false},
		{"localhost:http", false},
		{"127.0.0.1", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := HostListens(tt.listen); got != tt.want {
			t.Errorf("HostListens(%q) = %v, want %v", tt.listen, got, tt.want)
		}
	}
}
