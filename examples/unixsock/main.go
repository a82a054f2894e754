// Command unixsock is an example third-party tether transport plugin: the
// host's JSON-RPC session protocol over a Unix socket, one message per
// line (see package transport and README.md). Run it with
//
//	go build -o /tmp/unixsock ./examples/unixsock
//	tether serve --listen unix:/tmp/tether.sock --plugin transport=/tmp/unixsock#$(sha256sum /tmp/unixsock | cut -d' ' -f1)
package main

import (
	"os"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/examples/unixsock/transport"
)

func main() {
	// Logs are JSON on stderr: stdout carries go-plugin's handshake, and
	// the host re-emits these lines with a plugin field.
	log := zerolog.New(os.Stderr).With().Timestamp().Logger()
	contract.ServeTransport(transport.New(log))
}
