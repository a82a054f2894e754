package contract

import "errors"

// Error classes shared by the host and plugins. They survive the gRPC
// boundary: see ToGRPC and FromGRPC.
var (
	// ErrInvalidArgument: a request was malformed.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotFound: the thing named does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyLinked: a transport already has a running link.
	ErrAlreadyLinked = errors.New("transport already linked")
	// ErrNotStarted: the plugin was used before Start.
	ErrNotStarted = errors.New("plugin not started")
	// ErrStopped: the plugin has been stopped.
	ErrStopped = errors.New("plugin stopped")
	// ErrStaleTransport: the caller's transport identity no longer owns
	// the thing it tried to change.
	ErrStaleTransport = errors.New("stale transport")
	// ErrPluginExited: the plugin process is gone.
	ErrPluginExited = errors.New("plugin exited")
	// ErrUnavailable: the peer could not be reached; it may still be alive.
	ErrUnavailable = errors.New("unavailable")
)
