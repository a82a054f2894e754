package contract_test

import (
	"errors"
	"regexp"
	"testing"

	"pgregory.net/rapid"

	"github.com/tether-agent/tether/contract"
)

func TestTransportIDString(t *testing.T) {
	tests := []struct {
		id   contract.TransportID
		want string
	}{
		{contract.TransportID{}, "-"},
		{contract.TransportID{Instance: "0123456789abcdef", Conn: 0}, "0123456789abcdef/0"},
		{contract.TransportID{Instance: "0123456789abcdef", Conn: 42}, "0123456789abcdef/42"},
		{contract.TransportID{Instance: "a", Conn: 1<<64 - 1}, "a/18446744073709551615"},
		{contract.TransportID{Instance: "a/b", Conn: 7}, "a/b/7"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.id.String(); got != tt.want {
				t.Errorf("%#v.String() = %q, want %q", tt.id, got, tt.want)
			}
		})
	}
}

func TestParseTransportID(t *testing.T) {
	tests := []struct {
		in      string
		want    contract.TransportID
		wantErr bool
	}{
		{in: "0123456789abcdef/0", want: contract.TransportID{Instance: "0123456789abcdef"}},
		{in: "0123456789abcdef/42", want: contract.TransportID{Instance: "0123456789abcdef", Conn: 42}},
		{in: "a/18446744073709551615", want: contract.TransportID{Instance: "a", Conn: 1<<64 - 1}},
		{in: "a/b/7", want: contract.TransportID{Instance: "a/b", Conn: 7}},
		{in: "", wantErr: true},
		{in: "-", wantErr: true}, // the zero value's String form
		{in: "abc", wantErr: true},
		{in: "/1", wantErr: true},
		{in: "abc/", wantErr: true},
		{in: "abc/-1", wantErr: true},
		{in: "abc/x", wantErr: true},
		{in: "abc/18446744073709551616", wantErr: true},
		{in: "abc/1/", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := contract.ParseTransportID(tt.in)
			if tt.wantErr {
				if !errors.Is(err, contract.ErrInvalidArgument) {
					t.Errorf("ParseTransportID(%q) = %#v, %v; want an error matching ErrInvalidArgument", tt.in, got, err)
				}
				if !got.IsZero() {
					t.Errorf("ParseTransportID(%q) = %#v with error, want the zero TransportID", tt.in, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseTransportID(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("ParseTransportID(%q) = %#v, want %#v", tt.in, got, tt.want)
			}
			if s := got.String(); s != tt.in {
				t.Errorf("ParseTransportID(%q).String() = %q, want %q", tt.in, s, tt.in)
			}
		})
	}
}

func TestTransportIDZero(t *testing.T) {
	var id contract.TransportID
	if !id.IsZero() {
		t.Errorf("zero TransportID: IsZero() = false, want true")
	}
	if got := id.String(); got != "-" {
		t.Errorf("zero TransportID: String() = %q, want %q", got, "-")
	}
	for _, id := range []contract.TransportID{{Instance: "a"}, {Conn: 1}} {
		if id.IsZero() {
			t.Errorf("%#v.IsZero() = true, want false", id)
		}
	}
}

func TestTransportIDRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		id := contract.TransportID{
			Instance: rapid.StringMatching(`.+`).Draw(t, "instance"),
			Conn:     rapid.Uint64().Draw(t, "conn"),
		}
		got, err := contract.ParseTransportID(id.String())
		if err != nil {
			t.Fatalf("ParseTransportID(%q): %v", id.String(), err)
		}
		if got != id {
			t.Fatalf("ParseTransportID(%q) = %#v, want %#v", id.String(), got, id)
		}
	})
}

func TestParseTransportIDProperty(t *testing.T) {
	// Any string either fails with ErrInvalidArgument or parses to a
	// non-zero id whose String form parses back to the same id.
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.OneOf(
			rapid.String(),
			rapid.StringMatching(`[0-9a-f/]{0,20}/[0-9+-]{0,22}`),
		).Draw(t, "s")
		id, err := contract.ParseTransportID(s)
		if err != nil {
			if !errors.Is(err, contract.ErrInvalidArgument) {
				t.Fatalf("ParseTransportID(%q): error %v does not match ErrInvalidArgument", s, err)
			}
			return
		}
		if id.IsZero() {
			t.Fatalf("ParseTransportID(%q) = zero TransportID, nil", s)
		}
		again, err := contract.ParseTransportID(id.String())
		if err != nil || again != id {
			t.Fatalf("ParseTransportID(%q) = %#v, %v; want %#v", id.String(), again, err, id)
		}
	})
}

func TestNewInstanceID(t *testing.T) {
	shape := regexp.MustCompile(`^[0-9a-f]{16}$`)
	const n = 10000
	seen := make(map[string]bool, n)
	for range n {
		id := contract.NewInstanceID()
		if !shape.MatchString(id) {
			t.Fatalf("NewInstanceID() = %q, want 16 lower-case hex characters", id)
		}
		if seen[id] {
			t.Fatalf("NewInstanceID() returned %q twice in %d calls", id, len(seen)+1)
		}
		seen[id] = true
	}
}

func TestEventKindString(t *testing.T) {
	tests := []struct {
		k    contract.EventKind
		want string
	}{
		{contract.EventOpened, "opened"},
		{contract.EventFrame, "frame"},
		{contract.EventClosed, "closed"},
		{0, "event(0)"},
		{200, "event(200)"},
	}
	for _, tt := range tests {
		if got := tt.k.String(); got != tt.want {
			t.Errorf("EventKind(%d).String() = %q, want %q", uint8(tt.k), got, tt.want)
		}
	}
}

func TestCommandKindString(t *testing.T) {
	tests := []struct {
		k    contract.CommandKind
		want string
	}{
		{contract.CommandAdmit, "admit"},
		{contract.CommandSend, "send"},
		{contract.CommandClose, "close"},
		{0, "command(0)"},
		{200, "command(200)"},
	}
	for _, tt := range tests {
		if got := tt.k.String(); got != tt.want {
			t.Errorf("CommandKind(%d).String() = %q, want %q", uint8(tt.k), got, tt.want)
		}
	}
}
