package contract

// WebSocket close codes used by tether (SPEC §3, §6, §7, §9).
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
	CloseAbnormalNoFrame = 1006 // reported when a connection ended without a close frame
)

// JSON-RPC error codes (SPEC §4, §9).
const (
	CodeParseError     = -32700 // the frame is not JSON
	CodeInvalidRequest = -32600 // not a request object, or no string method
	CodeMethodNotFound = -32601 // unknown method
	CodeInvalidParams  = -32602 // params not an object, or a field of the wrong type
	CodeInternalError  = -32603 // a bug or an unexpected failure
	CodeBusy           = -32000 // more than the allowed number of pending requests

	CodeUnknownSession  = 4001 // unknown runtime session_id; resume by stored key
	CodeSessionRequired = 4006 // session_id required
	CodeStoredNotFound  = 4007 // stored session not found, or no longer live
	CodeSessionBusy     = 4009 // a run is in flight and the call needs the session idle
	CodeResumeFailed    = 5000 // resume or create failed (agent or database)
)
