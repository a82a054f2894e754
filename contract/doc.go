// Package contract is what the tether host and its plugins agree on: the
// Transport and Agent interfaces, transport identities, JSON-RPC error codes
// and WebSocket close codes, the go-plugin handshake and plugin map, the gRPC
// shims that carry the interfaces across the process boundary (with error
// classes mapped so errors.Is still works), and the Serve helpers that make a
// plugin's main a few lines.
//
// It imports nothing from the host or the plugins.
package contract
