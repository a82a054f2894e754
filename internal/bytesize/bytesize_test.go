package bytesize

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name        string
		in          string
		least, most int64
		want        int64
		wantErr     string // a part of the error; "" for none
	}{
		{"plain bytes", "4096", 1, 1 << 30, 4096, ""},
		{"KiB", "64KiB", 1, 1 << 30, 64 << 10, ""},
		{"MiB", "1MiB", 1, 1 << 30, 1 << 20, ""},
		{"GiB", "2GiB", 1, 4 << 30, 2 << 30, ""},
		{"exactly the most", "1GiB", 1, 1 << 30, 1 << 30, ""},
		{"exactly the least", "1KiB", 1 << 10, 1 << 30, 1 << 10, ""},
		{"above the most", "1025MiB", 1, 1 << 30, 0, "up to 1GiB"},
		{"overflowing", "9223372036854775807GiB", 1, 4 << 30, 0, "up to 4GiB"},
		{"below the least", "12", 1 << 10, 1 << 30, 0, "at least 1KiB"},
		{"zero", "0", 1, 1 << 30, 0, "want bytes"},
		{"negative", "-1KiB", 1, 1 << 30, 0, "want bytes"},
		{"empty", "", 1, 1 << 30, 0, "want bytes"},
		{"a bare suffix", "MiB", 1, 1 << 30, 0, "want bytes"},
		{"a fraction", "1.5MiB", 1, 1 << 30, 0, "want bytes"},
		{"an SI suffix", "1MB", 1, 1 << 30, 0, "want bytes"},
		{"lower case", "1mib", 1, 1 << 30, 0, "want bytes"},
		{"a space", "1 MiB", 1, 1 << 30, 0, "want bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in, tt.least, tt.most)
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("Parse(%q): got %d, %v; want %d, nil", tt.in, got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Parse(%q): got %d, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
		})
	}
}

func TestFormat(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{0, "0"},
		{1000, "1000"},
		{1 << 10, "1KiB"},
		{1536 << 10, "1536KiB"},
		{1 << 20, "1MiB"},
		{3 << 30, "3GiB"},
	}
	for _, tt := range tests {
		if got := Format(tt.in); got != tt.want {
			t.Errorf("Format(%d): got %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestRoundTrip: what Format prints, Parse reads back.
func TestRoundTrip(t *testing.T) {
	for _, n := range []int64{1, 4096, 1 << 10, 3 << 20, 1<<20 + 1, 5 << 30} {
		got, err := Parse(Format(n), 1, 1<<40)
		if err != nil || got != n {
			t.Errorf("Parse(Format(%d) = %q): got %d, %v", n, Format(n), got, err)
		}
	}
}
