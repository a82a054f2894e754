// Package wire is the vocabulary of tether's client protocol: the
// WebSocket close codes (their one definition: transport plugins send
// them through package contract too) and the JSON-RPC error codes tether
// uses, the method and event names, the JSON-RPC envelopes and the
// results the gateway (GET /api/ws) sends, and for the PTY endpoint
// (GET /api/pty) the pty.replay header and its replay reasons, the
// resize escape, attach tokens and the query.
//
// It has no behaviour beyond encoding, decoding and validating these
// values, and imports only the standard library, so that a client, a
// server or a test written by anyone can share it. Package client is a
// Go client built on it; docs/PROTOCOL.md describes the protocol itself.
//
// Field names are exactly those the server sends. Times are Unix seconds;
// epochs and run ids are strings.
package wire
