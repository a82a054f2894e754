package wire

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// ReplayType is the type member of the pty.replay header.
const ReplayType = "pty.replay"

// Replay reasons. ReasonResume is the only one with Reset false.
const (
	ReasonResume          = "resume"            // the client's cursor was good: exactly [offset, end) follows
	ReasonInitial         = "initial"           // no cursor (a new attach, or a client with an empty screen)
	ReasonEpochMismatch   = "epoch_mismatch"    // the cursor is of another epoch of the token
	ReasonOffsetRolledOut = "offset_rolled_out" // the cursor is older than the ring holds
	ReasonOffsetAhead     = "offset_ahead"      // the cursor is past the end of the output
	ReasonInvalidCursor   = "invalid_cursor"    // an offset without an epoch
)

// ErrReplay: a pty.replay header that does not hold together.
var ErrReplay = errors.New("invalid pty.replay header")

// Replay is the header the host sends first on every /api/pty attach, as
// one text frame.
//
// Without a snapshot, the binary frames that follow are the bytes from
// the first replayed offset on — StartOffset when Reset, the client's own
// offset when not — and every byte moves the client's offset by one.
// With a snapshot (Snapshot true, so Reset true and StartOffset ==
// ReplayEndOffset), the first SnapshotBytes bytes are an escape sequence
// stream that redraws the terminal state at ReplayEndOffset on a fresh
// Cols×Rows terminal; they do not move the offset, and every byte after
// them counts from ReplayEndOffset.
//
// MarshalJSON lists the fields again: a new one goes there too.
type Replay struct {
	Type            string `json:"type"` // ReplayType
	Epoch           string `json:"epoch"`
	StartOffset     int64  `json:"start_offset"`
	ReplayEndOffset int64  `json:"replay_end_offset"`
	Reset           bool   `json:"reset"`
	Reason          string `json:"reason"`
	Snapshot        bool   `json:"snapshot,omitempty"`
	SnapshotBytes   int64  `json:"snapshot_bytes,omitempty"`
	Cols            int    `json:"cols,omitempty"`
	Rows            int    `json:"rows,omitempty"`
}

// MarshalJSON encodes r with snapshot_bytes present whenever Snapshot is
// true, 0 included (the empty snapshot of a new PTY), and absent
// otherwise.
func (r Replay) MarshalJSON() ([]byte, error) {
	var n *int64
	if r.Snapshot || r.SnapshotBytes != 0 {
		n = &r.SnapshotBytes
	}
	// Replay's fields in its order, snapshot_bytes a pointer.
	return json.Marshal(struct {
		Type            string `json:"type"`
		Epoch           string `json:"epoch"`
		StartOffset     int64  `json:"start_offset"`
		ReplayEndOffset int64  `json:"replay_end_offset"`
		Reset           bool   `json:"reset"`
		Reason          string `json:"reason"`
		Snapshot        bool   `json:"snapshot,omitempty"`
		SnapshotBytes   *int64 `json:"snapshot_bytes,omitempty"`
		Cols            int    `json:"cols,omitempty"`
		Rows            int    `json:"rows,omitempty"`
	}{r.Type, r.Epoch, r.StartOffset, r.ReplayEndOffset, r.Reset, r.Reason, r.Snapshot, n, r.Cols, r.Rows})
}

// Validate checks what a client relies on: the type, offsets with
// 0 ≤ StartOffset ≤ ReplayEndOffset, reason resume exactly when not Reset,
// and for a snapshot Reset, equal offsets, SnapshotBytes ≥ 0 and a size.
// An unknown reset reason is accepted (the list may grow).
func (r Replay) Validate() error {
	switch {
	case r.Type != ReplayType:
		return fmt.Errorf("%w: type %q", ErrReplay, r.Type)
	case r.StartOffset < 0 || r.ReplayEndOffset < r.StartOffset:
		return fmt.Errorf("%w: offsets [%d, %d)", ErrReplay, r.StartOffset, r.ReplayEndOffset)
	case r.Reset == (r.Reason == ReasonResume):
		return fmt.Errorf("%w: reset %v with reason %q", ErrReplay, r.Reset, r.Reason)
	case !r.Snapshot && (r.SnapshotBytes != 0 || r.Cols != 0 || r.Rows != 0):
		return fmt.Errorf("%w: snapshot fields without a snapshot", ErrReplay)
	case r.Snapshot && (!r.Reset || r.StartOffset != r.ReplayEndOffset || r.SnapshotBytes < 0 || r.Cols < 1 || r.Rows < 1):
		return fmt.Errorf("%w: snapshot of %d bytes, %dx%d, reset %v, offsets [%d, %d)",
			ErrReplay, r.SnapshotBytes, r.Cols, r.Rows, r.Reset, r.StartOffset, r.ReplayEndOffset)
	}
	return nil
}

// DecodeReplay decodes and validates a pty.replay header.
func DecodeReplay(frame []byte) (Replay, error) {
	var r Replay
	trimmed := bytes.TrimSpace(frame)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return Replay{}, fmt.Errorf("%w: not a JSON object", ErrReplay)
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if err := dec.Decode(&r); err != nil {
		return Replay{}, fmt.Errorf("%w: %v", ErrReplay, err)
	}
	if dec.InputOffset() != int64(len(trimmed)) {
		return Replay{}, fmt.Errorf("%w: data after the object", ErrReplay)
	}
	if err := r.Validate(); err != nil {
		return Replay{}, err
	}
	return r, nil
}

// The resize escape: a PTY input frame that is exactly
// ESC [ R E S I Z E : cols ; rows ] resizes the PTY; any frame that
// starts with ResizePrefix is never written to the PTY.
const (
	ResizePrefix = "\x1b[RESIZE:"
	MaxSize      = 10000 // largest cols or rows of a resize
	maxResize    = 64    // longest resize frame the host parses
)

// EncodeResize returns the resize escape for cols×rows (each 1–MaxSize;
// the host drops any other).
func EncodeResize(cols, rows int) []byte {
	b := make([]byte, 0, len(ResizePrefix)+12)
	b = append(b, ResizePrefix...)
	b = strconv.AppendInt(b, int64(cols), 10)
	b = append(b, ';')
	b = strconv.AppendInt(b, int64(rows), 10)
	return append(b, ']')
}

// IsResize reports whether frame starts with ResizePrefix: such a frame
// is never input, whether or not ParseResize accepts it.
func IsResize(frame []byte) bool {
	return bytes.HasPrefix(frame, []byte(ResizePrefix))
}

// ParseResize reports whether frame is exactly a resize escape and
// returns its size: decimal digits only (no sign; leading zeros allowed),
// both numbers in 1–MaxSize, the whole frame at most 64 bytes.
func ParseResize(frame []byte) (cols, rows int, ok bool) {
	if len(frame) > maxResize || !IsResize(frame) || frame[len(frame)-1] != ']' {
		return 0, 0, false
	}
	body := frame[len(ResizePrefix) : len(frame)-1]
	c, r, found := bytes.Cut(body, []byte{';'})
	if !found {
		return 0, 0, false
	}
	cols, ok1 := sizeNumber(c)
	rows, ok2 := sizeNumber(r)
	if !ok1 || !ok2 {
		return 0, 0, false
	}
	return cols, rows, true
}

// ParseSize parses the cols and rows of an /api/pty query as a resize
// escape's numbers: decimal digits only (no sign; leading zeros allowed),
// both in 1–MaxSize.
func ParseSize(cols, rows string) (c, r int, ok bool) {
	c, ok1 := sizeNumber([]byte(cols))
	r, ok2 := sizeNumber([]byte(rows))
	if !ok1 || !ok2 {
		return 0, 0, false
	}
	return c, r, true
}

// sizeNumber parses one or more decimal digits as a number in 1–MaxSize.
func sizeNumber(b []byte) (int, bool) {
	if len(b) == 0 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
		if n > MaxSize {
			return 0, false
		}
	}
	return n, n >= 1
}

// Attach tokens name a keep-alive PTY: 16–128 characters of
// [A-Za-z0-9_-]. Whoever knows one can attach to its PTY (with the access
// token), so it is made at random.
const (
	MinAttachToken = 16
	MaxAttachToken = 128
)

// ValidAttachToken reports whether t is a well-formed attach token.
func ValidAttachToken(t string) bool {
	if len(t) < MinAttachToken || len(t) > MaxAttachToken {
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

// NewAttachToken returns a fresh attach token: 128 random bits in hex
// (hex, so that it never starts with "-" and reads as a flag).
func NewAttachToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// PTYQuery is the query of GET /api/pty. An empty Attach asks for a PTY
// of the socket's own, killed when it closes.
type PTYQuery struct {
	Attach string
	// HasCursor sends Offset and Epoch: the client shows the PTY's output
	// up to Offset of Epoch, and wants only what follows. A client with an
	// empty screen sends none and gets the whole ring (or a snapshot).
	HasCursor bool
	Offset    int64
	Epoch     string
	// View attaches read-only: the host drops its input and resizes, it
	// never supersedes the writer, and a token with no live PTY is closed
	// with CloseNoSuchTerminal.
	View bool
	// Cols and Rows, when both are set, are the writer's terminal size:
	// the PTY takes it before the host decides the replay, so that a
	// snapshot is drawn for this terminal (a new PTY starts at it). A
	// view's size is ignored.
	Cols, Rows int
}

// Encode returns q as a query string.
func (q PTYQuery) Encode() string {
	v := url.Values{}
	if q.Attach != "" {
		v.Set("attach", q.Attach)
	}
	if q.HasCursor {
		v.Set("offset", strconv.FormatInt(q.Offset, 10))
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

// PTYURL returns the URL of base's PTY endpoint with query q: base's
// scheme and host, its path as a prefix of PathPTY, no user info or
// fragment.
func PTYURL(base *url.URL, q PTYQuery) *url.URL {
	return &url.URL{
		Scheme:   base.Scheme,
		Host:     base.Host,
		Path:     strings.TrimSuffix(base.Path, "/") + PathPTY,
		RawQuery: q.Encode(),
	}
}
