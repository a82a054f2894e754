package transport_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/examples/unixsock/transport"
	"github.com/tether-agent/tether/testing/transporttest"
)

// TestConformance runs the transport conformance kit with the kit's
// Dialer of this line protocol. The transport carries text lines only
// and does not ping.
func TestConformance(t *testing.T) {
	transporttest.Run(t,
		func(t *testing.T) contract.Transport {
			return transport.New(zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel))
		},
		transporttest.WithListen(func(t *testing.T) string { return "unix:" + socketPath(t) }),
		transporttest.WithDialer(transporttest.LineDialer),
		transporttest.Without(transporttest.Binary|transporttest.MultilineText|transporttest.HalfOpen),
	)
}

// socketPath returns a socket path in a new directory removed at cleanup
// (t.TempDir would be too long for a socket path with subtest names).
func socketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "us")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "s.sock")
}
