package owners

import (
	"context"
	"flag"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/tether-agent/tether/host/internal/cluster/clustertest"
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

// openOwners opens a KV on bucket for tb.
func openOwners(tb testing.TB, js jetstream.JetStream, cfg KVConfig) *KV {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clustertest.Timeout)
	defer cancel()
	k, err := NewKV(ctx, js, cfg)
	if err != nil {
		tb.Fatalf("open owners: %v", err)
	}
	return k
}
