package pty

import (
	"testing"

	"github.com/hashicorp/go-plugin"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/testing/backendtest"
)

// TestConformance runs the backend conformance kit against the Backend
// in-process, and through the gRPC contract shims in memory. (The real
// `tether plugin pty` subprocess is checked in testing/backendtest.)
func TestConformance(t *testing.T) {
	t.Run("in-process", func(t *testing.T) {
		backendtest.Run(t, func(t *testing.T) contract.Backend {
			b := New(testLogger(t))
			t.Cleanup(b.Shutdown) // after the kit has closed every PTY
			return b
		})
	})
	t.Run("grpc", func(t *testing.T) {
		backendtest.Run(t, func(t *testing.T) contract.Backend {
			b := New(testLogger(t))
			t.Cleanup(b.Shutdown)
			client, server := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
				contract.KindBackend: &contract.BackendPlugin{Impl: b},
			})
			// As go-plugin's own tests do: stop the server, then close
			// the client; both before Shutdown.
			t.Cleanup(func() { _ = client.Close() })
			t.Cleanup(server.Stop)
			raw, err := client.Dispense(contract.KindBackend)
			if err != nil {
				t.Fatalf("Dispense: %v", err)
			}
			be, ok := raw.(*contract.BackendGRPCClient)
			if !ok {
				t.Fatalf("Dispense: got %T, want *contract.BackendGRPCClient", raw)
			}
			return be
		})
	})
}
