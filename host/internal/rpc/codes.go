package rpc

import "github.com/tether-agent/tether/wire"

// JSON-RPC error codes the gateway answers with: the protocol's, from
// package wire.
const (
	CodeParseError         = wire.CodeParseError
	CodeInvalidRequest     = wire.CodeInvalidRequest
	CodeMethodNotFound     = wire.CodeMethodNotFound
	CodeInvalidParams      = wire.CodeInvalidParams
	CodeInternalError      = wire.CodeInternalError
	CodeBusy               = wire.CodeBusy
	CodeUnknownSession     = wire.CodeUnknownSession
	CodeSessionRequired    = wire.CodeSessionRequired
	CodeStoredNotFound     = wire.CodeStoredNotFound
	CodeSessionBusy        = wire.CodeSessionBusy
	CodeAlreadyResolved    = wire.CodeAlreadyResolved
	CodeResumeFailed       = wire.CodeResumeFailed
	CodeStorageUnavailable = wire.CodeStorageUnavailable
	CodeOwnerUnreachable   = wire.CodeOwnerUnreachable
)
