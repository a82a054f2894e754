package rpc

// JSON-RPC error codes the gateway answers with.
const (
	CodeParseError     = -32700 // the frame is not JSON
	CodeInvalidRequest = -32600 // not a request object, or no string method
	CodeMethodNotFound = -32601 // unknown method
	CodeInvalidParams  = -32602 // params not an object, or a field of the wrong type
	CodeInternalError  = -32603 // a bug or an unexpected failure
	CodeBusy           = -32000 // more than the allowed number of pending requests

	CodeUnknownSession     = 4001 // unknown runtime session_id; resume by stored key
	CodeSessionRequired    = 4006 // session_id required
	CodeStoredNotFound     = 4007 // stored session not found, or no longer live
	CodeSessionBusy        = 4009 // a run is in flight and the call needs the session idle
	CodeResumeFailed       = 5000 // resume or create failed (agent or database)
	CodeStorageUnavailable = 5003 // a call that must write, while the database cannot be written
)
