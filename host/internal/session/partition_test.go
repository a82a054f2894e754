package session

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/cluster/jsstore"
	"github.com/tether-agent/tether/host/internal/cluster/owners"
)

// cutProxy forwards TCP connections to a NATS server until cut: then it
// closes every connection and refuses new ones, cutting its clients off
// from the server as a network partition would.
type cutProxy struct {
	ln    net.Listener
	to    string
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newCutProxy(tb testing.TB, to string) *cutProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &cutProxy{ln: ln, to: to}
	p.wg.Go(p.accept)
	tb.Cleanup(p.cut)
	return p
}

func (p *cutProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.to)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { io.Copy(s, c); s.Close() })
		p.wg.Go(func() { io.Copy(c, s); c.Close() })
	}
}

// cut partitions: the listener and every connection are closed.
func (p *cutProxy) cut() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// clusterTable is one host of TestPartitionedHostLetsGo: a table on
// JetStream (ownership with takeover, sessions) and a registry.
type clusterTable struct {
	tbl *Table
	reg *owners.Registry
}

func newClusterTable(tb testing.TB, url, id string, ttl time.Duration, fenced chan<- struct{}) clusterTable {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	var ct clusterTable
	ct.reg, err = owners.OpenRegistry(ctx, js, owners.RegistryConfig{Bucket: "part_hosts", Self: owners.HostInfo{ID: id, Instance: id + "-1"}, TTL: ttl,
		OnFenced: func() {
			go func() { // as the host does: off the heartbeat
				ct.tbl.Fence()
				fenced <- struct{}{}
			}()
		}, Log: zerolog.Nop()})
	if err != nil {
		tb.Fatal(err)
	}
	kv, err := owners.NewKV(ctx, js, owners.KVConfig{Bucket: "part_owners"})
	if err != nil {
		tb.Fatal(err)
	}
	st, err := jsstore.Open(ctx, js, jsstore.Config{Prefix: "part"})
	if err != nil {
		tb.Fatal(err)
	}
	ct.tbl = NewTable(Config{Store: st, Agents: agent.NewEchoFactory(0), Owners: owners.NewTakeover(kv, ct.reg, zerolog.Nop()),
		Host: id, Instance: id + "-1", OwnersTimeout: ttl / 4, Log: zerolog.Nop()})
	tb.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = ct.tbl.Shutdown(sctx)
		_ = ct.reg.Close(sctx)
		st.Close()
	})
	return ct
}

// TestPartitionedHostLetsGo: host a owns a live session when it is cut
// off from NATS. It refuses binds it cannot record, and within half the
// TTL lets go of the session (fenced); host b, which sees a alive until
// a's heartbeat is a TTL old, is refused the session as held (never two
// live owners), then takes it over with its history. At no sample are
// both tables serving it.
func TestPartitionedHostLetsGo(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	srv := startNATS(t)
	proxy := newCutProxy(t, strings.TrimPrefix(srv.ClientURL(), "nats://"))
	fenced := make(chan struct{}, 4)
	a := newClusterTable(t, "nats://"+proxy.ln.Addr().String(), "a", ttl, fenced)
	b := newClusterTable(t, srv.ClientURL(), "b", ttl, make(chan struct{}, 4))
	ctx := t.Context()
	va := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}}
	var snapA Snapshot
	if err := a.tbl.Create(ctx, va, CreateOptions{ForkCount: -1}, capture(va, &snapA)); err != nil {
		t.Fatal(err)
	}
	key := snapA.SessionKey
	vb := &fakeViewer{id: contract.TransportID{Instance: "b", Conn: 1}}
	var snapB Snapshot
	if err := b.tbl.Resume(ctx, vb, key, capture(vb, &snapB)); !errors.Is(err, ErrOwnedElsewhere) {
		t.Fatalf("resume on b while a serves it: %v, want owned elsewhere", err)
	}

	cut := time.Now()
	proxy.cut()
	// a cannot record a bind: refused, not served from its memory (the
	// bind holds the session's slot meanwhile, and a lets go anyway).
	va2 := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 2}}
	if err := a.tbl.Resume(ctx, va2, key, capture(va2, &Snapshot{})); !errors.Is(err, ErrOwnersUnavailable) {
		t.Fatalf("bind on a cut off: %v, want ErrOwnersUnavailable (5002)", err)
	}
	select {
	case <-fenced:
	case <-time.After(10 * time.Second):
		t.Fatal("a never let go of its sessions")
	}
	if took := time.Since(cut); took >= ttl {
		t.Fatalf("a let go %v after the cut, not before the TTL %v when b may take over", took, ttl)
	}
	both := func() bool { return len(a.tbl.Active()) > 0 && len(b.tbl.Active()) > 0 }
	for {
		if both() {
			t.Fatal("a and b both serve the session")
		}
		err := b.tbl.Resume(ctx, vb, key, capture(vb, &snapB))
		if err == nil {
			break
		}
		if !errors.Is(err, ErrOwnedElsewhere) && !errors.Is(err, ErrStorageUnavailable) {
			t.Fatalf("resume on b after the cut: %v", err)
		}
		if time.Since(cut) > 10*ttl {
			t.Fatalf("b still refused %v after the cut: %v", time.Since(cut), err)
		}
		time.Sleep(50 * time.Millisecond) // retry backoff against a TTL clock
	}
	if took := time.Since(cut); took < ttl/2 {
		t.Errorf("b took over %v after the cut, before a's heartbeat could be a TTL old", took)
	}
	if snapB.SessionKey != key || snapB.Epoch != snapA.Epoch {
		t.Fatalf("b's session %+v, want key %s epoch %s", snapB, key, snapA.Epoch)
	}
	if both() || len(a.tbl.Active()) != 0 {
		t.Fatal("a still serves the session b took over")
	}
}
