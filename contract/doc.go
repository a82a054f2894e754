// Package contract is what the tether host and its plugins agree on: the
// Transport and Backend interfaces and the types they carry, transport
// identities, WebSocket close codes, the error classes (mapped across gRPC
// so errors.Is still works), the go-plugin handshake and plugin map, the
// gRPC shims that carry the interfaces across the process boundary, and
// the Serve helpers that make a plugin's main a few lines. The JSON-RPC
// codes are the protocol's, in package wire; the agents are the host's,
// in host/agent.
//
// It imports nothing from the host or the plugins.
package contract
