// Package clustertest starts the NATS servers the cluster's tests run
// against (one embedded server, a routed JetStream cluster of them, or a
// plain nats-server with its own authorization) and connects to them,
// each shut down and closed at the end of the test that asked.
package clustertest

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/cluster/embedded"
)

// Timeout bounds what a test waits for from a server (a cluster forming,
// a leader elected after a node is lost).
const Timeout = 30 * time.Second

// Secret is the shared secret of the servers StartCluster routes.
var Secret = []byte("a test cluster's secret, 32 bytes or more")

// StartServer starts a single embedded server for tb, shut down at its
// end, and waits for its JetStream.
func StartServer(tb testing.TB) *embedded.Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	e, err := embedded.Start(ctx, embedded.Config{StoreDir: tb.TempDir(), Log: zerolog.Nop()})
	if err != nil {
		tb.Fatalf("start server: %v", err)
	}
	tb.Cleanup(e.Shutdown)
	if err := e.WaitJetStream(ctx); err != nil {
		tb.Fatal(err)
	}
	return e
}

// StartPlain starts a plain nats-server (no JetStream unless adjust asks
// for it) for tb with the options adjust sets, shut down at its end, and
// returns its client URL.
func StartPlain(tb testing.TB, adjust func(*server.Options)) string {
	tb.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true}
	adjust(opts)
	srv, err := server.NewServer(opts)
	if err != nil {
		tb.Fatal(err)
	}
	srv.Start()
	tb.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	if !srv.ReadyForConnections(Timeout) {
		tb.Fatal("server not ready")
	}
	return srv.ClientURL()
}

// Connect opens a client connection to url for tb, closed at its end.
func Connect(tb testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		tb.Fatalf("connect %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// ConnectNode connects to e's client port (TCP) with e's client
// credentials, as a host of an external cluster would.
func ConnectNode(tb testing.TB, e *embedded.Server, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	return Connect(tb, e.ClientURL(), append(e.ClientOptions(), opts...)...)
}

var bucketSeq atomic.Int64

// NewBucket returns a bucket name no other test of this process uses.
func NewBucket() string { return fmt.Sprint("test_", bucketSeq.Add(1)) }

// FreePorts returns n distinct ports that were free a moment ago. A
// JetStream cluster needs every server's route address in its
// configuration before it starts, so route ports cannot be the servers'
// own picks.
func FreePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports := make([]int, n)
	ls := make([]net.Listener, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		ls[i], ports[i] = l, l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}

// StartCluster starts n routed embedded servers with JetStream and one
// secret (Secret), and waits until each follows the cluster's meta
// leader. ConnectNode connects to one.
func StartCluster(tb testing.TB, n int) []*embedded.Server {
	tb.Helper()
	return StartClusterWith(tb, n, nil)
}

// StartClusterWith is StartCluster with adjust changing server i's
// configuration first.
func StartClusterWith(tb testing.TB, n int, adjust func(i int, cfg *embedded.Config)) []*embedded.Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	ports := FreePorts(tb, n)
	routes := make([]string, n)
	for i, p := range ports {
		routes[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	nodes := make([]*embedded.Server, n)
	for i := range n {
		cfg := embedded.Config{
			Name:          fmt.Sprint("n", i),
			StoreDir:      tb.TempDir(),
			ClusterListen: routes[i],
			Routes:        routes,
			Secret:        Secret,
			Log:           zerolog.Nop(),
		}
		if adjust != nil {
			adjust(i, &cfg)
		}
		e, err := embedded.Start(ctx, cfg)
		if err != nil {
			tb.Fatalf("start node %d: %v", i, err)
		}
		tb.Cleanup(e.Shutdown)
		nodes[i] = e
	}
	for i, e := range nodes {
		if err := e.WaitJetStream(ctx); err != nil {
			tb.Fatalf("node %d: %v", i, err)
		}
	}
	return nodes
}

// Retry waits a little before an attempt is repeated, or until ctx ends.
func Retry(ctx context.Context) {
	t := time.NewTimer(50 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
