package contract

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errorDomain tags the ErrorInfo details tether puts on gRPC statuses.
const errorDomain = "tether"

// errClasses maps each sentinel to its gRPC code and wire reason.
var errClasses = []struct {
	err    error
	code   codes.Code
	reason string
}{
	{ErrInvalidArgument, codes.InvalidArgument, "INVALID_ARGUMENT"},
	{ErrNotFound, codes.NotFound, "NOT_FOUND"},
	{ErrAlreadyLinked, codes.AlreadyExists, "ALREADY_LINKED"},
	{ErrNotStarted, codes.FailedPrecondition, "NOT_STARTED"},
	{ErrStopped, codes.FailedPrecondition, "STOPPED"},
	{ErrStaleTransport, codes.Aborted, "STALE_TRANSPORT"},
	{ErrPluginExited, codes.Unavailable, "PLUGIN_EXITED"},
	{ErrUnavailable, codes.Unavailable, "UNAVAILABLE"},
	{ErrRegistryFull, codes.ResourceExhausted, "REGISTRY_FULL"},
	{ErrExited, codes.FailedPrecondition, "EXITED"},
	{ErrNoSuchTerminal, codes.NotFound, "NO_SUCH_TERMINAL"},
}

// ToGRPC converts err into a gRPC status error that FromGRPC turns back into
// an error matching the same sentinel with errors.Is. Context errors map to
// Canceled and DeadlineExceeded; unknown errors to Unknown.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && !isTetherClass(err) {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	for _, c := range errClasses {
		if errors.Is(err, c.err) {
			st := status.New(c.code, err.Error())
			if d, derr := st.WithDetails(&errdetails.ErrorInfo{Domain: errorDomain, Reason: c.reason}); derr == nil {
				st = d
			}
			return st.Err()
		}
	}
	return status.Error(codes.Unknown, err.Error())
}

func isTetherClass(err error) bool {
	for _, c := range errClasses {
		if errors.Is(err, c.err) {
			return true
		}
	}
	return false
}

// FromGRPC converts a gRPC status error back into an error that wraps the
// sentinel it was made from. A bare Unavailable (the connection went away)
// becomes ErrUnavailable: it is not proof that the plugin died.
func FromGRPC(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.Domain != errorDomain {
			continue
		}
		for _, c := range errClasses {
			if c.reason == info.Reason {
				return &remoteError{msg: st.Message(), class: c.err}
			}
		}
	}
	switch st.Code() {
	case codes.Canceled:
		return fmt.Errorf("%s: %w", st.Message(), context.Canceled)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w", st.Message(), context.DeadlineExceeded)
	case codes.Unavailable:
		return fmt.Errorf("%s: %w", st.Message(), ErrUnavailable)
	case codes.InvalidArgument:
		return fmt.Errorf("%s: %w", st.Message(), ErrInvalidArgument)
	case codes.NotFound:
		return fmt.Errorf("%s: %w", st.Message(), ErrNotFound)
	case codes.Unknown:
		// A plain error from the other side: keep its text, without the
		// "rpc error: code = Unknown desc =" wrapping.
		return errors.New(st.Message())
	}
	return err
}

// remoteError is an error that came back over gRPC: its text is the remote
// message (which already names the class), and it unwraps to the class.
type remoteError struct {
	msg   string
	class error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.class }
