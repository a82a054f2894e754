package cluster

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
	"github.com/rs/zerolog"
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
		host, port, err := hostPort(tt.addr)
		if (err != nil) != tt.hasError || err == nil && (host != tt.host || port != tt.port) {
			t.Errorf("hostPort(%q) = %q, %d, %v; want %q, %d, error %v", tt.addr, host, port, err, tt.host, tt.port, tt.hasError)
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
		u, err := routeURL(tt.route)
		got := ""
		if err == nil {
			got = (&url.URL{Scheme: u.Scheme, Host: u.Host}).String()
		}
		if got != tt.want {
			t.Errorf("routeURL(%q) = %q, %v; want %q", tt.route, got, err, tt.want)
		}
	}
}

// TestStartEmbedded: a free port of its own (never nats-server's default
// 4222 for port 0), no route listener when alone, and a Shutdown that can
// be called twice.
func TestStartEmbedded(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	a := startServer(t)
	b, err := StartEmbedded(ctx, EmbeddedConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir(), Log: zerolog.Nop()})
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
	nc, js := connect(t, b.ClientURL())
	openOwners(t, js, KVConfig{})
	nc.Close()
	b.Shutdown()
	b.Shutdown()
}

func TestStartEmbeddedErrors(t *testing.T) {
	ctx := t.Context()
	if _, err := StartEmbedded(ctx, EmbeddedConfig{}); err == nil {
		t.Error("no store directory: started")
	}
	if _, err := StartEmbedded(ctx, EmbeddedConfig{StoreDir: t.TempDir(), Listen: "nowhere"}); err == nil {
		t.Error("listen address without a port: started")
	}
	if _, err := StartEmbedded(ctx, EmbeddedConfig{StoreDir: t.TempDir(), ClusterListen: "127.0.0.1:0", Routes: []string{"not a route"}, Secret: testSecret}); err == nil {
		t.Error("bad route: started")
	}
	// A port another server holds: refused at once, not at the deadline
	// (TestStartEmbeddedPortInUse has more).
	a := startServer(t)
	e, err := StartEmbedded(ctx, EmbeddedConfig{StoreDir: t.TempDir(), Listen: a.Server().Addr().String(), Log: zerolog.Nop()})
	if !errors.Is(err, ErrStartFailed) {
		if e != nil {
			e.Shutdown()
		}
		t.Fatalf("listen on a port in use: %v, want ErrStartFailed", err)
	}
}

// TestStartEmbeddedPortInUse: a client or route address another process
// listens on fails the start at once (not at the context's end) with a
// ListenError that names it and is EADDRINUSE; nats-server's own fatal
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
		cfg    EmbeddedConfig
	}{
		{"client port", false, EmbeddedConfig{Listen: addr}},
		{"route port", true, EmbeddedConfig{Name: "n0", ClusterListen: addr, Routes: []string{addr}, Secret: testSecret}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			tt.cfg.StoreDir = t.TempDir()
			tt.cfg.Log = zerolog.New(&logs).Level(zerolog.InfoLevel)
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			began := time.Now()
			e, err := StartEmbedded(ctx, tt.cfg)
			took := time.Since(began)
			if err == nil {
				e.Shutdown()
				t.Fatalf("started on %s, which another listener has", addr)
			}
			var le *ListenError
			if !errors.As(err, &le) || le.Routes != tt.routes || le.Addr != addr || !errors.Is(err, syscall.EADDRINUSE) || !errors.Is(err, ErrStartFailed) {
				t.Errorf("got %v (%#v), want a ListenError for %s (routes %v), EADDRINUSE", err, le, addr, tt.routes)
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
