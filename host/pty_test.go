package host

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tether-agent/tether/contract"
)

func TestParseResize(t *testing.T) {
	tests := []struct {
		in         string
		cols, rows int
		ok         bool
	}{
		{"\x1b[RESIZE:120;40]", 120, 40, true},
		{"\x1b[RESIZE:1;1]", 1, 1, true},
		{"\x1b[RESIZE:10000;10000]", 10000, 10000, true},
		{"\x1b[RESIZE:10001;40]", 0, 0, false},
		{"\x1b[RESIZE:0;40]", 0, 0, false},
		{"\x1b[RESIZE:-1;40]", 0, 0, false},
		{"\x1b[RESIZE:+1;40]", 0, 0, false},
		{"\x1b[RESIZE:120;40]x", 0, 0, false},
		{"x\x1b[RESIZE:120;40]", 0, 0, false},
		{"\x1b[RESIZE:120,40]", 0, 0, false},
		{"\x1b[RESIZE:120;]", 0, 0, false},
		{"\x1b[RESIZE:;40]", 0, 0, false},
		{"\x1b[RESIZE:1 2;40]", 0, 0, false},
		{"\x1b[resize:120;40]", 0, 0, false},
		{"\x1b[RESIZE:120;40;3]", 0, 0, false},
		{"", 0, 0, false},
		{"ls\r", 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q", tt.in), func(t *testing.T) {
			cols, rows, ok := ParseResize([]byte(tt.in))
			if cols != tt.cols || rows != tt.rows || ok != tt.ok {
				t.Errorf("ParseResize = %d, %d, %v; want %d, %d, %v", cols, rows, ok, tt.cols, tt.rows, tt.ok)
			}
		})
	}
}

func FuzzParseResize(f *testing.F) {
	for _, s := range []string{"\x1b[RESIZE:120;40]", "\x1b[RESIZE:0;0]", "\x1b[RESIZE:99999999999999999999;1]", "abc"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cols, rows, ok := ParseResize(b)
		if !ok {
			return
		}
		if cols < 1 || rows < 1 || cols > 10000 || rows > 10000 {
			t.Fatalf("accepted out-of-range size %d;%d from %q", cols, rows, b)
		}
		// An accepted frame is exactly the canonical escape.
		if want := fmt.Sprintf("\x1b[RESIZE:%d;%d]", cols, rows); strings.TrimLeft(string(b), "") != want && !leadingZeros(b) {
			t.Fatalf("accepted %q, canonical form %q", b, want)
		}
	})
}

// leadingZeros reports whether the numbers of an accepted escape have
// leading zeros ("007"), the one non-canonical form accepted.
func leadingZeros(b []byte) bool {
	return strings.Contains(string(b), ":0") || strings.Contains(string(b), ";0")
}

func TestParsePTYQuery(t *testing.T) {
	tok := strings.Repeat("a", 16)
	tests := []struct {
		in      string
		want    PTYQuery
		wantErr bool
	}{
		{"", PTYQuery{}, false},
		{"attach=" + tok, PTYQuery{Attach: tok}, false},
		{"attach=" + tok + "&offset=10&epoch=e1&view=1", PTYQuery{Attach: tok, HasOffset: true, Offset: 10, Epoch: "e1", View: true}, false},
		{"attach=" + tok + "&offset=0", PTYQuery{Attach: tok, HasOffset: true}, false},
		{"attach=" + strings.Repeat("A-_9", 32), PTYQuery{Attach: strings.Repeat("A-_9", 32)}, false},
		{"attach=short", PTYQuery{}, true},
		{"attach=" + strings.Repeat("a", 129), PTYQuery{}, true},
		{"attach=" + strings.Repeat("a", 15) + "!", PTYQuery{}, true},
		{"attach=", PTYQuery{}, true},
		{"attach=" + tok + "&attach=" + tok, PTYQuery{}, true},
		{"attach=" + tok + "&offset=-1", PTYQuery{}, true},
		{"attach=" + tok + "&offset=x", PTYQuery{}, true},
		{"attach=" + tok + "&offset=1.5", PTYQuery{}, true},
		{"attach=" + tok + "&offset=99999999999999999999", PTYQuery{}, true},
		{"attach=%zz", PTYQuery{}, true},
		{"token=abc&view=0", PTYQuery{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParsePTYQuery(tt.in)
			if tt.wantErr {
				if !errors.Is(err, contract.ErrInvalidArgument) {
					t.Fatalf("ParsePTYQuery(%q) error %v, want ErrInvalidArgument", tt.in, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParsePTYQuery(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
		})
	}
}

func FuzzParsePTYQuery(f *testing.F) {
	for _, s := range []string{"attach=aaaaaaaaaaaaaaaa&offset=3&epoch=x", "offset=-1", "attach=%", "view=1&attach=0123456789abcdef0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := ParsePTYQuery(s)
		if err != nil {
			if !errors.Is(err, contract.ErrInvalidArgument) {
				t.Fatalf("error %v is not ErrInvalidArgument", err)
			}
			return
		}
		if q.Attach != "" && !ValidAttachToken(q.Attach) {
			t.Fatalf("accepted invalid attach %q", q.Attach)
		}
		if q.Offset < 0 || (!q.HasOffset && q.Offset != 0) {
			t.Fatalf("bad offset %+v", q)
		}
	})
}
