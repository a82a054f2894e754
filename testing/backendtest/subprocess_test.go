package backendtest_test

import (
	"testing"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/testing/backendtest"
	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/internal/kitcheck"
)

// TestPluginPTY runs the kit against the real `tether plugin pty`
// subprocess, one process per check, as the host starts it.
func TestPluginPTY(t *testing.T) {
	bin := e2e.Build(t) // once per test binary
	backendtest.Run(t, func(t *testing.T) contract.Backend {
		return kitcheck.StartPlugin[*contract.BackendGRPCClient](t, kitcheck.PluginCmd(bin, "pty"), contract.KindBackend)
	})
}
