package ws_test

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/hashicorp/go-plugin"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
	"github.com/tether-agent/tether/testing/transporttest"
)

// TestConformance runs the transport conformance kit against the Server
// in-process, and through the gRPC contract shims in memory. (The real
// `tether plugin ws` subprocess is checked in testing/transporttest.)
func TestConformance(t *testing.T) {
	t.Run("in-process", func(t *testing.T) {
		transporttest.Run(t, func(t *testing.T) contract.Transport {
			return ws.New(testLogger(t))
		})
	})
	t.Run("grpc-data-plane", func(t *testing.T) {
		transporttest.Run(t, func(t *testing.T) contract.Transport {
			tr := grpcShim(t)
			host, pf, err := contract.NewDataPlanePair()
			if err != nil {
				t.Fatalf("NewDataPlanePair: %v", err)
			}
			fd, err := syscall.Dup(int(pf.Fd())) // the plugin side takes it over at Start
			pf.Close()
			if err != nil {
				t.Fatalf("dup: %v", err)
			}
			tr.OfferDataPlane(host, fmt.Sprintf("fd:%d", fd))
			return tr
		})
	})
	t.Run("grpc", func(t *testing.T) {
		transporttest.Run(t, func(t *testing.T) contract.Transport { return grpcShim(t) })
	})
}

// grpcShim serves a ws.Server through the gRPC contract shims in memory
// and returns the host's client of it.
func grpcShim(t *testing.T) *contract.TransportGRPCClient {
	t.Helper()
	client, server := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		contract.KindTransport: &contract.TransportPlugin{Impl: ws.New(testLogger(t))},
	})
	// As go-plugin's own tests do: stop the server, then close the
	// client. The kit's own cleanup (Stop, then waiting for Link) runs
	// before both.
	t.Cleanup(func() { _ = client.Close() })
	t.Cleanup(server.Stop)
	raw, err := client.Dispense(contract.KindTransport)
	if err != nil {
		t.Fatalf("Dispense: %v", err)
	}
	tr, ok := raw.(*contract.TransportGRPCClient)
	if !ok {
		t.Fatalf("Dispense: got %T, want *contract.TransportGRPCClient", raw)
	}
	return tr
}
