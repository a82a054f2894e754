package ptyroute

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
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

// Encode is the query of q as an /api/pty URL carries it, with nothing
// else (no credential): what a relayed socket's leg asks the PTY's host.
func (q PTYQuery) Encode() string {
	v := url.Values{}
	if q.Attach != "" {
		v.Set("attach", q.Attach)
	}
	if q.HasOffset {
		v.Set("offset", strconv.FormatInt(q.Offset, 10))
	}
	if q.Epoch != "" {
		v.Set("epoch", q.Epoch)
	}
	if q.View {
		v.Set("view", "1")
	}
	return v.Encode()
}

// ValidAttachToken reports whether t is 16–128 characters of
// [A-Za-z0-9_-].
func ValidAttachToken(t string) bool { return wire.ValidAttachToken(t) }

// IsResize reports whether frame starts with the resize escape's prefix:
// it is then a resize, or dropped, and never input.
func IsResize(frame []byte) bool { return wire.IsResize(frame) }

// Why a frame that starts with the resize escape is dropped.
var (
	// ErrBadResize: the frame is not exactly ESC [ R E S I Z E : cols ;
	// rows ] with both numbers decimal, from 1 to 10000.
	ErrBadResize = errors.New("malformed resize")
	// ErrResizeTooLarge: a well-formed resize over the largest PTY size
	// (--pty-max-size).
	ErrResizeTooLarge = errors.New("resize over the largest PTY size")
)

// Default largest PTY size (--pty-max-size) of a Router given none.
const (
	DefaultMaxCols = 1000
	DefaultMaxRows = 1000
)

// ParseResize returns the size of a frame that is exactly the resize
// escape ESC [ R E S I Z E : cols ; rows ] with cols from 1 to maxCols
// and rows from 1 to maxRows (wire.ParseResize, then the bound), or
// ErrBadResize or ErrResizeTooLarge.
func ParseResize(frame []byte, maxCols, maxRows int) (cols, rows int, err error) {
	cols, rows, ok := wire.ParseResize(frame)
	switch {
	case !ok:
		return 0, 0, ErrBadResize
	case cols > maxCols || rows > maxRows:
		return cols, rows, fmt.Errorf("%w: %dx%d over %dx%d", ErrResizeTooLarge, cols, rows, maxCols, maxRows)
	}
	return cols, rows, nil
}
