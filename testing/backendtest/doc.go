// Package backendtest is a conformance kit for tether PTY backend plugins:
// it checks that an implementation of contract.Backend keeps the contract
// the host relies on (replay reasons, exact offsets across detach and
// reattach, the writer's compare-and-swap, read-only viewers, exit, Close,
// TTL, the session cap, resize, one Output stream), by spawning small
// /bin/sh scripts in real PTYs. Call Run from a test of your own:
//
//	package mybackend_test
//
//	import (
//		"testing"
//
//		"github.com/tether-agent/tether/contract"
//		"github.com/tether-agent/tether/testing/backendtest"
//
//		"example.com/mybackend"
//	)
//
//	func TestConformance(t *testing.T) {
//		backendtest.Run(t, func(t *testing.T) contract.Backend {
//			b := mybackend.New()
//			t.Cleanup(b.Shutdown) // runs after the kit has closed every PTY
//			return b
//		})
//	}
//
// Each check is a named subtest (go test -run 'TestConformance/Supersede'
// runs one) with a backend of its own. The kit relies on
// AttachRequest.Argv to choose each PTY's command, on /bin/sh, cat, sleep
// and stty being installed, and on the backend running on the same
// machine (it checks processes by pid).
//
// The same checks run against a backend plugin through go-plugin: in
// memory with plugin.TestPluginGRPCConn and contract.BackendPlugin, or
// against the real plugin binary started with plugin.NewClient
// (contract.Handshake, contract.PluginMap(), AllowedProtocols gRPC) and
// dispensed as contract.KindBackend, one process per call of newBackend.
//
// The kit never sleeps to synchronise: it waits for output on the stream,
// each wait bounded by 10 s (it polls only for a process's end, which
// sends no event). A whole run takes a few seconds.
package backendtest
