package ptyroute

import (
	"fmt"
	"net/url"
	"strconv"

	"github.com/tether-agent/tether/contract"
)

// PTYQuery is a parsed /api/pty query.
type PTYQuery struct {
	Attach    string // "" in legacy mode
	HasOffset bool
	Offset    int64
	Epoch     string
	View      bool
}

// ParsePTYQuery parses and validates the query of an /api/pty upgrade. A
// malformed attach token or offset is an error (close 4400).
func ParsePTYQuery(raw string) (PTYQuery, error) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return PTYQuery{}, fmt.Errorf("query: %v: %w", err, contract.ErrInvalidArgument)
	}
	var p PTYQuery
	if vs, ok := q["attach"]; ok {
		if len(vs) != 1 || !ValidAttachToken(vs[0]) {
			return PTYQuery{}, fmt.Errorf("attach must be 16-128 of [A-Za-z0-9_-]: %w", contract.ErrInvalidArgument)
		}
		p.Attach = vs[0]
	}
	if vs, ok := q["offset"]; ok {
		if len(vs) != 1 {
			return PTYQuery{}, fmt.Errorf("offset given twice: %w", contract.ErrInvalidArgument)
		}
		n, err := strconv.ParseInt(vs[0], 10, 64)
		if err != nil || n < 0 {
			return PTYQuery{}, fmt.Errorf("offset must be a non-negative integer: %w", contract.ErrInvalidArgument)
		}
		p.HasOffset, p.Offset = true, n
	}
	p.Epoch = q.Get("epoch")
	p.View = q.Get("view") == "1"
	return p, nil
}

// ValidAttachToken reports whether t is 16–128 characters of
// [A-Za-z0-9_-].
func ValidAttachToken(t string) bool {
	if len(t) < 16 || len(t) > 128 {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// resizePrefix starts every resize escape; a frame that starts with it is
// never written to a PTY.
const resizePrefix = "\x1b[RESIZE:"

// IsResize reports whether frame starts with the resize escape's prefix:
// it is then a resize, or dropped, and never input.
func IsResize(frame []byte) bool {
	return len(frame) >= len(resizePrefix) && string(frame[:len(resizePrefix)]) == resizePrefix
}

// ParseResize reports whether frame is exactly the resize escape
// ESC [ R E S I Z E : cols ; rows ] and returns the size.
func ParseResize(frame []byte) (cols, rows int, ok bool) {
	const prefix = resizePrefix
	if len(frame) < len(prefix)+4 || len(frame) > 64 || string(frame[:len(prefix)]) != prefix || frame[len(frame)-1] != ']' {
		return 0, 0, false
	}
	body := string(frame[len(prefix) : len(frame)-1])
	c, r, found := cutByte(body, ';')
	if !found {
		return 0, 0, false
	}
	cols, err1 := strconv.Atoi(c)
	rows, err2 := strconv.Atoi(r)
	if err1 != nil || err2 != nil || cols <= 0 || rows <= 0 || cols > 10000 || rows > 10000 || c[0] == '+' || r[0] == '+' {
		return 0, 0, false
	}
	return cols, rows, true
}

func cutByte(s string, b byte) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == b {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}
