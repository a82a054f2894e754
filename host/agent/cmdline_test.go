package agent

import (
	"bytes"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

var parseTests = []struct {
	name    string
	line    string
	want    []string
	wantErr error
	// shell: sh parses line the same way (it contains nothing sh would
	// expand), so the case is checked against sh too.
	shell bool
}{
	{"empty", "", nil, nil, true},
	{"blank", " \t\n ", nil, nil, true},
	{"one word", "agent", []string{"agent"}, nil, true},
	{"words and blanks", "  a  b\tc  ", []string{"a", "b", "c"}, nil, true},
	// sh would end the command at the newline.
	{"newline separates words", "a\nb", []string{"a", "b"}, nil, false},
	{"single quotes", `'a b' 'c\d' 'e"f'`, []string{"a b", `c\d`, `e"f`}, nil, true},
	{"single quotes keep $ and backquote", "'$HOME `x`'", []string{"$HOME `x`"}, nil, true},
	{"double quotes", `"a b" "c'd"`, []string{"a b", "c'd"}, nil, true},
	{"double quote escapes", `"\" \\ \$ \` + "`" + `"`, []string{"\" \\ $ `"}, nil, true},
	{"double quote literal backslash", `"\a \n \'"`, []string{`\a \n \'`}, nil, true},
	{"double quote line continuation", "\"a\\\nb\"", []string{"ab"}, nil, true},
	{"backslash outside quotes", `a\ b \'c\" \\ \x`, []string{"a b", `'c"`, `\`, "x"}, nil, true},
	{"backslash newline outside quotes", "a\\\nb c", []string{"ab", "c"}, nil, true},
	{"adjacent parts join", `a'b'"c"\d`, []string{"abcd"}, nil, true},
	{"empty quoted words", `'' "" a ''""`, []string{"", "", "a", ""}, nil, true},
	{"no expansion", "$HOME ~ *.go `id` $(id) a|b;c&d >e", []string{"$HOME", "~", "*.go", "`id`", "$(id)", "a|b;c&d", ">e"}, nil, false},
	{"no comments", "a #b", []string{"a", "#b"}, nil, false},
	{"non-ASCII", "é 'ü ß' \"日本\"", []string{"é", "ü ß", "日本"}, nil, true},
	{"unterminated single", "a 'b c", nil, ErrUnterminatedQuote, false},
	{"unterminated double", `a "b c`, nil, ErrUnterminatedQuote, false},
	{"unterminated double after escape", `"a\"`, nil, ErrUnterminatedQuote, false},
	{"double quote ending in backslash", `"a\`, nil, ErrUnterminatedQuote, false},
	{"trailing backslash", `a b\`, nil, ErrTrailingBackslash, false},
}

func TestParseCommandLine(t *testing.T) {
	for _, tt := range parseTests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCommandLine(tt.line)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ParseCommandLine(%q): got error %v, want %v", tt.line, err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("ParseCommandLine(%q): got %q, want %q", tt.line, got, tt.want)
			}
		})
	}
}

// TestParseCommandLineLikeShell checks the cases sh can parse without
// expanding anything against sh itself.
func TestParseCommandLineLikeShell(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh in PATH")
	}
	for _, tt := range parseTests {
		if !tt.shell {
			continue
		}
		t.Run(tt.name, func(t *testing.T) {
			// set -f: no globbing, in case a case slips through.
			out, err := exec.Command(sh, "-fc", "set -- "+tt.line+"\nfor a; do printf '%s\\0' \"$a\"; done").Output()
			if err != nil {
				t.Fatalf("sh: got error %v, want nil", err)
			}
			var want []string
			if len(out) > 0 {
				want = strings.Split(string(bytes.TrimSuffix(out, []byte{0})), "\x00")
			}
			got, err := ParseCommandLine(tt.line)
			if err != nil {
				t.Fatalf("ParseCommandLine(%q): got error %v, want nil", tt.line, err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("ParseCommandLine(%q): got %q, want %q (as sh splits it)", tt.line, got, want)
			}
		})
	}
}

// quoteWord quotes w for a POSIX shell with single quotes.
func quoteWord(w string) string {
	return "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
}

func FuzzParseCommandLine(f *testing.F) {
	for _, tt := range parseTests {
		f.Add(tt.line)
	}
	f.Fuzz(func(t *testing.T, line string) {
		words, err := ParseCommandLine(line)
		if err != nil {
			if !errors.Is(err, ErrUnterminatedQuote) && !errors.Is(err, ErrTrailingBackslash) {
				t.Fatalf("ParseCommandLine(%q): got error %v, want %v or %v", line, err, ErrUnterminatedQuote, ErrTrailingBackslash)
			}
			return
		}
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = quoteWord(w)
		}
		requoted := strings.Join(quoted, " ")
		again, err := ParseCommandLine(requoted)
		if err != nil {
			t.Fatalf("ParseCommandLine(%q) (re-quoted %q): got error %v, want nil", requoted, words, err)
		}
		if !slices.Equal(again, words) {
			t.Fatalf("ParseCommandLine(%q) (re-quoted): got %q, want %q", requoted, again, words)
		}
	})
}
