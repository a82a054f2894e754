package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/session"
)

// fuzzSep separates the frames of one fuzz input.
const fuzzSep = "\x1e"

// FuzzGatewayFrame feeds arbitrary data frames to a gateway connection over
// a real table and checks every frame it answers with. An input is one or
// more frames separated by fuzzSep; in a frame, $SID and $KEY stand for the
// runtime id and stored key of the last snapshot the connection received,
// so that a corpus entry can create a session and then act on it.
func FuzzGatewayFrame(f *testing.F) {
	seeds := []string{
		`{"jsonrpc":"2.0","id":1,"method":"session.list"}`,
		`{"jsonrpc":"2.0","id":1,"method":"session.create","params":{"title":"t"}}` + fuzzSep +
			`{"jsonrpc":"2.0","id":2,"method":"prompt.submit","params":{"session_id":"$SID","text":"a b c"}}` + fuzzSep +
			`{"jsonrpc":"2.0","id":3,"method":"prompt.submit","params":{"session_id":"$SID","text":"again"}}` + fuzzSep +
			`{"jsonrpc":"2.0","id":4,"method":"session.events.since","params":{"session_id":"$SID","last_seen":0}}` + fuzzSep +
			`{"jsonrpc":"2.0","id":5,"method":"session.runs","params":{"session_id":"$SID"}}`,
		`{"jsonrpc":"2.0","id":"x","method":"session.create"}` + fuzzSep +
			`{"jsonrpc":"2.0","id":2,"method":"session.branch","params":{"session_id":"$KEY"}}` + fuzzSep +
			`{"jsonrpc":"2.0","id":3,"method":"session.resume","params":{"session_id":"$KEY","cols":80}}` + fuzzSep +
			`{"jsonrpc":"2.0","id":4,"method":"session.close","params":{"session_id":"$SID"}}` + fuzzSep +
			`{"jsonrpc":"2.0","id":5,"method":"session.activate","params":{"session_id":"$SID"}}`,
		`not json`,
		``,
		`[1]`,
		`[]`,
		`{"id":1}`,
		`{"jsonrpc":"2.0","id":1,"method":5}`,
		`{"jsonrpc":"1.0","id":1,"method":"session.list"}`,
		`{"jsonrpc":"2.0","id":{},"method":"session.list"}`,
		`{"jsonrpc":"2.0","method":"session.list"}`,
		`{"jsonrpc":"2.0","id":null,"method":"nope"}`,
		`{"jsonrpc":"2.0","id":1,"method":"session.list","params":[1]}`,
		`{"jsonrpc":"2.0","id":1,"method":"session.list","params":{"limit":-1}}`,
		`{"jsonrpc":"2.0","id":1,"method":"session.resume","params":{"session_id":5}}`,
		`{"jsonrpc":"2.0","id":1,"method":"session.resume","params":{"session_id":"20200101_000000_abcdef"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"session.events.since","params":{"session_id":"deadbeef","last_seen":"x"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"session.interrupt","params":{"session_id":""}}`,
		`{"jsonrpc":"2.0","id":1,"method":"session.active_list"}`,
		"\xff\xfe",
		`{"a":"\ud800"}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s), false)
	}
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"session.list"}`), true)

	tbl, st, m := newTestTable(f)
	f.Fuzz(func(t *testing.T, data []byte, binary bool) {
		gw := New(tbl, st, "test", zerolog.Nop(), m)
		out := &recordingSender{}
		c := gw.newConn(contract.TransportID{Instance: "fuzz", Conn: 1}, "ws", out).as(adminWho)
		c.ready()
		var sid, key string
		frames := bytes.Split(data, []byte(fuzzSep))
		if len(frames) > 16 {
			frames = frames[:16]
		}
		for _, frame := range frames {
			frame = bytes.ReplaceAll(frame, []byte("$SID"), []byte(sid))
			frame = bytes.ReplaceAll(frame, []byte("$KEY"), []byte(key))
			c.OnFrame(frame, binary)
			// One request at a time, so that the next frame can use the
			// snapshot this one answered with.
			gw.wg.Wait()
			for _, fr := range out.frames() {
				var snap struct {
					Result *session.Snapshot `json:"result"`
				}
				if json.Unmarshal(fr, &snap) == nil && snap.Result != nil && snap.Result.SessionID != "" {
					sid, key = snap.Result.SessionID, snap.Result.SessionKey
				}
			}
		}
		// handle is the worker's half; it gets only what onFrame let
		// through, but must survive anything too.
		c.handle(data)

		c.OnClosed()
		gw.Close()
		// Close whatever the input created, waiting for its runs, so
		// that every event it caused has been sent.
		for _, e := range tbl.Active() {
			if _, err := tbl.Close(context.Background(), e.ID); err != nil {
				t.Fatalf("closing session %s: %v", e.ID, err)
			}
		}

		sent := out.frames()
		if len(sent) == 0 {
			t.Fatal("gateway sent nothing, want gateway.ready at least")
		}
		responses := 0
		for _, fr := range sent {
			if checkOutFrame(t, fr).ID != nil {
				responses++
			}
		}
		// Every frame but a notification gets one response; the direct
		// handle call at most one more.
		if max := len(frames) + 1; responses > max {
			t.Errorf("gateway sent %d responses to %d frames, want at most %d", responses, len(frames), max)
		}
	})
}
