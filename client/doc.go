// Package client is a Go client for tether's protocol: JSON-RPC sessions
// on a host's gateway (Dial) and PTY attachments with offset and epoch
// reattach (AttachPTY). It is what tether's own command line, test kits
// and benchmarks use, and a third-party program can use it the same way.
// The vocabulary — codes, names, params and results — is package wire;
// docs/PROTOCOL.md describes the protocol.
//
// A Conn waits for gateway.ready, then serves calls concurrently,
// matching each response to its call by id, and delivers the server's
// events in order on a channel (bounded: a reader that falls behind ends
// the connection with ErrEventOverflow rather than losing an event) or
// to a callback. Errors the host answers are *Error values (IsCode,
// ErrorCode); the end of a connection is a *CloseError with the close
// code; a failed dial is a *DialError.
//
// A PTY reads the pty.replay header first, then reads like a net.Conn,
// counting every byte it returns so that Reattach can ask the host for
// exactly what follows; Retryable says which ends are worth a reattach.
//
// The access token travels in the Authorization header, never in a URL;
// a base URL as tether serve prints it (with ?token=) is accepted and its
// token moved to the header. https:// and wss:// URLs use TLS
// (Options.TLSConfig).
package client
