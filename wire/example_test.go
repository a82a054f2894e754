package wire_test

import (
	"encoding/json"
	"fmt"
	"net/url"

	"github.com/tether-agent/tether/wire"
)

// A client numbers its requests and reads the frames the gateway sends:
// responses carry the request's id, events are notifications.
func Example() {
	params, _ := json.Marshal(wire.SubmitParams{SessionID: "0123abcd", Text: "hello there"})
	req, _ := json.Marshal(wire.Request{JSONRPC: wire.JSONRPCVersion, ID: json.RawMessage("1"), Method: wire.MethodSubmit, Params: params})
	fmt.Printf("%s\n", req)

	for _, frame := range []string{
		`{"jsonrpc":"2.0","id":1,"result":{"status":"streaming","run_id":"r1"}}`,
		`{"jsonrpc":"2.0","method":"event","params":{"type":"message.delta","session_id":"0123abcd","seq":8,"payload":{"text":"hello "}}}`,
		`{"jsonrpc":"2.0","id":2,"error":{"code":4009,"message":"session busy: a run is in flight"}}`,
	} {
		m, err := wire.DecodeEnvelope([]byte(frame))
		if err != nil {
			fmt.Println(err)
			continue
		}
		switch {
		case m.IsEvent():
			e, _ := m.Event()
			var d wire.MessageDelta
			_ = e.Decode(&d)
			fmt.Printf("event %s seq %d: %q\n", e.Type, e.Seq, d.Text)
		case m.Error != nil:
			id, _ := m.IntID()
			fmt.Printf("call %d failed: %d %s (busy: %v)\n", id, m.Error.Code, m.Error.Message, m.Error.Code == wire.CodeSessionBusy)
		default:
			id, _ := m.IntID()
			var r wire.SubmitResult
			_ = json.Unmarshal(m.Result, &r)
			fmt.Printf("call %d: %s %s\n", id, r.Status, r.RunID)
		}
	}
	// Output:
	// {"jsonrpc":"2.0","id":1,"method":"prompt.submit","params":{"session_id":"0123abcd","text":"hello there"}}
	// call 1: streaming r1
	// event message.delta seq 8: "hello "
	// call 2 failed: 4009 session busy: a run is in flight (busy: true)
}

// A PTY client asks for what follows its cursor, reads the pty.replay
// header, and sends its terminal size with the resize escape.
func ExamplePTYURL() {
	base, _ := url.Parse("ws://127.0.0.1:7717")
	u := wire.PTYURL(base, wire.PTYQuery{Attach: "0123456789abcdef", HasCursor: true, Offset: 4096, Epoch: "e1"})
	fmt.Println(u)

	r, err := wire.DecodeReplay([]byte(`{"type":"pty.replay","epoch":"e1","start_offset":0,"replay_end_offset":4100,"reset":false,"reason":"resume"}`))
	fmt.Println(r.Reason, r.ReplayEndOffset-4096, "bytes to replay", err)

	frame := wire.EncodeResize(120, 40)
	cols, rows, ok := wire.ParseResize(frame)
	fmt.Printf("%q %dx%d %v\n", frame, cols, rows, ok)
	// Output:
	// ws://127.0.0.1:7717/api/pty?attach=0123456789abcdef&epoch=e1&offset=4096
	// resume 4 bytes to replay <nil>
	// "\x1b[RESIZE:120;40]" 120x40 true
}
