package wire

// WebSocket close codes tether sends (a transport plugin too, through
// package contract), and the two a client or transport reports for
// itself (CloseNoStatus, CloseAbnormal: RFC 6455 forbids sending them).
const (
	CloseNormal         = 1000 // normal closure; a client detaching
	CloseGoingAway      = 1001 // the host is shutting down: reconnect
	CloseProtocolError  = 1002 // malformed WebSocket framing
	CloseNoStatus       = 1005 // reported: a close frame without a code
	CloseAbnormal       = 1006 // reported: the connection ended without a close frame
	CloseInvalidPayload = 1007 // invalid UTF-8 in a text frame
	CloseTooBig         = 1009 // a frame or message larger than the limit
	CloseInternalError  = 1011 // server error, e.g. every PTY attached at --pty-max-sessions
	CloseServiceRestart = 1012 // a transport plugin was swapped or unloaded: reconnect
	CloseTryAgainLater  = 1013 // the client was too slow to take its output: reconnect
	CloseBadRequest     = 4400 // malformed attach token or offset on /api/pty
	CloseUnauthorized   = 4401 // missing or wrong access token
	CloseForbidden      = 4403 // Host or Origin not accepted
	CloseNotFound       = 4404 // the endpoint is switched off
	CloseNotLoopback    = 4408 // a non-loopback peer on a loopback listener
	CloseSuperseded     = 4409 // another writer attached the PTY's token
	CloseProcessExited  = 4410 // the PTY's process exited, after its last bytes
	CloseNoSuchTerminal = 4411 // view=1 with a token that has no live PTY
)

// Reconnectable reports whether a connection closed with code should be
// made again, with backoff (and, for a PTY, with its offset and epoch):
// the host is restarting, the connection was lost, a transport was
// swapped or the client fell behind. Every other code is an answer that
// a retry would only repeat.
func Reconnectable(code int) bool {
	switch code {
	case CloseGoingAway, CloseAbnormal, CloseServiceRestart, CloseTryAgainLater:
		return true
	}
	return false
}

// JSON-RPC error codes of the gateway: the standard ones, then tether's.
const (
	CodeParseError     = -32700 // the frame is not JSON (the response's id is null)
	CodeInvalidRequest = -32600 // not a request object, or no string method
	CodeMethodNotFound = -32601 // unknown method
	CodeInvalidParams  = -32602 // params not an object, or a field of the wrong type
	CodeInternalError  = -32603 // a bug or an unexpected failure
	CodeBusy           = -32000 // too many requests pending on one socket

	CodeUnknownSession     = 4001 // unknown runtime session_id: resume by stored key
	CodeSessionRequired    = 4006 // session_id missing or empty
	CodeStoredNotFound     = 4007 // stored session not found, or no longer live: retry resume
	CodeSessionBusy        = 4009 // a run is in flight and the call needs the session idle
	CodeForbidden          = 4030 // the call is outside the credential's scope: nothing was changed
	CodeAlreadyResolved    = 4090 // a permission request was already answered
	CodeResumeFailed       = 5000 // create or resume failed (the agent or the database)
	CodeTurnFailed         = 5001 // an agent's turn failed (data.reason says why)
	CodeOwnerUnreachable   = 5002 // the session's owner host cannot be reached: retry
	CodeStorageUnavailable = 5003 // a call that must write found the storage failing
)

// RetryData is the data of a 5003 answered for an overload (a burst of
// writes queued ahead of the call's): nothing of the call was written,
// and asking again after RetryAfterMS milliseconds is the remedy. A
// 5003 for a storage fault has no data.
type RetryData struct {
	RetryAfterMS int64 `json:"retry_after_ms"`
}
