package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/tether-agent/tether/wire"
)

var (
	// ErrClosed is in the chain of every error of a call made on a
	// connection that has ended or is being closed: errors.Is(err,
	// ErrClosed) holds for a *CloseError.
	ErrClosed = errors.New("connection closed")
	// ErrProtocol means the host sent something the protocol does not
	// allow: a first frame that is not gateway.ready or pty.replay, output
	// before the pty.replay header, a header that does not hold together.
	ErrProtocol = errors.New("protocol error")
	// ErrEventOverflow means the Events channel was full: its reader fell
	// behind by Options.EventBuffer events, and the connection was ended
	// rather than an event dropped.
	ErrEventOverflow = errors.New("events not taken: the buffer is full")
	// ErrInvalidAttachToken means an attach token is not 16–128 of
	// [A-Za-z0-9_-]; nothing was dialed.
	ErrInvalidAttachToken = errors.New("invalid attach token: want 16-128 characters of A-Z a-z 0-9 _ -")
	// ErrInvalidSize means a resize outside 1–10000 columns or rows;
	// nothing was sent.
	ErrInvalidSize = errors.New("size out of range 1-10000")
	// ErrGaveUp means a reattach's Backoff stopped before any attempt.
	ErrGaveUp = errors.New("gave up reattaching")
)

// Error is a JSON-RPC error the host answered a call with. Use errors.As
// or IsCode; the codes are wire.Code*.
type Error struct {
	Code    int
	Message string
	Data    json.RawMessage // nil when the error had none
}

func (e *Error) Error() string {
	return fmt.Sprintf("rpc error %d: %s", e.Code, e.Message)
}

// IsCode reports whether err has an *Error with code in its chain.
func IsCode(err error, code int) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// maxRetryAfter bounds RetryAfter's hint.
const maxRetryAfter = 30 * time.Second

// RetryAfter reports whether err is the host's answer that its store
// was overloaded and wrote nothing of the call (5003 with
// data.retry_after_ms), and when to ask again (at most 30 s). A 5003
// without it (a storage fault) is not one.
func RetryAfter(err error) (time.Duration, bool) {
	var e *Error
	if !errors.As(err, &e) || e.Code != wire.CodeStorageUnavailable || len(e.Data) == 0 {
		return 0, false
	}
	var d wire.RetryData
	if json.Unmarshal(e.Data, &d) != nil || d.RetryAfterMS <= 0 {
		return 0, false
	}
	return min(time.Duration(d.RetryAfterMS)*time.Millisecond, maxRetryAfter), true
}

// ErrorCode returns the code of the *Error in err's chain, or 0.
func ErrorCode(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// CloseError reports the end of a connection: the close code and reason
// the host sent, wire.CloseNoStatus for a close frame without a code, or
// wire.CloseAbnormal with Err (the read error) when it ended without a
// close frame. errors.Is(err, ErrClosed) holds for it.
type CloseError struct {
	Code   int
	Reason string
	Err    error
}

func (e *CloseError) Error() string {
	s := "connection closed with " + strconv.Itoa(e.Code)
	if e.Reason != "" {
		s += " " + strconv.Quote(e.Reason)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is makes errors.Is(err, ErrClosed) hold.
func (e *CloseError) Is(target error) bool { return target == ErrClosed }

// Unwrap returns the read error, if any.
func (e *CloseError) Unwrap() error { return e.Err }

// DialError reports that the TCP connection, TLS or the WebSocket
// handshake failed: nothing reached the protocol. Status is the HTTP
// status of a handshake the host answered with something other than 101
// (503 when it is at --max-connections), else 0.
type DialError struct {
	URL    string // the endpoint, with any token in it hidden
	Status int
	Err    error
}

func (e *DialError) Error() string { return "dial " + e.URL + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *DialError) Unwrap() error { return e.Err }

// Retryable reports whether a connection that failed with err is worth
// making again, with backoff: a dial that failed on the network or with
// an HTTP 5xx, or a close code wire.Reconnectable accepts (the host
// restarting, a lost connection, a swapped transport, a client too slow).
func Retryable(err error) bool {
	var de *DialError
	if errors.As(err, &de) {
		return de.Status == 0 || de.Status >= 500
	}
	var ce *CloseError
	return errors.As(err, &ce) && wire.Reconnectable(ce.Code)
}
