package cluster

import (
	"context"
	"flag"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

// modelChecks is how many random runs the model test makes unless
// -rapid.checks says otherwise: each is a few dozen round trips to the
// embedded server, and the package must stay well under a minute with
// -race on two cores.
const modelChecks = "60"

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "rapid.checks" })
	if !given {
		_ = flag.Set("rapid.checks", modelChecks)
	}
	// Every server a test starts is shut down and waited for, every
	// connection closed: nothing is left running.
	goleak.VerifyTestMain(m)
}

// testTimeout bounds what a test waits for from a server (a cluster
// forming, a leader elected after a node is lost).
const testTimeout = 30 * time.Second

// startServer starts a single embedded server for tb, shut down at its
// end.
func startServer(tb testing.TB) *Embedded {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	e, err := StartEmbedded(ctx, EmbeddedConfig{StoreDir: tb.TempDir(), Log: zerolog.Nop()})
	if err != nil {
		tb.Fatalf("start server: %v", err)
	}
	tb.Cleanup(e.Shutdown)
	if err := e.WaitJetStream(ctx); err != nil {
		tb.Fatal(err)
	}
	return e
}

// connect opens a client connection to url for tb, closed at its end.
func connect(tb testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
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

// testSecret is the shared secret of the servers startCluster routes.
var testSecret = []byte("a test cluster's secret, 32 bytes or more")

// connectNode connects to e's client port (TCP) with e's client
// credentials, as a host of an external cluster would.
func connectNode(tb testing.TB, e *Embedded, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	return connect(tb, e.ClientURL(), append([]nats.Option{nats.UserInfo(clientUser, e.clientPass)}, opts...)...)
}

var bucketSeq atomic.Int64

// newBucket returns a bucket name no other test of this process uses.
func newBucket() string { return fmt.Sprint("test_", bucketSeq.Add(1)) }

// openOwners opens a KVOwners on bucket for tb.
func openOwners(tb testing.TB, js jetstream.JetStream, cfg KVConfig) *KVOwners {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	k, err := NewKVOwners(ctx, js, cfg)
	if err != nil {
		tb.Fatalf("open owners: %v", err)
	}
	return k
}
