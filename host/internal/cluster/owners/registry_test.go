package owners

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/cluster/clustertest"
)

// openRegistry opens a registry for host id on bucket, closed at the
// end of tb.
func openRegistry(tb testing.TB, js jetstream.JetStream, bucket, id string, ttl time.Duration) *Registry {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clustertest.Timeout)
	defer cancel()
	r, err := OpenRegistry(ctx, js, RegistryConfig{Bucket: bucket, Self: HostInfo{ID: id, Instance: id + "-1"}, TTL: ttl, Log: zerolog.Nop()})
	if err != nil {
		tb.Fatalf("open registry %s: %v", id, err)
	}
	tb.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

// waitAlive polls r.Alive(host, inst) until it is want, within d.
func waitAlive(tb testing.TB, r *Registry, host, inst string, want bool, d time.Duration) time.Duration {
	tb.Helper()
	start := time.Now()
	for {
		got, err := r.Alive(context.Background(), host, inst)
		if err != nil {
			tb.Fatalf("alive %s: %v", host, err)
		}
		if got == want {
			return time.Since(start)
		}
		if time.Since(start) > d {
			tb.Fatalf("host %s alive = %v after %v, want %v", host, got, d, want)
		}
		time.Sleep(20 * time.Millisecond) // polling a clock-driven state
	}
}

// TestRegistryHeartbeats: hosts see each other alive for as long as they
// beat (past several TTLs: the watch keeps delivering), an instance that
// is not the host's running one is gone at once, a host that stops
// beating is gone after the TTL, and a host that leaves cleanly is gone
// at once.
func TestRegistryHeartbeats(t *testing.T) {
	e := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, e.ClientURL())
	bucket := clustertest.NewBucket()
	const ttl = 600 * time.Millisecond
	a := openRegistry(t, js, bucket, "a", ttl)
	b := openRegistry(t, js, bucket, "b", ttl)
	c := openRegistry(t, js, bucket, "c", ttl)

	waitAlive(t, a, "b", "b-1", true, clustertest.Timeout)
	// Three TTLs later b is still alive to a: its beats keep arriving.
	deadline := time.Now().Add(3 * ttl)
	for time.Now().Before(deadline) {
		if ok, _ := a.Alive(context.Background(), "b", "b-1"); !ok {
			t.Fatal("b, beating, was seen gone by a")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A watch that fell behind (b's entry as a saw it long ago) does not
	// make b, still beating, look gone: the bucket's leader is asked.
	a.mu.Lock()
	old := a.seen["b"]
	old.at = old.at.Add(-time.Hour)
	a.seen["b"] = old
	a.mu.Unlock()
	time.Sleep(ttl / 2) // b beats meanwhile (every ttl/3)
	if ok, err := a.Alive(context.Background(), "b", "b-1"); !ok || err != nil {
		t.Fatalf("b, beating, seen gone through a stale watch: %v %v", ok, err)
	}
	if ok, _ := a.Alive(context.Background(), "b", "b-0"); ok {
		t.Error("an old instance of b was seen alive")
	}
	if ok, _ := a.Alive(context.Background(), "nobody", "x"); ok {
		t.Error("a host never seen was alive")
	}
	hosts := a.Hosts()
	if len(hosts) != 3 || hosts[0].ID != "a" || hosts[1].ID != "b" || hosts[2].ID != "c" {
		t.Errorf("hosts = %+v, want a (self), b, c", hosts)
	}

	// b stops beating without leaving (a kill): gone after the TTL.
	close(b.stop)
	b.wg.Wait()
	took := waitAlive(t, a, "b", "b-1", false, 5*ttl)
	if took < ttl/3 {
		t.Errorf("b gone after %v, before its last beat could have aged the TTL (%v)", took, ttl)
	}
	if ok, _ := a.HostAlive(context.Background(), "b"); ok {
		t.Error("host b, not beating for a TTL, is alive")
	}
	// b starts again as a new process: its old process stays gone (its
	// live sessions died with it), the host is alive again (its PTYs are
	// still its own).
	ctx, cancel := context.WithTimeout(context.Background(), clustertest.Timeout)
	defer cancel()
	b2, err := OpenRegistry(ctx, js, RegistryConfig{Bucket: bucket, Self: HostInfo{ID: "b", Instance: "b-2"}, TTL: ttl, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b2.Close(context.Background()) }()
	if ok, err := a.HostAlive(context.Background(), "b"); !ok || err != nil {
		t.Errorf("host b, restarted, alive = %v, %v; want true", ok, err)
	}
	if ok, _ := a.Alive(context.Background(), "b", "b-1"); ok {
		t.Error("b's killed process is alive once b restarted")
	}
	if ok, _ := a.Alive(context.Background(), "b", "b-2"); !ok {
		t.Error("b's new process is not alive")
	}
	// c leaves cleanly: gone at once (its entry is deleted).
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitAlive(t, a, "c", "c-1", false, ttl/2)
}

// TestRegistryFences: a host whose heartbeat cannot be written (its
// server gone) is fenced within the TTL, and told again when it can.
func TestRegistryFences(t *testing.T) {
	e := clustertest.StartServer(t)
	_, js := clustertest.Connect(t, e.ClientURL())
	fenced := make(chan struct{}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), clustertest.Timeout)
	defer cancel()
	const ttl = 600 * time.Millisecond
	r, err := OpenRegistry(ctx, js, RegistryConfig{Bucket: clustertest.NewBucket(), Self: HostInfo{ID: "a", Instance: "a-1"}, TTL: ttl,
		OnFenced: func() { fenced <- struct{}{} }, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Its server is gone: the entry cannot be removed, and Close
		// says so within its context.
		cctx, ccancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer ccancel()
		if err := r.Close(cctx); err == nil {
			t.Error("Close removed the entry with no server")
		}
	}()
	start := time.Now()
	e.Shutdown()
	select {
	case <-fenced:
	case <-time.After(clustertest.Timeout):
		t.Fatal("not fenced with its server gone")
	}
	if took := time.Since(start); took > ttl {
		t.Errorf("fenced %v after its server went, want within the TTL %v (the others take over then)", took, ttl)
	}
	if !r.Fenced() {
		t.Error("Fenced() = false after OnFenced")
	}
}
