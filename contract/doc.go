// Package contract is what the tether host and its plugins agree on: the
// Transport and Backend interfaces and the types they carry, transport
// identities, the error classes (mapped across gRPC so errors.Is still
// works), the go-plugin handshake and plugin map, the gRPC shims that carry
// the interfaces across the process boundary, and the Serve helpers that
// make a plugin's main a few lines, with the transport link's data plane
// (DataPlaneProtocol: its batches on a Unix socket pair, not the gRPC
// stream) negotiated at Start. The WebSocket close codes, the replay
// reasons and the JSON-RPC codes are the protocol's, defined once in
// package wire (the standard library only); the agents are the host's, in
// host/agent.
//
// It imports nothing of tether's but wire: not the host, not the plugins.
package contract
