// Package transportkit is the plumbing a tether transport plugin needs
// besides its wire format, so that a plugin author writes only that.
//
// A Queue is a transport's events on their way to the host: ordered,
// batched while the host is busy, bounded in bytes with back-pressure on
// the readers that push frames, kept across links when a delivery fails,
// one link at a time (contract.ErrAlreadyLinked). It also runs the
// transport's Stop once and makes Link return after Stop has delivered
// every last Closed. tether's WebSocket transport (plugins/ws) uses it
// with connections of its own.
//
// A Stream is a whole contract.Transport for connections over a stream
// listener — a Unix socket, TCP — given a Protocol that says how a
// connection opens and how a message and a close look on the wire:
// connection ids, admission, Frames after admission only, bounded send
// queues that close a slow peer with 1013, closes after what was
// queued, exactly one Closed per connection, Stop. examples/unixsock is
// a Stream with one JSON message per line:
//
//	func New(log zerolog.Logger) *transportkit.Stream {
//		return transportkit.NewStream(transportkit.StreamConfig{
//			Protocol: lines{}, Version: Version, Log: log,
//		})
//	}
//
// and its plugin's main is contract.ServeTransport(transport.New(log)).
// Check either kind with the conformance kit, testing/transporttest.
//
// The package imports nothing of tether's but contract.
package transportkit
