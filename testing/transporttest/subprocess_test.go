package transporttest_test

import (
	"testing"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/internal/kitcheck"
	"github.com/tether-agent/tether/testing/transporttest"
)

// TestPluginWS runs the kit against the real `tether plugin ws`
// subprocess, one process per check: as the host starts it, with its
// link on the data plane, and with its link over gRPC.
func TestPluginWS(t *testing.T) {
	bin := e2e.Build(t) // once per test binary
	t.Run("data-plane", func(t *testing.T) {
		transporttest.Run(t, func(t *testing.T) contract.Transport {
			tc := kitcheck.StartTransportWithDataPlane(t, kitcheck.PluginCmd(bin, "ws"))
			t.Cleanup(func() {
				if got := tc.DataPlane(); got != contract.DataPlaneProtocol && !t.Failed() {
					t.Errorf("the plugin's link ran on %q, want the data plane %q", got, contract.DataPlaneProtocol)
				}
			})
			return tc
		})
	})
	t.Run("grpc", func(t *testing.T) {
		transporttest.Run(t, func(t *testing.T) contract.Transport {
			return kitcheck.StartPlugin[*contract.TransportGRPCClient](t, kitcheck.PluginCmd(bin, "ws"), contract.KindTransport)
		})
	})
}
