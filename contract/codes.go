package contract

// WebSocket close codes used by tether: what a transport closes a
// connection with. They are the protocol's (package wire has the same,
// for clients; a test keeps the two equal). The JSON-RPC codes are the
// host's and the clients' only: see package wire.
const (
	CloseNormal          = 1000 // normal closure
	CloseGoingAway       = 1001 // host shutting down
	CloseProtocolError   = 1002 // malformed WebSocket framing
	CloseInvalidPayload  = 1007 // invalid UTF-8 in a text frame
	CloseTooBig          = 1009 // frame or message larger than the limit
	CloseInternalError   = 1011 // server error, e.g. PTY registry full
	CloseServiceRestart  = 1012 // transport plugin swapped or unloaded
	CloseTryAgainLater   = 1013 // client too slow to take its output
	CloseBadRequest      = 4400 // malformed attach token or offset on /api/pty
	CloseUnauthorized    = 4401 // missing or wrong access token
	CloseForbidden       = 4403 // bad Host or Origin
	CloseNotFound        = 4404 // endpoint switched off
	CloseNotLoopback     = 4408 // non-loopback peer on a loopback listener
	CloseSuperseded      = 4409 // a newer writer took the PTY
	CloseProcessExited   = 4410 // the PTY's process exited
	CloseNoSuchTerminal  = 4411 // view=1 for an attach token with no live PTY
	CloseAbnormalNoFrame = 1006 // reported when a connection ended without a close frame
)
