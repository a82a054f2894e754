package pty

import "strings"

// Attach token limits (docs/PROTOCOL.md §13.1).
const (
	minTokenLen = 16
	maxTokenLen = 128
	// legacyPrefix starts the tokens the host makes up for legacy
	// one-PTY-per-socket mode (docs/PROTOCOL.md §13.8): the prefix, then
	// at least minLegacyHex hex digits.
	legacyPrefix = "legacy-"
	minLegacyHex = 8
)

// validToken reports whether s is an attach token: 16–128 characters of
// [A-Za-z0-9_-], or "legacy-" followed by at least 8 hex digits.
func validToken(s string) bool {
	if h, ok := strings.CutPrefix(s, legacyPrefix); ok && len(h) >= minLegacyHex && allBytes(h, isHex) {
		return true
	}
	return len(s) >= minTokenLen && len(s) <= maxTokenLen && allBytes(s, isTokenByte)
}

func allBytes(s string, ok func(byte) bool) bool {
	for i := range len(s) {
		if !ok(s[i]) {
			return false
		}
	}
	return true
}

func isTokenByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
