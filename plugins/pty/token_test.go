package pty

import (
	"regexp"
	"strings"
	"testing"
)

// tokenModel is validToken written as a regular expression.
var tokenModel = regexp.MustCompile(`^(?:[A-Za-z0-9_-]{16,128}|legacy-[0-9a-fA-F]{8,})$`)

func TestValidToken(t *testing.T) {
	tests := []struct {
		token string
		want  bool
	}{
		{"", false},
		{"abcdefghijklmno", false}, // 15
		{"abcdefghijklmnop", true}, // 16
		{"ABC_def-0123456789", true},
		{strings.Repeat("a", 128), true},
		{strings.Repeat("a", 129), false},
		{"abcdefghijklmnop!", false},
		{"abcdefgh ijklmnop", false},
		{"abcdefghijklmnopé", false},
		{"legacy-0123abcd", true},
		{"legacy-0123ABCD", true},
		{"legacy-0123abc", false},
		{"legacy-0123abcg", false},
		{"legacy-" + strings.Repeat("f", 200), true},
		{"legacy-", false},
		{"legacy-0123abcdxyz", true}, // not hex, but a plain 18-char token
	}
	for _, tt := range tests {
		t.Run(tt.token, func(t *testing.T) {
			if got := validToken(tt.token); got != tt.want {
				t.Errorf("validToken(%q): got %v, want %v", tt.token, got, tt.want)
			}
		})
	}
}

func FuzzTokenValid(f *testing.F) {
	for _, s := range []string{"abcdefghijklmnop", "legacy-0123abcd", "legacy-0123abc", strings.Repeat("x", 129)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validToken(s), tokenModel.MatchString(s); got != want {
			t.Errorf("validToken(%q): got %v, want %v", s, got, want)
		}
	})
}
