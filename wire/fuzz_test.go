package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzParseResize checks ParseResize against the reference rule, and that
// an accepted size encodes back to a frame that parses to it.
func FuzzParseResize(f *testing.F) {
	for _, s := range []string{"\x1b[RESIZE:120;40]", "\x1b[RESIZE:0;0]", "\x1b[RESIZE:+1;1]", "\x1b[RESIZE:99999999999999999999;1]", "abc"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		cols, rows, ok := ParseResize(frame)
		rc, rr, rok := refParseResize(frame)
		if cols != rc || rows != rr || ok != rok {
			t.Fatalf("ParseResize(%q) = %d, %d, %v; the rule says %d, %d, %v", frame, cols, rows, ok, rc, rr, rok)
		}
		if !ok {
			return
		}
		if !IsResize(frame) {
			t.Fatalf("accepted %q, which IsResize does not take for a resize", frame)
		}
		if c, r, ok := ParseResize(EncodeResize(cols, rows)); !ok || c != cols || r != rows {
			t.Fatalf("EncodeResize(%d, %d) parses as %d, %d, %v", cols, rows, c, r, ok)
		}
	})
}

// FuzzDecodeEnvelope checks that a decoded envelope is one of the three
// shapes, and that encoding it again decodes to the same envelope.
func FuzzDecodeEnvelope(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"result":{}}`,
		`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}`,
		`{"jsonrpc":"2.0","method":"event","params":{"type":"message.delta","session_id":"0123abcd","seq":1,"payload":{"text":"a"}}}`,
		`{"jsonrpc":"2.0","id":"x","method":"session.list"}`,
		`[1,2]`, `{`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		m, err := DecodeEnvelope(frame)
		if err != nil {
			return
		}
		request := m.Method != ""
		if request == m.IsResponse() {
			t.Fatalf("%q decoded as %+v: a request and a response, or neither", frame, m)
		}
		if m.IsEvent() {
			_, _ = m.Event() // must not panic
		}
		re := map[string]any{"jsonrpc": m.JSONRPC}
		if m.ID != nil {
			re["id"] = m.ID
		}
		if m.Method != "" {
			re["method"] = m.Method
		}
		if m.Params != nil {
			re["params"] = m.Params
		}
		if m.Result != nil {
			re["result"] = m.Result
		}
		if m.Error != nil {
			re["error"] = m.Error
		}
		b, err := json.Marshal(re)
		if err != nil {
			t.Fatalf("encoding %+v: %v", m, err)
		}
		m2, err := DecodeEnvelope(b)
		if err != nil {
			t.Fatalf("%q decoded, its encoding %s does not: %v", frame, b, err)
		}
		if !sameEnvelope(m, m2) {
			t.Fatalf("%q: decoded %+v, again %+v", frame, m, m2)
		}
	})
}

// sameEnvelope compares envelopes with raw members compared as JSON
// values (encoding them again may re-space or re-escape them).
func sameEnvelope(a, b Envelope) bool {
	same := func(x, y json.RawMessage) bool {
		if x == nil || y == nil {
			return x == nil && y == nil
		}
		var vx, vy any
		dx, dy := json.NewDecoder(bytes.NewReader(x)), json.NewDecoder(bytes.NewReader(y))
		dx.UseNumber()
		dy.UseNumber()
		return dx.Decode(&vx) == nil && dy.Decode(&vy) == nil && reflect.DeepEqual(vx, vy)
	}
	if a.JSONRPC != b.JSONRPC || a.Method != b.Method || !same(a.ID, b.ID) || !same(a.Params, b.Params) || !same(a.Result, b.Result) {
		return false
	}
	if (a.Error == nil) != (b.Error == nil) {
		return false
	}
	return a.Error == nil || a.Error.Code == b.Error.Code && a.Error.Message == b.Error.Message && same(a.Error.Data, b.Error.Data)
}

// FuzzDecodeReplay checks that an accepted pty.replay header is valid and
// survives encoding.
func FuzzDecodeReplay(f *testing.F) {
	for _, s := range []string{
		`{"type":"pty.replay","epoch":"e1","start_offset":0,"replay_end_offset":5,"reset":true,"reason":"initial"}`,
		`{"type":"pty.replay","epoch":"e1","start_offset":3,"replay_end_offset":10,"reset":false,"reason":"resume"}`,
		`{"type":"pty.replay","epoch":"e1","start_offset":9,"replay_end_offset":9,"reset":true,"reason":"epoch_mismatch","snapshot":true,"snapshot_bytes":12,"cols":80,"rows":24}`,
		`{"type":"pty.replay"}`, `{}`, `"pty.replay"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		r, err := DecodeReplay(frame)
		if err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("DecodeReplay accepted %q: %v", frame, err)
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := DecodeReplay(b)
		if err != nil || !reflect.DeepEqual(r, r2) {
			t.Fatalf("%q: %+v encodes as %s, which decodes as %+v, %v", frame, r, b, r2, err)
		}
	})
}
