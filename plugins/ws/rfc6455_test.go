package ws_test

// RFC 6455 conformance of the WebSocket transport, written from the RFC
// (the Autobahn suite needs Python 2 and cannot run here). Each test talks
// to an in-process Server over real TCP with hand-built frames, so that it
// can send what no well-behaved client library would: reserved bits,
// unknown opcodes, unmasked frames, oversized or fragmented control frames,
// invalid close codes.
//
// The rule checked throughout (RFC 6455 §7.1.7, §7.4.1): a protocol error
// is answered with a close frame carrying its code — 1002 for framing,
// 1007 for invalid UTF-8, 1009 for a message over the limit (the protocol's limits) —
// read here from the raw socket, never with a silently dropped TCP
// connection; after the close frame the server closes its side of TCP.
//
// Section numbers in names and comments are those of RFC 6455.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	gobws "github.com/gobwas/ws"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// rfcLimit is the transport's default message limit (the protocol's limit: 1 MiB).
const rfcLimit = 1 << 20

// rfcFrame is one frame as a client puts it on the wire. A zero rsv and a
// false unmasked give a well-formed masked client frame.
type rfcFrame struct {
	op       gobws.OpCode
	fin      bool
	rsv      byte // RSV1..RSV3 as bits 4, 2, 1 (gobws.Header.Rsv)
	unmasked bool
	p        []byte
}

// rfcBytes encodes f with a fresh mask (unless unmasked).
func rfcBytes(f rfcFrame) []byte {
	h := gobws.Header{Fin: f.fin, Rsv: f.rsv, OpCode: f.op, Length: int64(len(f.p)), Masked: !f.unmasked}
	p := bytes.Clone(f.p)
	if h.Masked {
		h.Mask = gobws.NewMask()
		gobws.Cipher(p, h.Mask, 0)
	}
	var b bytes.Buffer
	if err := gobws.WriteHeader(&b, h); err != nil {
		panic(err) // only for a length over 2^63, which no test builds
	}
	b.Write(p)
	return b.Bytes()
}

// rfcStream encodes frames back to back.
func rfcStream(frames ...rfcFrame) []byte {
	var b []byte
	for _, f := range frames {
		b = append(b, rfcBytes(f)...)
	}
	return b
}

// Shorthands for well-formed masked frames.
func rfcText(fin bool, p string) rfcFrame { return rfcFrame{op: gobws.OpText, fin: fin, p: []byte(p)} }
func rfcBin(fin bool, p []byte) rfcFrame  { return rfcFrame{op: gobws.OpBinary, fin: fin, p: p} }
func rfcCont(fin bool, p string) rfcFrame {
	return rfcFrame{op: gobws.OpContinuation, fin: fin, p: []byte(p)}
}
func rfcPing(p string) rfcFrame { return rfcFrame{op: gobws.OpPing, fin: true, p: []byte(p)} }
func rfcPong(p string) rfcFrame { return rfcFrame{op: gobws.OpPong, fin: true, p: []byte(p)} }
func rfcClose(code int, r string) rfcFrame {
	return rfcFrame{op: gobws.OpClose, fin: true, p: closePayload(code, r)}
}
func rfcCloseRaw(p []byte) rfcFrame            { return rfcFrame{op: gobws.OpClose, fin: true, p: p} }
func rfcOp(op gobws.OpCode, p string) rfcFrame { return rfcFrame{op: op, fin: true, p: []byte(p)} }

// rfcFragments splits p into n fragments of a message of opcode op
// (n ≥ 1; fragments may be empty when n > len(p)).
func rfcFragments(op gobws.OpCode, p []byte, n int) []rfcFrame {
	frames := make([]rfcFrame, n)
	for i := range n {
		lo, hi := len(p)*i/n, len(p)*(i+1)/n
		o := gobws.OpContinuation
		if i == 0 {
			o = op
		}
		frames[i] = rfcFrame{op: o, fin: i == n-1, p: p[lo:hi]}
	}
	return frames
}

// rfcSetup is one admitted connection to a shared server.
type rfcSetup struct {
	t  *testing.T
	r  *recorder
	c  *client
	id uint64
}

// rfcServer is a Server with the default limits of the protocol and a recorder
// linked to it.
type rfcServer struct {
	addr string
	exec func(testing.TB, ...contract.Command)
	r    *recorder
}

func newRFCServer(t *testing.T) *rfcServer {
	t.Helper()
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)
	return &rfcServer{
		addr: addr,
		exec: func(tb testing.TB, cmds ...contract.Command) { tb.Helper(); exec(tb, s, cmds...) },
		r:    r,
	}
}

// open dials /api/ws and admits the connection.
func (rs *rfcServer) open(t *testing.T) *rfcSetup {
	t.Helper()
	// Only events after this point can be this connection's: a local
	// port may be reused by a later connection, so the first Opened event
	// from the same address may be an earlier connection's.
	rs.r.mu.Lock()
	from := len(rs.r.events)
	rs.r.mu.Unlock()
	c := dial(t, rs.addr, "/api/ws", nil)
	local := c.nc.LocalAddr().String()
	id := rs.r.waitFrom(t, "opened from "+local, from, func(e contract.Event) bool {
		return e.Kind == contract.EventOpened && e.Remote == local
	}).Conn
	rs.exec(t, admit(id))
	return &rfcSetup{t: t, r: rs.r, c: c, id: id}
}

// send writes frames to the socket, failing the test on an error.
func (x *rfcSetup) send(frames ...rfcFrame) {
	x.t.Helper()
	if _, err := x.c.nc.Write(rfcStream(frames...)); err != nil {
		x.t.Fatalf("client write: %v", err)
	}
}

// sendAsync writes b from a goroutine, tolerating errors: the server may
// fail the connection before it has read everything. wait waits for the
// write to end (closing the socket first if it is stuck).
func (x *rfcSetup) sendAsync(b []byte) (wait func()) {
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = x.c.nc.Write(b) })
	return func() {
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(waitTimeout):
			x.c.nc.Close()
			<-done
		}
	}
}

// message waits for the next data message the server reports for this
// connection after index from, and returns it and the index after it.
func (x *rfcSetup) message(from int) (contract.Event, int) {
	x.t.Helper()
	e, i := x.r.waitIndex(x.t, fmt.Sprintf("frame of conn %d", x.id), from, func(e contract.Event) bool {
		return e.Conn == x.id && (e.Kind == contract.EventFrame || e.Kind == contract.EventClosed)
	})
	if e.Kind == contract.EventClosed {
		x.t.Fatalf("conn %d closed with %d %q, want a message", x.id, e.Code, e.Reason)
	}
	return e, i + 1
}

// readControl reads the next frame and checks that it is a control frame
// of opcode op with payload want.
func (x *rfcSetup) readControl(op gobws.OpCode, want []byte) {
	x.t.Helper()
	f, err := x.c.readFrame()
	if err != nil {
		x.t.Fatalf("client: waiting for %v: %v", op, err)
	}
	if f.Header.OpCode != op || !bytes.Equal(f.Payload, want) {
		x.t.Fatalf("client: got %v %q, want %v %q", f.Header.OpCode, rfcShort(f.Payload), op, rfcShort(want))
	}
	if !f.Header.Fin || f.Header.Rsv != 0 || f.Header.Masked {
		x.t.Errorf("client: %v frame with fin=%v rsv=%d masked=%v, want a final, unmasked frame without reserved bits (§5.1, §5.2)",
			op, f.Header.Fin, f.Header.Rsv, f.Header.Masked)
	}
}

// expectClose reads frames until the server's close frame (only pongs may
// come before it), checks its code, echoes it, and checks that the server
// then ends TCP (§7.1.1: the server closes the TCP connection first) and
// that the Closed event carries the same code.
func (x *rfcSetup) expectClose(want int) (reason string) {
	x.t.Helper()
	var code int
	for {
		f, err := x.c.readFrame()
		if err != nil {
			x.t.Fatalf("client: got %v, want a close frame with %d: the server must not drop TCP silently (§7.1.7)", err, want)
		}
		if f.Header.OpCode == gobws.OpPong {
			continue
		}
		if f.Header.OpCode != gobws.OpClose {
			x.t.Fatalf("client: got %v %q, want a close frame with %d", f.Header.OpCode, rfcShort(f.Payload), want)
		}
		if len(f.Payload) > gobws.MaxControlFramePayloadSize {
			x.t.Errorf("close frame of %d bytes, over 125 (§5.5)", len(f.Payload))
		}
		code, reason = closeCode(f.Payload)
		break
	}
	if code != want {
		x.t.Errorf("close frame: got code %d %q, want %d", code, reason, want)
	}
	_ = x.c.write(gobws.OpClose, true, closePayload(code, ""))
	x.expectTCPEnd()
	x.c.nc.Close() // the client's half of the close (§7.1.1)
	if e := x.r.closed(x.t, x.id); e.Code != want {
		x.t.Errorf("Closed event: got %d %q, want %d", e.Code, e.Reason, want)
	}
	return reason
}

// expectTCPEnd checks that the server ends the TCP stream with nothing
// more after its close frame.
func (x *rfcSetup) expectTCPEnd() {
	x.t.Helper()
	f, err := x.c.readFrame()
	if err == nil {
		x.t.Fatalf("after the close frame got %v %q, want the end of TCP (§5.5.1: nothing follows a close)", f.Header.OpCode, rfcShort(f.Payload))
	}
	if !isNetClosed(err) && !strings.Contains(err.Error(), "connection reset") {
		x.t.Fatalf("after the close frame: got %v, want the server to close TCP", err)
	}
}

// noMessage checks that the server reported no data message for the conn.
func (x *rfcSetup) noMessage() {
	x.t.Helper()
	if x.r.has(isFrame(x.id)) {
		for _, e := range x.r.forConn(x.id) {
			if e.Kind == contract.EventFrame {
				x.t.Errorf("got a message of %d bytes (%q), want none", len(e.Data), rfcShort(e.Data))
			}
		}
	}
}

func rfcOpName(op gobws.OpCode) string {
	switch op {
	case gobws.OpContinuation:
		return "continuation"
	case gobws.OpText:
		return "text"
	case gobws.OpBinary:
		return "binary"
	case gobws.OpClose:
		return "close"
	case gobws.OpPing:
		return "ping"
	case gobws.OpPong:
		return "pong"
	}
	return fmt.Sprintf("opcode %#x", byte(op))
}

func rfcShort(p []byte) string {
	if len(p) > 40 {
		return fmt.Sprintf("%q… (%d bytes)", p[:40], len(p))
	}
	return fmt.Sprintf("%q", p)
}

// TestRFC6455Fragmentation: §5.4 — a message may be split into any number
// of fragments, the first with the message's opcode and the others
// continuation frames, the last with FIN; the server delivers it whole.
// Text is validated as a whole (§8.1), so a code point may be split between
// fragments.
func TestRFC6455Fragmentation(t *testing.T) {
	rs := newRFCServer(t)
	bin := make([]byte, 70000)
	for i := range bin {
		bin[i] = byte(i * 7)
	}
	text := strings.Repeat("héllo wörld ✓ 𝄞 ", 500)
	atLimit := bytes.Repeat([]byte("x"), rfcLimit)
	tests := []struct {
		name   string
		op     gobws.OpCode
		p      []byte
		frames int
	}{
		{"text in 2", gobws.OpText, []byte("hello"), 2},
		{"text in 5", gobws.OpText, []byte(text), 5},
		{"text in 1000", gobws.OpText, []byte(text), 1000},
		{"text with empty fragments", gobws.OpText, []byte("ab"), 7},
		{"empty text in 3 empty fragments", gobws.OpText, nil, 3},
		{"binary in 2", gobws.OpBinary, bin[:10], 2},
		{"binary in 300", gobws.OpBinary, bin, 300},
		{"binary with empty fragments", gobws.OpBinary, []byte{0, 0xff}, 9},
		{"text of exactly the limit in 16", gobws.OpText, atLimit, 16},
		{"binary of exactly the limit in 1024", gobws.OpBinary, atLimit, 1024},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := rs.open(t)
			wait := x.sendAsync(rfcStream(rfcFragments(tt.op, tt.p, tt.frames)...))
			e, _ := x.message(0)
			wait()
			if e.Binary != (tt.op == gobws.OpBinary) || !bytes.Equal(e.Data, tt.p) {
				t.Fatalf("message: got binary=%v %s, want binary=%v %s", e.Binary, rfcShort(e.Data), tt.op == gobws.OpBinary, rfcShort(tt.p))
			}
		})
	}

	// Every multi-byte code point split at every inner position, the
	// pieces in separate fragments (§5.6, §8.1).
	t.Run("code points split across fragments", func(t *testing.T) {
		x := rs.open(t)
		next := 0
		for _, r := range []string{"é", "€", "✓", "𝄞", "\U0010FFFF"} {
			msg := "<" + r + ">"
			for cut := 2; cut < 1+len(r); cut++ {
				x.send(rfcText(false, msg[:cut]), rfcCont(true, msg[cut:]))
				var e contract.Event
				e, next = x.message(next)
				if string(e.Data) != msg || e.Binary {
					t.Fatalf("%q cut at %d: got %q, want text %q", msg, cut, e.Data, msg)
				}
			}
			// One byte per fragment.
			var frames []rfcFrame
			for i := range len(msg) {
				op := gobws.OpContinuation
				if i == 0 {
					op = gobws.OpText
				}
				frames = append(frames, rfcFrame{op: op, fin: i == len(msg)-1, p: []byte{msg[i]}})
			}
			x.send(frames...)
			var e contract.Event
			e, next = x.message(next)
			if string(e.Data) != msg {
				t.Fatalf("%q byte by byte: got %q", msg, e.Data)
			}
		}
	})

	// Messages follow each other on one connection: a fragmented one
	// between two whole ones.
	t.Run("messages in order", func(t *testing.T) {
		x := rs.open(t)
		frames := []rfcFrame{rfcText(true, "one")}
		frames = append(frames, rfcFragments(gobws.OpBinary, []byte("two"), 3)...)
		frames = append(frames, rfcText(true, "three"))
		x.send(frames...)
		next := 0
		for _, want := range []string{"one", "two", "three"} {
			var e contract.Event
			e, next = x.message(next)
			if string(e.Data) != want {
				t.Fatalf("got %q, want %q", e.Data, want)
			}
		}
	})
}

// TestRFC6455ControlFrames: §5.5 — control frames may be injected between
// the fragments of a message (§5.4); a ping is answered with a pong with
// the same application data (§5.5.2, §5.5.3), also in the middle of a
// fragmented message, before the message is complete; an unsolicited pong
// is ignored; payloads up to 125 bytes are allowed.
func TestRFC6455ControlFrames(t *testing.T) {
	rs := newRFCServer(t)

	t.Run("ping payload sizes", func(t *testing.T) {
		x := rs.open(t)
		for _, n := range []int{0, 1, 2, 64, 124, 125} {
			p := bytes.Repeat([]byte{byte('a' + n%26)}, n)
			x.send(rfcFrame{op: gobws.OpPing, fin: true, p: p})
			x.readControl(gobws.OpPong, p)
		}
		// Binary application data is echoed byte for byte.
		p := []byte{0, 0xff, 0x80, 0xfe, 0x01}
		x.send(rfcFrame{op: gobws.OpPing, fin: true, p: p})
		x.readControl(gobws.OpPong, p)
	})

	t.Run("pongs of 0 to 125 bytes are ignored", func(t *testing.T) {
		x := rs.open(t)
		x.send(rfcPong(""), rfcPong(strings.Repeat("p", 125)), rfcText(true, "after"))
		if e, _ := x.message(0); string(e.Data) != "after" {
			t.Fatalf("got %q, want %q", e.Data, "after")
		}
	})

	for _, op := range []gobws.OpCode{gobws.OpText, gobws.OpBinary} {
		t.Run(fmt.Sprintf("pings between the fragments of a %s message", rfcOpName(op)), func(t *testing.T) {
			x := rs.open(t)
			// Lock step: each ping is answered before the next fragment
			// is sent, so the server answers in the middle of the
			// message rather than after it.
			var want []byte
			const n = 20
			for i := range n {
				frag := fmt.Sprintf("part%02d|", i)
				want = append(want, frag...)
				o := gobws.OpContinuation
				if i == 0 {
					o = op
				}
				x.send(rfcFrame{op: o, fin: i == n-1, p: []byte(frag)})
				if i == n-1 {
					break
				}
				ping := fmt.Sprintf("ping %d %s", i, strings.Repeat("·", i*3)) // up to 125 bytes
				if len(ping) > 125 {
					ping = ping[:125]
				}
				x.send(rfcPing(ping))
				x.readControl(gobws.OpPong, []byte(ping))
				if x.r.has(isFrame(x.id)) {
					t.Fatalf("after fragment %d: the message was delivered before its last fragment", i)
				}
			}
			e, _ := x.message(0)
			if !bytes.Equal(e.Data, want) || e.Binary != (op == gobws.OpBinary) {
				t.Fatalf("message: got binary=%v %q, want binary=%v %q", e.Binary, e.Data, op == gobws.OpBinary, want)
			}
		})
	}

	t.Run("125-byte ping and a pong between fragments", func(t *testing.T) {
		x := rs.open(t)
		ping := strings.Repeat("z", 125)
		x.send(rfcText(false, "a"), rfcPong("unsolicited"), rfcPing(ping), rfcCont(false, "b"), rfcPong(""), rfcCont(true, "c"))
		x.readControl(gobws.OpPong, []byte(ping))
		if e, _ := x.message(0); string(e.Data) != "abc" {
			t.Fatalf("got %q, want %q", e.Data, "abc")
		}
	})
}

// TestRFC6455ProtocolErrors: every way a client breaks the framing rules
// fails the connection with a close frame carrying the right code, and
// the broken message is never delivered.
func TestRFC6455ProtocolErrors(t *testing.T) {
	rs := newRFCServer(t)
	const (
		protocol = wire.CloseProtocolError  // 1002
		utf8     = wire.CloseInvalidPayload // 1007
		tooBig   = wire.CloseTooBig         // 1009
	)
	long := strings.Repeat("x", 126)
	type test struct {
		name   string
		stream []byte
		want   int
	}
	tests := []test{
		// §5.5: control frames carry at most 125 bytes and are not
		// fragmented.
		{"ping of 126 bytes", rfcStream(rfcPing(long)), protocol},
		{"pong of 126 bytes", rfcStream(rfcPong(long)), protocol},
		{"close of 126 bytes", rfcStream(rfcClose(1000, long[:124])), protocol},
		{"ping of 126 bytes between fragments", rfcStream(rfcText(false, "a"), rfcPing(long)), protocol},
		{"ping of 65536 bytes", rfcStream(rfcFrame{op: gobws.OpPing, fin: true, p: make([]byte, 65536)}), protocol},
		{"fragmented ping", rfcStream(rfcFrame{op: gobws.OpPing, p: []byte("a")}, rfcCont(true, "b")), protocol},
		{"fragmented pong", rfcStream(rfcFrame{op: gobws.OpPong, p: []byte("a")}, rfcCont(true, "b")), protocol},
		{"fragmented close", rfcStream(rfcFrame{op: gobws.OpClose, p: closePayload(1000, "")}, rfcCont(true, "")), protocol},
		{"fragmented ping between fragments", rfcStream(rfcText(false, "a"), rfcFrame{op: gobws.OpPing, p: []byte("p")}), protocol},

		// §5.4: continuation frames only inside a fragmented message, and
		// no new data frame before it ends.
		{"continuation without a start", rfcStream(rfcCont(true, "x")), protocol},
		{"non-final continuation without a start", rfcStream(rfcCont(false, "x")), protocol},
		{"continuation after a complete message", rfcStream(rfcText(true, "done"), rfcCont(true, "x")), protocol},
		{"text inside a fragmented text", rfcStream(rfcText(false, "a"), rfcText(true, "b")), protocol},
		{"binary inside a fragmented text", rfcStream(rfcText(false, "a"), rfcBin(true, []byte("b"))), protocol},
		{"text inside a fragmented binary", rfcStream(rfcBin(false, []byte("a")), rfcCont(false, "b"), rfcText(false, "c")), protocol},
		{"binary inside a fragmented binary", rfcStream(rfcBin(false, []byte("a")), rfcBin(true, []byte("b"))), protocol},

		// §5.3: a client masks every frame.
		{"unmasked text", rfcStream(rfcFrame{op: gobws.OpText, fin: true, unmasked: true, p: []byte("hi")}), protocol},
		{"unmasked binary", rfcStream(rfcFrame{op: gobws.OpBinary, fin: true, unmasked: true, p: []byte("hi")}), protocol},
		{"unmasked ping", rfcStream(rfcFrame{op: gobws.OpPing, fin: true, unmasked: true}), protocol},
		{"unmasked close", rfcStream(rfcFrame{op: gobws.OpClose, fin: true, unmasked: true, p: closePayload(1000, "")}), protocol},
		{"unmasked continuation", rfcStream(rfcText(false, "a"), rfcFrame{op: gobws.OpContinuation, fin: true, unmasked: true, p: []byte("b")}), protocol},

		// §5.2: a 64-bit length has its most significant bit clear.
		{"64-bit length with the top bit set", []byte{0x82, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4}, protocol},

		// §5.6, §8.1: text is UTF-8; a close reason too (§7.1.6).
		{"invalid UTF-8 in one frame", rfcStream(rfcText(true, "ok \xff")), utf8},
		{"overlong encoding", rfcStream(rfcText(true, "\xc0\xaf")), utf8},
		{"surrogate code point", rfcStream(rfcText(true, "\xed\xa0\x80")), utf8},
		{"code point above U+10FFFF", rfcStream(rfcText(true, "\xf4\x90\x80\x80")), utf8},
		{"invalid sequence split across fragments", rfcStream(rfcText(false, "ok \xc3"), rfcCont(true, "(")), utf8},
		{"invalid 4-byte sequence split over three fragments", rfcStream(rfcText(false, "\xf0"), rfcCont(false, "\x9d"), rfcCont(true, "\x84(")), utf8},
		{"code point cut by the end of the message", rfcStream(rfcText(false, "ok"), rfcCont(true, "\xe2\x82")), utf8},
		{"invalid byte in a later fragment", rfcStream(rfcText(false, "fine"), rfcCont(false, "still fine"), rfcCont(true, "\xfe")), utf8},
		{"invalid UTF-8 with a ping between fragments", rfcStream(rfcText(false, "\xe2"), rfcPing("p"), rfcCont(true, "\x28\xa1")), utf8},
		{"close reason not UTF-8", rfcStream(rfcClose(1000, "bye \xff")), utf8},
		{"close reason cut mid code point", rfcStream(rfcClose(1000, "\xe2\x82")), utf8},

		// The protocol's limit: a message over 1 MiB, whole or in fragments.
		{"text of the limit + 1 in one frame", rfcStream(rfcFrame{op: gobws.OpText, fin: true, p: bytes.Repeat([]byte("a"), rfcLimit+1)}), tooBig},
		{"text of the limit + 1 in 17 fragments", rfcStream(rfcFragments(gobws.OpText, bytes.Repeat([]byte("a"), rfcLimit+1), 17)...), tooBig},
		{"text of 2 MiB in 1024 fragments", rfcStream(rfcFragments(gobws.OpText, bytes.Repeat([]byte("é"), rfcLimit), 1024)...), tooBig},
		{"binary of the limit + 1 in 2 fragments", rfcStream(rfcFragments(gobws.OpBinary, make([]byte, rfcLimit+1), 2)...), tooBig},
		{"declared length of 2^62", []byte{0x82, 0xff, 0x40, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4}, tooBig},
	}

	// §5.2: reserved bits without a negotiated extension (none is ever
	// negotiated here), on every kind of frame.
	for _, rsv := range []byte{4, 2, 1, 7} {
		for _, f := range []rfcFrame{rfcText(true, "x"), rfcBin(true, []byte("x")), rfcPing("x"), rfcPong("x"), rfcClose(1000, "")} {
			f.rsv = rsv
			tests = append(tests, test{fmt.Sprintf("rsv %03b on %s", rsv, rfcOpName(f.op)), rfcStream(f), protocol})
		}
		c := rfcCont(true, "y")
		c.rsv = rsv
		tests = append(tests, test{fmt.Sprintf("rsv %03b on a continuation", rsv), rfcStream(rfcText(false, "x"), c), protocol})
	}
	// §5.2: opcodes 3-7 and 0xB-0xF are reserved, alone and between
	// fragments.
	for _, op := range []gobws.OpCode{3, 4, 5, 6, 7, 0xb, 0xc, 0xd, 0xe, 0xf} {
		tests = append(tests,
			test{fmt.Sprintf("opcode %#x", byte(op)), rfcStream(rfcOp(op, "x")), protocol},
			test{fmt.Sprintf("opcode %#x without payload", byte(op)), rfcStream(rfcOp(op, "")), protocol},
			test{fmt.Sprintf("opcode %#x between fragments", byte(op)), rfcStream(rfcText(false, "a"), rfcOp(op, "x")), protocol},
		)
	}
	// §7.1.5, §7.4: a close payload is empty or a 2-byte code plus a
	// UTF-8 reason; codes below 1000, 1004-1006, 1015, 1016-2999 and
	// 5000 up are not to be sent by an endpoint.
	tests = append(tests, test{"close payload of 1 byte", rfcStream(rfcCloseRaw([]byte{0x03})), protocol})
	for _, code := range []int{0, 1, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535} {
		tests = append(tests, test{fmt.Sprintf("close code %d", code), rfcStream(rfcClose(code, "")), protocol})
	}
	tests = append(tests, test{"close code 1005 between fragments", rfcStream(rfcText(false, "a"), rfcClose(1005, "")), protocol})

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := rs.open(t)
			wait := x.sendAsync(tt.stream)
			x.expectClose(tt.want)
			wait()
			// The close frame was the failure, not an echo of a close
			// the client never finished sending.
			if r := x.r.forConn(x.id); len(r) > 0 && r[len(r)-1].Kind != contract.EventClosed {
				t.Errorf("last event %v, want Closed", r[len(r)-1].Kind)
			}
			if tt.name != "continuation after a complete message" {
				x.noMessage()
			}
		})
	}

	// A failure after complete messages delivers those and nothing of
	// the broken one.
	t.Run("messages before the error are delivered", func(t *testing.T) {
		x := rs.open(t)
		x.send(rfcText(true, "first"), rfcBin(false, []byte("sec")), rfcCont(true, "ond"), rfcText(false, "bro"), rfcCont(true, "ken \xff"))
		x.expectClose(utf8)
		var got []string
		for _, e := range x.r.forConn(x.id) {
			if e.Kind == contract.EventFrame {
				got = append(got, string(e.Data))
			}
		}
		if strings.Join(got, ",") != "first,second" {
			t.Errorf("messages: got %q, want [first second]", got)
		}
	})
}

// TestRFC6455CloseHandshake: §5.5.1, §7.1 — a client's close frame is
// answered with a close frame echoing its status code (and here its
// reason), then the server closes TCP; an empty close is answered with an
// empty one; nothing the client sends after its close is delivered.
func TestRFC6455CloseHandshake(t *testing.T) {
	rs := newRFCServer(t)
	reason123 := strings.Repeat("r", 123)
	utf8Reason := strings.Repeat("é", 61) + "!" // 123 bytes
	tests := []struct {
		name   string
		code   int
		reason string
	}{
		{"1000 with a reason", 1000, "bye"},
		{"1000 without reason", 1000, ""},
		{"1001", 1001, "going away"},
		{"1002", 1002, ""},
		{"1003", 1003, "unsupported"},
		{"1007", 1007, ""},
		{"1008", 1008, "policy"},
		{"1009", 1009, ""},
		{"1010", 1010, "extension"},
		{"1011", 1011, ""},
		{"1012", 1012, ""},
		{"1013", 1013, ""},
		{"1014", 1014, ""},
		{"3000", 3000, "registered"},
		{"3999", 3999, ""},
		{"4000", 4000, "private"},
		{"4999", 4999, ""},
		{"123-byte reason", 1000, reason123},
		{"UTF-8 reason", 4001, utf8Reason},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := rs.open(t)
			x.send(rfcClose(tt.code, tt.reason))
			x.readControl(gobws.OpClose, closePayload(tt.code, tt.reason))
			// The server ends TCP after its echo, without waiting for
			// the client to.
			x.expectTCPEnd()
			e := x.r.closed(t, x.id)
			if e.Code != tt.code || e.Reason != tt.reason {
				t.Errorf("Closed event: got %d %q, want %d %q", e.Code, e.Reason, tt.code, tt.reason)
			}
		})
	}

	t.Run("empty close", func(t *testing.T) {
		x := rs.open(t)
		x.send(rfcCloseRaw(nil))
		x.readControl(gobws.OpClose, nil)
		x.expectTCPEnd()
		if e := x.r.closed(t, x.id); e.Code != 1005 {
			t.Errorf("Closed event: got %d, want 1005 (no status)", e.Code)
		}
	})

	t.Run("close between fragments", func(t *testing.T) {
		x := rs.open(t)
		x.send(rfcText(false, "never "), rfcClose(1000, "mid"), rfcCont(true, "finished"))
		x.readControl(gobws.OpClose, closePayload(1000, "mid"))
		x.expectTCPEnd()
		x.r.closed(t, x.id)
		x.noMessage()
	})

	t.Run("nothing after the close is delivered", func(t *testing.T) {
		x := rs.open(t)
		x.send(rfcText(true, "before"), rfcClose(1000, ""), rfcText(true, "after"), rfcPing("after"))
		x.readControl(gobws.OpClose, closePayload(1000, ""))
		x.expectTCPEnd()
		x.r.closed(t, x.id)
		var got []string
		for _, e := range x.r.forConn(x.id) {
			if e.Kind == contract.EventFrame {
				got = append(got, string(e.Data))
			}
		}
		if len(got) != 1 || got[0] != "before" {
			t.Errorf("messages: got %q, want [before]", got)
		}
	})

	t.Run("server-initiated close is completed by the client's echo", func(t *testing.T) {
		x := rs.open(t)
		rs.exec(t, contract.Command{Kind: contract.CommandClose, Conn: x.id, Code: 4409, Reason: "superseded"})
		x.readControl(gobws.OpClose, closePayload(4409, "superseded"))
		x.expectTCPEnd() // the server's half: FIN right after its close frame
		start := time.Now()
		_ = x.c.write(gobws.OpClose, true, closePayload(4409, ""))
		// The echo completes the handshake: the connection ends at once,
		// not when the close grace (1 s) runs out.
		if e := x.r.closed(t, x.id); e.Code != 4409 {
			t.Errorf("Closed event: got %d, want 4409", e.Code)
		}
		if d := time.Since(start); d > 900*time.Millisecond {
			t.Errorf("connection ended %v after the client's echo, want at once", d)
		}
	})
}

// TestRFC6455CloseCodesEncoding: the close frames the server sends itself
// carry a 2-byte big-endian code (§5.5.1) followed by valid UTF-8.
func TestRFC6455CloseCodesEncoding(t *testing.T) {
	rs := newRFCServer(t)
	x := rs.open(t)
	reason := strings.Repeat("ü", 80) // 160 bytes: must be cut on a rune boundary
	rs.exec(t, contract.Command{Kind: contract.CommandClose, Conn: x.id, Code: 4403, Reason: reason})
	f, err := x.c.readFrame()
	if err != nil || f.Header.OpCode != gobws.OpClose {
		t.Fatalf("got %v, %v; want a close frame", f.Header.OpCode, err)
	}
	if len(f.Payload) < 2 || len(f.Payload) > 125 {
		t.Fatalf("close payload of %d bytes, want 2..125", len(f.Payload))
	}
	if code := binary.BigEndian.Uint16(f.Payload); code != 4403 {
		t.Errorf("code %d, want 4403", code)
	}
	got := string(f.Payload[2:])
	if !strings.HasPrefix(reason, got) || !bytes.Equal([]byte(got), bytes.ToValidUTF8([]byte(got), nil)) {
		t.Errorf("reason %q is not a UTF-8 prefix of the one given", got)
	}
	_, _ = io.Copy(io.Discard, x.c.r) // until the server ends TCP
}
