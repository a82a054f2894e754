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
	// Cols and Rows are the writer's terminal size, both set or neither:
	// the PTY takes it before the replay is decided. A size given with
	// view=1 (and an attach token) is dropped; a malformed one sets BadSize
	// instead.
	Cols, Rows int
	// BadSize reports a size that was given but dropped: not both cols
	// and rows, each once, as decimal digits from 1 to 10000 (as in a
	// resize escape). Router.Open also drops, with BadSize, a size over
	// --pty-max-size.
	BadSize bool
}

// ParsePTYQuery parses and validates the query of an /api/pty upgrade. A
// malformed attach token or offset is an error (close 4400); a malformed
// size is not: like a malformed resize escape, it is dropped (BadSize)
// and the PTY keeps its size.
func ParsePTYQuery(raw string) (PTYQuery, error) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return PTYQuery{}, fmt.Errorf("query: %v: %w", err, contract.ErrInvalidArgument)
	}
	var p PTYQuery
	if vs, ok := q["attach"]; ok {
		if len(vs) != 1 || !wire.ValidAttachToken(vs[0]) {
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
	cols, hasCols := q["cols"]
	rows, hasRows := q["rows"]
	switch {
	case !hasCols && !hasRows:
	case len(cols) != 1 || len(rows) != 1:
		p.BadSize = true
	default:
		c, r, ok := wire.ParseSize(cols[0], rows[0])
		p.Cols, p.Rows, p.BadSize = c, r, !ok
	}
	if p.View && p.Attach != "" {
		p.Cols, p.Rows, p.BadSize = 0, 0, false
	}
	return p, nil
}

// boundSize drops q's size when it is over maxCols×maxRows (BadSize), as
// a resize escape over the largest PTY size is dropped.
func (q *PTYQuery) boundSize(maxCols, maxRows int) {
	if q.Cols > maxCols || q.Rows > maxRows {
		q.Cols, q.Rows, q.BadSize = 0, 0, true
	}
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
	if q.Cols > 0 && q.Rows > 0 {
		v.Set("cols", strconv.Itoa(q.Cols))
		v.Set("rows", strconv.Itoa(q.Rows))
	}
	return v.Encode()
}

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
