package session

import "errors"

// Session table errors. Test for them with errors.Is.
var (
	// ErrUnknownSession: no live session has that runtime id.
	ErrUnknownSession = errors.New("unknown session")
	// ErrStoredNotFound: no stored session has that key or title.
	ErrStoredNotFound = errors.New("stored session not found")
	// ErrNoLongerLive: the session was released while the call waited.
	ErrNoLongerLive = errors.New("session no longer live; retry resume")
	// ErrSessionBusy: a run is in flight and the call needs the session idle.
	ErrSessionBusy = errors.New("session busy")
	// ErrBuildFailed: the agent or the database failed while building a
	// live session.
	ErrBuildFailed = errors.New("resume or create failed")
	// ErrTableClosed: the table is shutting down.
	ErrTableClosed = errors.New("session table closed")
	// ErrLiveCap: the live-session cap is reached and no session can be
	// evicted (every one has a viewer or a run).
	ErrLiveCap = errors.New("live session cap reached")
	// ErrOwnedElsewhere: the ownership store records another owner for
	// the key (another host's live session).
	ErrOwnedElsewhere = errors.New("session owned elsewhere")
	// ErrStorageUnavailable: the database cannot be written (disk full,
	// I/O error, read-only file system), so a call that must write was
	// refused; reads keep working.
	ErrStorageUnavailable = errors.New("storage unavailable")
	// ErrOwnersUnavailable: the ownership store could not be reached, so
	// a bind could not be recorded and was refused.
	ErrOwnersUnavailable = errors.New("ownership store unavailable")
	// ErrStoreUnreachable: a store shared by a cluster's hosts did not
	// answer a resume (store.ErrUnreachable: its servers are electing
	// new leaders, e.g. after one went away with its host), so nothing
	// was bound. Retried like an owner that cannot be reached.
	ErrStoreUnreachable = errors.New("cluster store unreachable")
)
