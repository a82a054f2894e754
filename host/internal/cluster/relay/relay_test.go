package relay

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/cluster/clustertest"
	"github.com/tether-agent/tether/host/internal/cluster/owners"
	"github.com/tether-agent/tether/host/internal/link"
)

// echoEndpoint admits every connection and answers each frame with
// "echo:" + frame; a frame "close" makes it close the connection with
// 4410. It records what it saw.
type echoEndpoint struct {
	mu     sync.Mutex
	opened []contract.TransportID
	query  []string
	who    []access.Identity
	closed map[contract.TransportID]bool
}

// alice is the identity the tests' legs carry.
var alice = access.Identity{Name: "alice", Scopes: []string{"session:20261203_120000_abcdef"}, Credential: "c-1"}

type echoConn struct {
	ep  *echoEndpoint
	id  contract.TransportID
	out link.FlowSender
}

func (e *echoEndpoint) Open(o link.Opening) link.Conn {
	id, out := o.ID, o.Out
	e.mu.Lock()
	defer e.mu.Unlock()
	if o.Transport != link.RelayTransport {
		panic("relayed connection opened under transport " + o.Transport)
	}
	e.opened = append(e.opened, id)
	e.query = append(e.query, o.Event.Query)
	e.who = append(e.who, o.Who)
	out.Send(contract.Command{Kind: contract.CommandAdmit, Conn: id.Conn})
	return &echoConn{ep: e, id: id, out: out}
}

func (c *echoConn) OnFrame(data []byte, binary bool) {
	if string(data) == "close" {
		c.out.Send(contract.Command{Kind: contract.CommandClose, Conn: c.id.Conn, Code: 4410, Reason: "process exited"})
		return
	}
	c.out.Send(contract.Command{Kind: contract.CommandSend, Conn: c.id.Conn, Binary: binary, Data: append([]byte("echo:"), data...)})
}

func (c *echoConn) OnClosed() {
	c.ep.mu.Lock()
	defer c.ep.mu.Unlock()
	if c.ep.closed == nil {
		c.ep.closed = map[contract.TransportID]bool{}
	}
	c.ep.closed[c.id] = true
}

func (e *echoEndpoint) closedCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.closed)
}

// commands collects what a leg's far end sent.
type commands struct {
	mu  sync.Mutex
	got []contract.Command
	ch  chan struct{}
}

func newCommands() *commands { return &commands{ch: make(chan struct{}, 1<<16)} }

func (c *commands) on(cmd contract.Command) {
	c.mu.Lock()
	c.got = append(c.got, cmd)
	c.mu.Unlock()
	c.ch <- struct{}{}
}

// wait waits until n commands arrived and returns them.
func (c *commands) wait(tb testing.TB, n int) []contract.Command {
	tb.Helper()
	for {
		c.mu.Lock()
		if len(c.got) >= n {
			out := append([]contract.Command(nil), c.got...)
			c.mu.Unlock()
			return out
		}
		c.mu.Unlock()
		select {
		case <-c.ch:
		case <-time.After(10 * time.Second):
			tb.Fatalf("%d commands after 10 s, want %d", len(c.got), n)
		}
	}
}

// relayHost is one host of a relay test: its registry and its relay.
type relayHost struct {
	reg   *owners.Registry
	relay *Relay
}

// startRelays starts, on one server, a registry and a relay for each id
// (process instance id + "-1"), serving endpoints[id]; stopped at the end
// of t.
func startRelays(t *testing.T, ttl time.Duration, endpoints map[string]map[string]link.Endpoint, ids ...string) map[string]relayHost {
	t.Helper()
	e := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, e.ClientURL())
	bucket := clustertest.NewBucket()
	hosts := make(map[string]relayHost, len(ids))
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(t.Context(), clustertest.Timeout)
		reg, err := owners.OpenRegistry(ctx, js, owners.RegistryConfig{Bucket: bucket, Self: owners.HostInfo{ID: id, Instance: id + "-1"}, TTL: ttl, Log: zerolog.Nop()})
		cancel()
		if err != nil {
			t.Fatalf("open registry %s: %v", id, err)
		}
		t.Cleanup(func() { _ = reg.Close(context.Background()) })
		nc, _ := clustertest.Connect(t, e.ClientURL())
		r, err := New(nc, reg, endpoints[id], ttl, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		hosts[id] = relayHost{reg: reg, relay: r}
	}
	return hosts
}

// TestRelayLeg: a leg carries frames to the far endpoint and its answers
// back in order, binary flags and the query included; the leg's close
// closes the far connection; the far endpoint's close reaches the leg as
// its last command; a leg to a host with no relay fails to dial.
func TestRelayLeg(t *testing.T) {
	ep := &echoEndpoint{}
	hosts := startRelays(t, 3*time.Second, map[string]map[string]link.Endpoint{"b": {"/api/pty": ep}}, "a", "b")
	ra := hosts["a"].relay
	ctx := t.Context()

	cmds := newCommands()
	leg, err := ra.Dial(ctx, "b", "b-1", "/api/pty", "attach=x&offset=3", alice, cmds.on)
	if err != nil {
		t.Fatal(err)
	}
	const n = 500
	for i := range n {
		if err := leg.Send(fmt.Appendf(nil, "%d", i), i%2 == 0); err != nil {
			t.Fatal(err)
		}
	}
	got := cmds.wait(t, n)
	for i, c := range got[:n] {
		if want := fmt.Sprintf("echo:%d", i); c.Kind != contract.CommandSend || string(c.Data) != want || c.Binary != (i%2 == 0) {
			t.Fatalf("command %d = %v %q binary %v, want send %q binary %v", i, c.Kind, c.Data, c.Binary, want, i%2 == 0)
		}
	}
	if in, out := ra.Legs(); in != 0 || out != 1 {
		t.Errorf("a's legs in %d out %d, want 0 1", in, out)
	}
	ep.mu.Lock()
	if len(ep.opened) != 1 || ep.query[0] != "attach=x&offset=3" || ep.opened[0].Instance != link.RelayTransport+":a" {
		t.Errorf("far end opened %v with %q, want one connection of relay:a with the query", ep.opened, ep.query)
	}
	if len(ep.who) != 1 || !reflect.DeepEqual(ep.who[0], alice) {
		t.Errorf("far end opened the leg as %+v, want the identity the dialling host gave, %+v", ep.who, alice)
	}
	ep.mu.Unlock()

	// The leg's close closes the far connection.
	leg.Close()
	deadline := time.Now().Add(10 * time.Second)
	for ep.closedCount() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the far connection was not closed with its leg")
		}
		time.Sleep(10 * time.Millisecond) // polling the far end
	}

	// The far end closes a second leg: its last command is the close.
	cmds2 := newCommands()
	leg2, err := ra.Dial(ctx, "b", "b-1", "/api/pty", "", alice, cmds2.on)
	if err != nil {
		t.Fatal(err)
	}
	_ = leg2.Send([]byte("one"), false)
	_ = leg2.Send([]byte("close"), false)
	got = cmds2.wait(t, 2)
	if string(got[0].Data) != "echo:one" || got[1].Kind != contract.CommandClose || got[1].Code != 4410 {
		t.Fatalf("commands %v, want the echo then close 4410", got)
	}
	if err := leg2.Send([]byte("late"), false); err == nil {
		t.Error("a send on a leg the far end closed succeeded")
	}

	// A host with no relay: the dial fails (no responders), no leg left.
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := ra.Dial(cctx, "nobody", "x", "/api/pty", "", alice, func(contract.Command) {}); err == nil {
		t.Fatal("dial to a host with no relay succeeded")
	}
	if _, out := ra.Legs(); out != 0 {
		t.Errorf("a has %d legs out after the failed dial, want 0", out)
	}
}

// TestRelayNeedsIdentity: a leg is never opened without the client's
// identity: Dial refuses to make one, and an open published by hand
// without the header (or with a zero identity) is refused by the host
// it reaches, whose endpoint never sees it.
func TestRelayNeedsIdentity(t *testing.T) {
	ep := &echoEndpoint{}
	hosts := startRelays(t, 3*time.Second, map[string]map[string]link.Endpoint{"b": {"/api/pty": ep}}, "a", "b")
	ra := hosts["a"].relay
	if _, err := ra.Dial(t.Context(), "b", "b-1", "/api/pty", "", access.Identity{}, func(contract.Command) {}); err == nil {
		t.Fatal("Dial with no identity made a leg")
	}
	for _, who := range []string{"", "{}", "not json", `{"name":"","scopes":[]}`} {
		m := nats.NewMsg(inSubject("b"))
		m.Header.Set(hdrKind, "open")
		m.Header.Set(hdrFrom, "a")
		m.Header.Set(hdrLeg, "77")
		m.Header.Set(hdrPath, "/api/pty")
		if who != "" {
			m.Header.Set(hdrIdentity, who)
		}
		reply, err := ra.nc.RequestMsgWithContext(t.Context(), m)
		if err != nil {
			t.Fatal(err)
		}
		if string(reply.Data) != "no identity" {
			t.Errorf("open with identity %q answered %q, want \"no identity\"", who, reply.Data)
		}
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if len(ep.opened) != 0 {
		t.Errorf("the endpoint opened %v, want nothing", ep.opened)
	}
}

// TestRelayDrain: a host draining (its shutdown) closes the legs it
// serves with the code given; their far ends get it.
func TestRelayDrain(t *testing.T) {
	ep := &echoEndpoint{}
	hosts := startRelays(t, 3*time.Second, map[string]map[string]link.Endpoint{"b": {"/api/ws": ep}}, "a", "b")
	ra, rb := hosts["a"].relay, hosts["b"].relay
	cmds := newCommands()
	if _, err := ra.Dial(t.Context(), "b", "b-1", "/api/ws", "", alice, cmds.on); err != nil {
		t.Fatal(err)
	}
	rb.Close()
	got := cmds.wait(t, 1)
	if got[0].Kind != contract.CommandClose || got[0].Code != 1001 {
		t.Fatalf("after b's shutdown the leg got %v, want close 1001", got)
	}
	if ep.closedCount() != 1 {
		t.Error("b's connection of the leg was not closed")
	}
}

// TestRelaySweep: the legs of a host that left the cluster are ended on
// both sides — its connections here are closed, and the legs dialled to
// it get close 1001 "owner host gone; resume" — within the TTL and a
// sweep period.
func TestRelaySweep(t *testing.T) {
	const ttl = 600 * time.Millisecond
	epB, epC := &echoEndpoint{}, &echoEndpoint{}
	hosts := startRelays(t, ttl, map[string]map[string]link.Endpoint{"b": {"/api/ws": epB}, "c": {"/api/ws": epC}}, "a", "b", "c")
	ra, regA, regB := hosts["a"].relay, hosts["a"].reg, hosts["b"].reg
	toB := newCommands()
	if _, err := ra.Dial(t.Context(), "b", "b-1", "/api/ws", "", alice, toB.on); err != nil {
		t.Fatal(err)
	}
	if _, err := ra.Dial(t.Context(), "c", "c-1", "/api/ws", "", alice, func(contract.Command) {}); err != nil {
		t.Fatal(err)
	}

	// b stops beating (killed): a's leg to it is ended.
	start := time.Now()
	regB.Halt()
	got := toB.wait(t, 1)
	if got[0].Kind != contract.CommandClose || got[0].Code != 1001 || got[0].Reason != "owner host gone; resume" {
		t.Fatalf("leg to the gone host got %v, want close 1001 \"owner host gone; resume\"", got[0])
	}
	if took := time.Since(start); took > ttl+ttl/3+time.Second {
		t.Errorf("ended %v after b's last beat, want within ttl + a sweep", took)
	}

	// a stops beating: c closes the connection a's leg made there.
	regA.Halt()
	deadline := time.Now().Add(10 * ttl)
	for epC.closedCount() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("c kept the connection of a host that left")
		}
		time.Sleep(10 * time.Millisecond) // polling the sweep
	}
}
