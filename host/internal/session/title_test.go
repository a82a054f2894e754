package session

import "testing"

func TestTitleFrom(t *testing.T) {
	tests := []struct{ in, want string }{
		{"hello world", "hello world"},
		{"\n\n  fix   the\tbug  \nsecond line", "fix the bug"},
		{"", ""},
		{"   \n \n", ""},
		{"Refactor the session table so that every teardown goes through the funnel and nothing else", "Refactor the session table so that every teardown goes…"},
		{"Σäöü  x", "Σäöü x"},
		{"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa…"},
	}
	for _, tt := range tests {
		got := TitleFrom(tt.in)
		if got != tt.want {
			t.Errorf("TitleFrom(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if n := len([]rune(got)); n > maxAutoTitle {
			t.Errorf("TitleFrom(%q) has %d characters, want at most %d", tt.in, n, maxAutoTitle)
		}
	}
}
