package transporttest_test

import (
	"testing"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/internal/kitcheck"
	"github.com/tether-agent/tether/testing/transporttest"
)

// TestPluginWS runs the kit against the real `tether plugin ws`
// subprocess, one process per check, as the host starts it.
func TestPluginWS(t *testing.T) {
	bin := e2e.Build(t) // once per test binary
	transporttest.Run(t, func(t *testing.T) contract.Transport {
		return kitcheck.StartPlugin[*contract.TransportGRPCClient](t, kitcheck.PluginCmd(bin, "ws"), contract.KindTransport)
	})
}
