package session

import (
	"errors"
	"time"

	"github.com/tether-agent/tether/host/store"
)

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
	// ErrOverloaded: the store could not take a write in time (a burst
	// of them queued ahead): nothing of the call was written, and asking
	// again after RetryAfter(err) is the remedy. It is answered 5003
	// with data.retry_after_ms (docs/PROTOCOL.md, "Errors").
	ErrOverloaded = errors.New("storage overloaded")
	// ErrOwnersUnavailable: the ownership store could not be reached, so
	// a bind could not be recorded and was refused.
	ErrOwnersUnavailable = errors.New("ownership store unavailable")
	// ErrStoreUnreachable: a store shared by a cluster's hosts did not
	// answer a resume (store.ErrUnreachable: its servers are electing
	// new leaders, e.g. after one went away with its host), so nothing
	// was bound. Retried like an owner that cannot be reached.
	ErrStoreUnreachable = errors.New("cluster store unreachable")
)

// defaultRetryAfter is RetryAfter's hint for a write that ran out of
// time without the store's own hint.
const defaultRetryAfter = time.Second

// RetryAfter returns when to ask again after an ErrOverloaded: the
// store's hint (its queue at its recent pace), and whether err is one.
func RetryAfter(err error) (time.Duration, bool) {
	if !errors.Is(err, ErrOverloaded) {
		return 0, false
	}
	var oe *store.OverloadError
	if errors.As(err, &oe) && oe.RetryAfter > 0 {
		return oe.RetryAfter, true
	}
	return defaultRetryAfter, true
}
