// Package transporttest is a conformance kit for tether transport plugins:
// it checks, from the outside and through real client connections, that an
// implementation of contract.Transport keeps the contract the host relies
// on (connection identities, event order, admission, close codes, bounded
// send queues, liveness, Stop). Call Run from a test of your own, like
// testing/fstest.TestFS or golang.org/x/net/nettest.TestConn:
//
//	package mytransport_test
//
//	import (
//		"testing"
//
//		"github.com/tether-agent/tether/contract"
//		"github.com/tether-agent/tether/testing/transporttest"
//
//		"example.com/mytransport"
//	)
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, func(t *testing.T) contract.Transport {
//			return mytransport.New()
//		})
//	}
//
// Each check is a named subtest (go test -run 'TestConformance/Stop' runs
// one) with a transport of its own, started on "127.0.0.1:0" and linked to
// the kit's event sink, which checks every event as it arrives.
//
// # Transports that are not WebSocket
//
// The kit's clients come from a Dialer; the default, WebSocketDialer,
// speaks WebSocket (github.com/gobwas/ws). A transport with another wire
// protocol supplies its own Dialer, whose ClientConn can send a data
// message, receive messages and the close code, close with a code, and
// drop the connection abruptly, and tells the kit which capabilities it
// lacks. LineDialer is such a Dialer, for the line protocol of tether's
// example transports (one text message per line over a Unix socket or
// TCP):
//
//	transporttest.Run(t, newTransport,
//		transporttest.WithListen(func(t *testing.T) string { return "unix:" + socketPath(t) }),
//		transporttest.WithDialer(transporttest.LineDialer),
//		transporttest.Without(transporttest.Binary|transporttest.MultilineText|transporttest.HalfOpen),
//	)
//
// examples/unixsock (in Go) and examples/node-transport (in Node.js) in
// the tether repository are such transports; dialer.go and lines.go show
// how to write a Dialer of your own.
//
// # Over go-plugin
//
// The kit only needs a contract.Transport, so the same checks run against
// the host's gRPC client of a plugin: in memory with
// plugin.TestPluginGRPCConn and contract.TransportPlugin, or against the
// real plugin binary started with plugin.NewClient (contract.Handshake,
// contract.PluginMap(), AllowedProtocols gRPC) and dispensed as
// contract.KindTransport. Start a new client (a new process) in each call
// of newTransport, and Kill it in a t.Cleanup.
//
// # Timing
//
// The kit never sleeps to synchronise: it waits for events, each wait
// bounded by 10 s. A whole run takes a few seconds; HalfOpen and
// Backpressure are the slowest checks (a second or two each).
package transporttest
