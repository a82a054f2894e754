package embedded_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/cluster/clustertest"
	"github.com/tether-agent/tether/host/internal/cluster/embedded"
)

func TestHostPort(t *testing.T) {
	tests := []struct {
		addr     string
		host     string
		port     int
		hasError bool
	}{
		{"127.0.0.1:0", "127.0.0.1", server.RANDOM_PORT, false},
		{"127.0.0.1:4333", "127.0.0.1", 4333, false},
		{":4333", "", 4333, false},
		{"[::1]:0", "::1", server.RANDOM_PORT, false},
		{"127.0.0.1", "", 0, true},
		{"127.0.0.1:x", "", 0, true},
		{"127.0.0.1:70000", "", 0, true},
		{"127.0.0.1:-1", "", 0, true},
	}
	for _, tt := range tests {
		host, port, err := embedded.HostPort(tt.addr)
		if (err != nil) != tt.hasError || err == nil && (host != tt.host || port != tt.port) {
			t.Errorf("embedded.HostPort(%q) = %q, %d, %v; want %q, %d, error %v", tt.addr, host, port, err, tt.host, tt.port, tt.hasError)
		}
	}
}

func TestRouteURL(t *testing.T) {
	tests := []struct {
		route, want string
	}{
		{"127.0.0.1:6222", "nats-route://127.0.0.1:6222"},
		{"nats-route://10.0.0.2:6222", "nats-route://10.0.0.2:6222"},
		{"nats://a.example:7000", "nats://a.example:7000"},
		{"nats-route://", ""},
		{"not a route", ""},
		{"10.0.0.2", ""},
		{"10.0.0.2:x", ""},
	}
	for _, tt := range tests {
		u, err := embedded.RouteURL(tt.route)
		got := ""
		if err == nil {
			got = (&url.URL{Scheme: u.Scheme, Host: u.Host}).String()
		}
		if got != tt.want {
			t.Errorf("embedded.RouteURL(%q) = %q, %v; want %q", tt.route, got, err, tt.want)
		}
	}
}

// TestStartEmbedded: a free port of its own (never nats-server's default
// 4222 for port 0), no route listener when alone, and a Shutdown that can
// be called twice.
func TestStartEmbedded(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), clustertest.Timeout)
	defer cancel()
	a := clustertest.StartServer(t)
	b, err := embedded.Start(ctx, embedded.Config{Listen: "127.0.0.1:0", StoreDir: t.TempDir(), Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	pa, pb := a.Server().Addr(), b.Server().Addr()
	if pa.String() == pb.String() {
		t.Fatalf("two servers on port 0 listen on one address, %s", pa)
	}
	u, err := url.Parse(b.ClientURL())
	if err != nil || u.Port() == "4222" || u.Port() == "0" {
		t.Fatalf("client URL %s (%v): want a free port", b.ClientURL(), err)
	}
	if a.ClusterAddr() != nil {
		t.Fatalf("a server alone has a route address %v", a.ClusterAddr())
	}
	nc, js := clustertest.Connect(t, b.ClientURL())
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "tether_sessions"}); err != nil {
		t.Fatalf("create a bucket: %v", err)
	}
	nc.Close()
	b.Shutdown()
	b.Shutdown()
}

func TestStartEmbeddedErrors(t *testing.T) {
	ctx := t.Context()
	if _, err := embedded.Start(ctx, embedded.Config{}); err == nil {
		t.Error("no store directory: started")
	}
	if _, err := embedded.Start(ctx, embedded.Config{StoreDir: t.TempDir(), Listen: "nowhere"}); err == nil {
		t.Error("listen address without a port: started")
	}
	if _, err := embedded.Start(ctx, embedded.Config{StoreDir: t.TempDir(), ClusterListen: "127.0.0.1:0", Routes: []string{"not a route"}, Secret: clustertest.Secret}); err == nil {
		t.Error("bad route: started")
	}
	// A port another server holds: refused at once, not at the deadline
	// (TestStartEmbeddedPortInUse has more).
	a := clustertest.StartServer(t)
	e, err := embedded.Start(ctx, embedded.Config{StoreDir: t.TempDir(), Listen: a.Server().Addr().String(), Log: zerolog.Nop()})
	if !errors.Is(err, embedded.ErrStartFailed) {
		if e != nil {
			e.Shutdown()
		}
		t.Fatalf("listen on a port in use: %v, want embedded.ErrStartFailed", err)
	}
}

// TestStartEmbeddedPortInUse: a client or route address another process
// listens on fails the start at once (not at the context's end) with a
// embedded.ListenError that names it and is EADDRINUSE; nats-server's own fatal
// line is not logged above debug (the caller says it, once).
func TestStartEmbeddedPortInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	tests := []struct {
		name   string
		routes bool
		cfg    embedded.Config
	}{
		{"client port", false, embedded.Config{Listen: addr}},
		{"route port", true, embedded.Config{Name: "n0", ClusterListen: addr, Routes: []string{addr}, Secret: clustertest.Secret}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			tt.cfg.StoreDir = t.TempDir()
			tt.cfg.Log = zerolog.New(&logs).Level(zerolog.InfoLevel)
			ctx, cancel := context.WithTimeout(context.Background(), clustertest.Timeout)
			defer cancel()
			began := time.Now()
			e, err := embedded.Start(ctx, tt.cfg)
			took := time.Since(began)
			if err == nil {
				e.Shutdown()
				t.Fatalf("started on %s, which another listener has", addr)
			}
			var le *embedded.ListenError
			if !errors.As(err, &le) || le.Routes != tt.routes || le.Addr != addr || !errors.Is(err, syscall.EADDRINUSE) || !errors.Is(err, embedded.ErrStartFailed) {
				t.Errorf("got %v (%#v), want a embedded.ListenError for %s (routes %v), EADDRINUSE", err, le, addr, tt.routes)
			}
			if took > 5*time.Second {
				t.Errorf("failed after %v, want at once", took)
			}
			if strings.Contains(logs.String(), "Error listening") {
				t.Errorf("nats-server's fatal line was logged above debug:\n%s", logs.String())
			}
		})
	}
}
