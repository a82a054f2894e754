package agent

import (
	"fmt"
	"strings"
)

// ParseCommandLine splits s into words the way a POSIX shell splits a simple
// command, without expanding anything:
//
//   - words are separated by unquoted spaces, tabs and newlines;
//   - inside single quotes every character is literal;
//   - inside double quotes a backslash escapes only $, `, ", \ and newline
//     (a backslash-newline is removed); before any other character it is
//     literal;
//   - outside quotes a backslash makes the next character literal
//     (a backslash-newline is removed);
//   - quotes may join parts of a word (a'b'"c" is abc), and a pair of
//     quotes with nothing between them is an empty word.
//
// Nothing else is special: $, `, *, ~, #, |, ;, &, <, > and parentheses are
// ordinary characters, since the words are never given to a shell. It
// returns ErrUnterminatedQuote when s ends inside quotes and
// ErrTrailingBackslash when it ends with an escaping backslash. A blank s
// gives no words.
func ParseCommandLine(s string) ([]string, error) {
	var (
		words  []string
		word   strings.Builder
		inWord bool // a word has started, maybe empty ("" or '')
	)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case ' ', '\t', '\n':
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		case '\\':
			if i+1 >= len(s) {
				return nil, fmt.Errorf("parse command line: %w", ErrTrailingBackslash)
			}
			i++
			if s[i] == '\n' {
				continue // line continuation
			}
			word.WriteByte(s[i])
			inWord = true
		case '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, fmt.Errorf("parse command line: single quote at byte %d: %w", i, ErrUnterminatedQuote)
			}
			word.WriteString(s[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case '"':
			open := i
			closed := false
			for i++; i < len(s); i++ {
				d := s[i]
				if d == '"' {
					closed = true
					break
				}
				if d == '\\' && i+1 < len(s) {
					switch s[i+1] {
					case '$', '`', '"', '\\':
						i++
						word.WriteByte(s[i])
						continue
					case '\n':
						i++
						continue
					}
				}
				word.WriteByte(d)
			}
			if !closed {
				return nil, fmt.Errorf("parse command line: double quote at byte %d: %w", open, ErrUnterminatedQuote)
			}
			inWord = true
		default:
			word.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, word.String())
	}
	return words, nil
}
