package contract_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-agent/tether/contract"
)

// sentinels lists every error class in errors.go and backend.go with the
// gRPC code it travels as.
var sentinels = []struct {
	name string
	err  error
	code codes.Code
}{
	{"InvalidArgument", contract.ErrInvalidArgument, codes.InvalidArgument},
	{"NotFound", contract.ErrNotFound, codes.NotFound},
	{"AlreadyLinked", contract.ErrAlreadyLinked, codes.AlreadyExists},
	{"NotStarted", contract.ErrNotStarted, codes.FailedPrecondition},
	{"Stopped", contract.ErrStopped, codes.FailedPrecondition},
	{"StaleTransport", contract.ErrStaleTransport, codes.Aborted},
	{"PluginExited", contract.ErrPluginExited, codes.Unavailable},
	{"Unavailable", contract.ErrUnavailable, codes.Unavailable},
	{"RegistryFull", contract.ErrRegistryFull, codes.ResourceExhausted},
	{"Exited", contract.ErrExited, codes.FailedPrecondition},
	{"NoSuchTerminal", contract.ErrNoSuchTerminal, codes.NotFound},
}

func TestErrorClassesSurviveGRPC(t *testing.T) {
	for _, tt := range sentinels {
		t.Run(tt.name, func(t *testing.T) {
			in := fmt.Errorf("ctx: %w", tt.err)
			wire := contract.ToGRPC(in)
			if got := status.Code(wire); got != tt.code {
				t.Errorf("status code = %v, want %v", got, tt.code)
			}
			out := contract.FromGRPC(wire)
			if !errors.Is(out, tt.err) {
				t.Errorf("errors.Is(%v, %v) = false, want true", out, tt.err)
			}
			if got, want := out.Error(), in.Error(); got != want {
				t.Errorf("message = %q, want %q", got, want)
			}
			// No other class matches: classes that share a gRPC code stay
			// apart.
			for _, other := range sentinels {
				if other.err != tt.err && errors.Is(out, other.err) {
					t.Errorf("errors.Is(%v, %v) = true, want false", out, other.err)
				}
			}
		})
	}
}

func TestContextErrorsSurviveGRPC(t *testing.T) {
	tests := []struct {
		name string
		err  error
		code codes.Code
	}{
		{"Canceled", context.Canceled, codes.Canceled},
		{"DeadlineExceeded", context.DeadlineExceeded, codes.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := fmt.Errorf("ctx: %w", tt.err)
			wire := contract.ToGRPC(in)
			if got := status.Code(wire); got != tt.code {
				t.Errorf("ToGRPC: status code = %v, want %v", got, tt.code)
			}
			out := contract.FromGRPC(wire)
			if !errors.Is(out, tt.err) {
				t.Errorf("FromGRPC: errors.Is(%v, %v) = false, want true", out, tt.err)
			}
			if !strings.Contains(out.Error(), in.Error()) {
				t.Errorf("FromGRPC: message %q does not contain %q", out.Error(), in.Error())
			}

			// A bare status with that code, as grpc itself makes one when
			// the caller's context ends, maps back the same way.
			out = contract.FromGRPC(status.Error(tt.code, "x"))
			if !errors.Is(out, tt.err) {
				t.Errorf("FromGRPC(bare %v): errors.Is(%v, %v) = false, want true", tt.code, out, tt.err)
			}
		})
	}
}

func TestToGRPC(t *testing.T) {
	if err := contract.ToGRPC(nil); err != nil {
		t.Errorf("ToGRPC(nil) = %v, want nil", err)
	}

	plain := errors.New("boom")
	wire := contract.ToGRPC(plain)
	st, ok := status.FromError(wire)
	if !ok {
		t.Fatalf("ToGRPC(%v) = %v, not a status error", plain, wire)
	}
	if st.Code() != codes.Unknown {
		t.Errorf("ToGRPC(plain): code = %v, want %v", st.Code(), codes.Unknown)
	}
	if st.Message() != "boom" {
		t.Errorf("ToGRPC(plain): message = %q, want %q", st.Message(), "boom")
	}
	out := contract.FromGRPC(wire)
	for _, s := range sentinels {
		if errors.Is(out, s.err) {
			t.Errorf("FromGRPC(ToGRPC(plain)) matches %v, want no class", s.err)
		}
	}

	// A status error that is no tether class passes through untouched.
	already := status.Error(codes.ResourceExhausted, "full")
	if got := contract.ToGRPC(already); got != already {
		t.Errorf("ToGRPC(status) = %v, want it unchanged", got)
	}
}

func TestFromGRPC(t *testing.T) {
	if err := contract.FromGRPC(nil); err != nil {
		t.Errorf("FromGRPC(nil) = %v, want nil", err)
	}

	// The connection going away (or a timeout) is not proof that the
	// plugin died: a bare Unavailable is ErrUnavailable, not
	// ErrPluginExited.
	out := contract.FromGRPC(status.Error(codes.Unavailable, "x"))
	if !errors.Is(out, contract.ErrUnavailable) {
		t.Errorf("FromGRPC(Unavailable): errors.Is(%v, ErrUnavailable) = false, want true", out)
	}
	if errors.Is(out, contract.ErrPluginExited) {
		t.Errorf("FromGRPC(Unavailable): errors.Is(%v, ErrPluginExited) = true, want false", out)
	}
	out = contract.FromGRPC(status.Error(codes.DeadlineExceeded, "x"))
	if errors.Is(out, contract.ErrPluginExited) {
		t.Errorf("FromGRPC(DeadlineExceeded): errors.Is(%v, ErrPluginExited) = true, want false", out)
	}

	// An error that is not a status passes through.
	plain := errors.New("boom")
	if got := contract.FromGRPC(plain); got != plain {
		t.Errorf("FromGRPC(plain) = %v, want it unchanged", got)
	}
}
