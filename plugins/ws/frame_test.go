package ws

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gobwas/ws"

	"github.com/tether-agent/tether/wire"
)

func TestCloseBody(t *testing.T) {
	tests := []struct {
		name       string
		code       int
		reason     string
		wantReason string
	}{
		{
			name:       "plain",
			code:       4401,
			reason:     "unauthorized",
			wantReason: "unauthorized",
		},
		{
			name: "no status",
			code: wire.CloseNoStatus,
		},
		{
			name:       "long ascii is cut",
			code:       1000,
			reason:     strings.Repeat("a", 200),
			wantReason: strings.Repeat("a", 123),
		},
		{
			name:       "cut at a rune boundary",
			code:       1000,
			reason:     "a" + strings.Repeat("é", 100),
			wantReason: "a" + strings.Repeat("é", 61),
		},
		{
			name:       "invalid utf-8 dropped",
			code:       1011,
			reason:     "bad\xffbyte",
			wantReason: "badbyte",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := closeBody(nil, tt.code, tt.reason)
			if tt.code == wire.CloseNoStatus {
				if len(p) != 0 {
					t.Fatalf("got %d bytes, want an empty payload", len(p))
				}
				return
			}
			code, reason, err := parseClose(p)
			if err != nil {
				t.Fatalf("parseClose: %v", err)
			}
			if code != tt.code || reason != tt.wantReason {
				t.Errorf("got %d %q, want %d %q", code, reason, tt.code, tt.wantReason)
			}
		})
	}
}

func TestParseClose(t *testing.T) {
	tests := []struct {
		name     string
		payload  []byte
		wantCode int
		wantFail int // close code of the error, 0 for none
	}{
		{
			name:     "empty",
			wantCode: wire.CloseNoStatus,
		},
		{
			name:     "one byte",
			payload:  []byte{3},
			wantFail: 1002,
		},
		{
			name:     "normal",
			payload:  []byte{0x03, 0xe8, 'o', 'k'},
			wantCode: 1000,
		},
		{
			name:     "try again later",
			payload:  []byte{0x03, 0xf5},
			wantCode: 1013,
		},
		{
			name:     "reserved 1006",
			payload:  []byte{0x03, 0xee},
			wantFail: 1002,
		},
		{
			name:     "below 1000",
			payload:  []byte{0x00, 0x01},
			wantFail: 1002,
		},
		{
			name:     "above 4999",
			payload:  []byte{0x13, 0x88},
			wantFail: 1002,
		},
		{
			name:     "bad utf-8 reason",
			payload:  []byte{0x03, 0xe8, 0xff},
			wantFail: 1007,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, err := parseClose(tt.payload)
			if tt.wantFail != 0 {
				var ce *closeError
				if !errors.As(err, &ce) || ce.code != tt.wantFail {
					t.Errorf("got error %v, want a close error with code %d", err, tt.wantFail)
				}
				return
			}
			if err != nil || code != tt.wantCode {
				t.Errorf("got %d, %v, want %d, nil", code, err, tt.wantCode)
			}
		})
	}
}

// FuzzParseClose checks that whatever close payload a peer sends is either
// refused with a close code or parsed into something that encodes back
// to the same bytes.
func FuzzParseClose(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0x03, 0xe8})
	f.Add([]byte{0x11, 0x31, 'n', 'o'})
	f.Add([]byte{0x03, 0xee, 0xff})
	f.Fuzz(func(t *testing.T, p []byte) {
		if len(p) > ws.MaxControlFramePayloadSize {
			return // CheckHeader refuses such frames before they are parsed
		}
		code, reason, err := parseClose(p)
		if err != nil {
			if _, _, ok := failCode(err); !ok {
				t.Fatalf("parseClose error %v has no close code", err)
			}
			return
		}
		if code != wire.CloseNoStatus && !sendableCode(code) {
			t.Fatalf("parsed code %d, which may not be sent", code)
		}
		if !utf8.ValidString(reason) {
			t.Fatalf("parsed reason %q is not UTF-8", reason)
		}
		if got := closeBody(nil, code, reason); !bytes.Equal(got, p) {
			t.Fatalf("closeBody(parseClose(%x)) = %x, want the input back", p, got)
		}
	})
}

// FuzzCloseBody checks that any code and reason the host sends encode to a
// payload that fits a control frame and that a peer can parse.
func FuzzCloseBody(f *testing.F) {
	f.Add(4401, "unauthorized")
	f.Add(1000, strings.Repeat("é", 100))
	f.Add(1011, "bad\xff")
	f.Fuzz(func(t *testing.T, code int, reason string) {
		if !sendableCode(code) {
			return // hostClose replaces those
		}
		p := closeBody(nil, code, reason)
		if len(p) > ws.MaxControlFramePayloadSize {
			t.Fatalf("payload of %d bytes, want at most %d", len(p), ws.MaxControlFramePayloadSize)
		}
		gotCode, gotReason, err := parseClose(p)
		if err != nil {
			t.Fatalf("parseClose(closeBody(%d, %q)): %v", code, reason, err)
		}
		if gotCode != code {
			t.Fatalf("got code %d, want %d", gotCode, code)
		}
		if valid := strings.ToValidUTF8(reason, ""); !strings.HasPrefix(valid, gotReason) {
			t.Fatalf("got reason %q, want a prefix of %q", gotReason, valid)
		}
	})
}

// FuzzAppendHeader checks the server's frame headers against gobwas's
// header reader.
func FuzzAppendHeader(f *testing.F) {
	for _, n := range []int{0, 125, 126, 65535, 65536, 1 << 30} {
		f.Add(uint8(ws.OpText), n)
	}
	f.Fuzz(func(t *testing.T, op uint8, n int) {
		if n < 0 {
			return
		}
		code := ws.OpCode(op & 0x0f)
		h := appendHeader(nil, code, n)
		if len(h) > maxHeaderSize {
			t.Fatalf("header of %d bytes, want at most %d", len(h), maxHeaderSize)
		}
		got, err := ws.ReadHeader(bytes.NewReader(h))
		if err != nil {
			t.Fatalf("ReadHeader(%x): %v", h, err)
		}
		want := ws.Header{Fin: true, OpCode: code, Length: int64(n)}
		if got != want {
			t.Fatalf("ReadHeader(%x) = %+v, want %+v", h, got, want)
		}
	})
}

// FuzzMsgReader feeds arbitrary bytes to the message reader as a client's
// stream: it must never panic, never return a message over the limit or a
// text message that is not UTF-8, and every error it returns must be the
// end of input, a handled close, or one with a close code.
func FuzzMsgReader(f *testing.F) {
	mask := func(op ws.OpCode, fin bool, p string) []byte {
		fr := ws.MaskFrameInPlace(ws.NewFrame(op, fin, []byte(p)))
		b, err := ws.CompileFrame(fr)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	f.Add(mask(ws.OpText, true, "hello"))
	f.Add(append(mask(ws.OpBinary, false, "ab"), mask(ws.OpContinuation, true, "cd")...))
	f.Add(append(append(mask(ws.OpText, false, "x"), mask(ws.OpPing, true, "p")...), mask(ws.OpContinuation, true, "y")...))
	f.Add(mask(ws.OpClose, true, "\x03\xe8bye"))
	f.Add(mask(ws.OpText, true, "\xff"))
	f.Add([]byte{0x81, 0x02, 'h', 'i'})
	const limit = 64
	f.Fuzz(func(t *testing.T, stream []byte) {
		control := func(op ws.OpCode, p []byte) error {
			if len(p) > ws.MaxControlFramePayloadSize {
				t.Fatalf("control payload of %d bytes", len(p))
			}
			if op == ws.OpClose {
				if _, _, err := parseClose(p); err != nil {
					return err
				}
				return errPeerClosed
			}
			return nil
		}
		m := newMsgReader(bytes.NewReader(stream), limit, control)
		for {
			op, data, err := m.next()
			if err != nil {
				_, _, coded := failCode(err)
				if !coded && !errors.Is(err, errPeerClosed) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(data) > limit {
				t.Fatalf("message of %d bytes, over the limit %d", len(data), limit)
			}
			if op == ws.OpText && !utf8.Valid(data) {
				t.Fatalf("text message %q is not UTF-8", data)
			}
			if op != ws.OpText && op != ws.OpBinary {
				t.Fatalf("data message with opcode %v", op)
			}
		}
	})
}

func TestReadPayloadGrows(t *testing.T) {
	// A peer declaring a huge length gets no huge buffer up front.
	data := bytes.Repeat([]byte("z"), 3*preallocLimit+7)
	got, err := readPayload(bytes.NewReader(data), 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Errorf("got %d bytes, want %d", len(got), len(data))
	}
	if got, err := readPayload(bytes.NewReader(nil), 0); err != nil || len(got) != 0 {
		t.Errorf("empty: got %q, %v", got, err)
	}
}
