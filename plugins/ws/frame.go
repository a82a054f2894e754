package ws

import (
	"encoding/binary"
	"errors"
	"io"
	"unicode/utf8"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/tether-agent/tether/wire"
)

// maxHeaderSize is the size of the largest frame header the server writes:
// two bytes, an 8-byte extended length, and no mask.
const maxHeaderSize = 10

// preallocLimit is how much of a peer-declared payload length is trusted for
// allocation before the bytes arrive; past it the buffer grows as they do.
const preallocLimit = 32 << 10

// errPeerClosed ends a read loop after the peer's close frame was handled.
var errPeerClosed = errors.New("peer sent close frame")

// closeError asks for the connection to be failed with a close code.
type closeError struct {
	code   int
	reason string
}

func (e *closeError) Error() string { return e.reason }

// appendHeader appends the header of a final, unmasked (server-side) frame
// with opcode op and an n-byte payload.
func appendHeader(dst []byte, op ws.OpCode, n int) []byte {
	b0 := 0x80 | byte(op)
	switch {
	case n < 126:
		return append(dst, b0, byte(n))
	case n <= 0xffff:
		return append(dst, b0, 126, byte(n>>8), byte(n))
	default:
		return binary.BigEndian.AppendUint64(append(dst, b0, 127), uint64(n))
	}
}

// sendableCode reports whether code may be put in a close frame (RFC 6455
// §7.4, with the IANA registrations 1012–1014).
func sendableCode(code int) bool {
	switch {
	case code >= 1000 && code <= 1003, code >= 1007 && code <= 1014:
		return true
	case code >= 3000 && code <= 4999:
		return true
	}
	return false
}

// closeBody encodes the payload of a close frame: code and reason, the
// reason made valid UTF-8 and cut at a rune boundary so the payload fits in
// a control frame. Code 1005 (no status) encodes as an empty payload.
func closeBody(dst []byte, code int, reason string) []byte {
	if code == wire.CloseNoStatus {
		return dst[:0]
	}
	dst = binary.BigEndian.AppendUint16(dst[:0], uint16(code))
	room := ws.MaxControlFramePayloadSize - 2
	for len(reason) > 0 && room > 0 {
		r, size := utf8.DecodeRuneInString(reason)
		if r == utf8.RuneError && size <= 1 {
			reason = reason[1:] // drop a byte that is not UTF-8
			continue
		}
		if size > room {
			break
		}
		dst = append(dst, reason[:size]...)
		reason = reason[size:]
		room -= size
	}
	return dst
}

// parseClose decodes the payload of a close frame received from a peer. An
// empty payload is code 1005. A malformed payload is a *closeError with the
// code to fail the connection with.
func parseClose(p []byte) (code int, reason string, err error) {
	switch {
	case len(p) == 0:
		return wire.CloseNoStatus, "", nil
	case len(p) == 1:
		return 0, "", &closeError{code: wire.CloseProtocolError, reason: "truncated close code"}
	}
	code = int(binary.BigEndian.Uint16(p))
	if !sendableCode(code) {
		return 0, "", &closeError{code: wire.CloseProtocolError, reason: "invalid close code"}
	}
	if !utf8.Valid(p[2:]) {
		return 0, "", &closeError{code: wire.CloseInvalidPayload, reason: "invalid utf-8 in close reason"}
	}
	return code, string(p[2:]), nil
}

// failCode maps an error from a msgReader to the close code the connection
// is failed with; ok is false for I/O errors, which have none.
func failCode(err error) (code int, reason string, ok bool) {
	var ce *closeError
	var pe ws.ProtocolError
	switch {
	case errors.As(err, &ce):
		return ce.code, ce.reason, true
	case errors.Is(err, wsutil.ErrFrameTooLarge), errors.Is(err, wsutil.ErrMessageTooLarge):
		return wire.CloseTooBig, "message too big", true
	case errors.Is(err, wsutil.ErrInvalidUTF8):
		return wire.CloseInvalidPayload, "invalid utf-8", true
	case errors.As(err, &pe):
		return wire.CloseProtocolError, pe.Error(), true
	case errors.Is(err, ws.ErrHeaderLengthMSB), errors.Is(err, ws.ErrHeaderLengthUnexpected):
		return wire.CloseProtocolError, "bad frame length", true
	}
	return 0, "", false
}

// msgReader reads whole data messages from the client side of a WebSocket
// stream, enforcing the size limit and UTF-8 validity of text, and hands
// every control frame (also those between fragments) to control.
type msgReader struct {
	rd      wsutil.Reader
	control func(op ws.OpCode, payload []byte) error
	await   func() error // if set, called before each frame between messages
	ctl     [ws.MaxControlFramePayloadSize]byte
}

func newMsgReader(src io.Reader, limit int64, control func(ws.OpCode, []byte) error) *msgReader {
	m := &msgReader{control: control}
	m.rd = wsutil.Reader{
		Source:         src,
		State:          ws.StateServerSide,
		CheckUTF8:      true,
		MaxFrameSize:   limit,
		MaxMessageSize: limit,
		OnIntermediate: m.intermediate,
	}
	return m
}

// intermediate handles a control frame that arrived between the fragments
// of a message.
func (m *msgReader) intermediate(h ws.Header, r io.Reader) error {
	p := m.ctl[:h.Length]
	if _, err := io.ReadFull(r, p); err != nil {
		return truncated(err)
	}
	return m.control(h.OpCode, p)
}

// truncated turns io.EOF met inside a frame into io.ErrUnexpectedEOF: an
// io.EOF coming out of wsutil.Reader.Read means the message is complete.
func truncated(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// next returns the next complete data message. The payload is freshly
// allocated. An error from control ends the read and is returned as is.
func (m *msgReader) next() (op ws.OpCode, data []byte, err error) {
	for {
		if m.await != nil {
			if err := m.await(); err != nil {
				return 0, nil, err
			}
		}
		h, err := m.rd.NextFrame()
		if err != nil {
			return 0, nil, err
		}
		if h.OpCode.IsControl() {
			p := m.ctl[:h.Length]
			if _, err := io.ReadFull(&m.rd, p); err != nil {
				return 0, nil, truncated(err)
			}
			if err := m.control(h.OpCode, p); err != nil {
				return 0, nil, err
			}
			continue
		}
		data, err := readPayload(&m.rd, h.Length)
		return h.OpCode, data, err
	}
}

// readPayload reads r to io.EOF. declared, the peer-declared length of the
// first frame, sizes the buffer up to preallocLimit; beyond that the buffer
// grows as bytes arrive.
func readPayload(r io.Reader, declared int64) ([]byte, error) {
	buf := make([]byte, 0, min(declared, preallocLimit))
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
