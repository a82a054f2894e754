package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeEnvelope(t *testing.T) {
	for _, tt := range []struct {
		name, frame string
		want        Envelope
		err         error // nil: decodes
		response    bool
		event       bool
	}{
		{name: "result", frame: `{"jsonrpc":"2.0","id":7,"result":{"closed":true}}`,
			want: Envelope{JSONRPC: "2.0", ID: json.RawMessage("7"), Result: json.RawMessage(`{"closed":true}`)}, response: true},
		{name: "null result", frame: `{"jsonrpc":"2.0","id":"a","result":null}`,
			want: Envelope{JSONRPC: "2.0", ID: json.RawMessage(`"a"`), Result: json.RawMessage("null")}, response: true},
		{name: "error", frame: `{"jsonrpc":"2.0","id":7,"error":{"code":4001,"message":"unknown","data":{"x":1}}}`,
			want: Envelope{JSONRPC: "2.0", ID: json.RawMessage("7"), Error: &ErrorObject{Code: 4001, Message: "unknown", Data: json.RawMessage(`{"x":1}`)}}, response: true},
		{name: "parse error answer", frame: `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}`,
			want: Envelope{JSONRPC: "2.0", ID: json.RawMessage("null"), Error: &ErrorObject{Code: -32700, Message: "parse error"}}, response: true},
		{name: "event", frame: `{"jsonrpc":"2.0","method":"event","params":{"type":"message.delta","session_id":"0123abcd","seq":3,"payload":{"text":"hi "}}}`,
			want: Envelope{JSONRPC: "2.0", Method: "event", Params: json.RawMessage(`{"type":"message.delta","session_id":"0123abcd","seq":3,"payload":{"text":"hi "}}`)}, event: true},
		{name: "request", frame: ` {"jsonrpc":"2.0","id":1,"method":"session.list","params":{"limit":2}} `,
			want: Envelope{JSONRPC: "2.0", ID: json.RawMessage("1"), Method: "session.list", Params: json.RawMessage(`{"limit":2}`)}},
		{name: "null error member ignored", frame: `{"jsonrpc":"2.0","id":1,"result":1,"error":null}`,
			want: Envelope{JSONRPC: "2.0", ID: json.RawMessage("1"), Result: json.RawMessage("1")}, response: true},
		{name: "array", frame: `[{"jsonrpc":"2.0","id":1,"result":1}]`, err: ErrNotObject},
		{name: "not json", frame: `{"jsonrpc":`, err: ErrNotObject},
		{name: "empty", frame: ``, err: ErrNotObject},
		{name: "two objects", frame: `{"jsonrpc":"2.0","id":1,"result":1}{}`, err: ErrNotObject},
		{name: "no version", frame: `{"id":1,"result":1}`, err: ErrVersion},
		{name: "version 1", frame: `{"jsonrpc":"1.0","id":1,"result":1}`, err: ErrVersion},
		{name: "numeric method", frame: `{"jsonrpc":"2.0","method":5}`, err: ErrShape},
		{name: "empty method", frame: `{"jsonrpc":"2.0","method":""}`, err: ErrShape},
		{name: "object id", frame: `{"jsonrpc":"2.0","id":{},"result":1}`, err: ErrShape},
		{name: "neither", frame: `{"jsonrpc":"2.0","id":1}`, err: ErrShape},
		{name: "both", frame: `{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"x"}}`, err: ErrShape},
		{name: "nothing", frame: `{"jsonrpc":"2.0"}`, err: ErrShape},
		{name: "error not an object", frame: `{"jsonrpc":"2.0","id":1,"error":"bad"}`, err: ErrShape},
		{name: "fractional code", frame: `{"jsonrpc":"2.0","id":1,"error":{"code":1.5,"message":"x"}}`, err: ErrShape},
		{name: "request with result", frame: `{"jsonrpc":"2.0","id":1,"method":"m","result":1}`, err: ErrShape},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeEnvelope([]byte(tt.frame))
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("got %+v, %v; want error %v", got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeEnvelope: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			if got.IsResponse() != tt.response || got.IsEvent() != tt.event {
				t.Errorf("IsResponse %v IsEvent %v, want %v %v", got.IsResponse(), got.IsEvent(), tt.response, tt.event)
			}
		})
	}
}

func TestEnvelopeEvent(t *testing.T) {
	m, err := DecodeEnvelope([]byte(`{"jsonrpc":"2.0","method":"event","params":{"type":"gateway.ready","payload":{"version":"1.2"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := m.Event()
	if err != nil || e.Type != EventReady || e.SessionID != "" || e.Seq != 0 {
		t.Fatalf("Event: got %+v, %v", e, err)
	}
	var r Ready
	if err := e.Decode(&r); err != nil || r.Version != "1.2" {
		t.Fatalf("Decode: got %+v, %v", r, err)
	}
	for _, frame := range []string{
		`{"jsonrpc":"2.0","method":"event","params":{"payload":{}}}`,
		`{"jsonrpc":"2.0","method":"event","params":[1]}`,
		`{"jsonrpc":"2.0","method":"event","params":{"type":"x","seq":-1}}`,
		`{"jsonrpc":"2.0","id":1,"method":"event","params":{"type":"x"}}`,
		`{"jsonrpc":"2.0","method":"other","params":{"type":"x"}}`,
	} {
		m, err := DecodeEnvelope([]byte(frame))
		if err != nil {
			t.Fatalf("%s: %v", frame, err)
		}
		if e, err := m.Event(); err == nil {
			t.Errorf("%s: Event() = %+v, want an error", frame, e)
		}
	}
	if err := (Event{Type: "x"}).Decode(new(any)); err == nil {
		t.Error("Decode of an event without payload: no error")
	}
}

func TestIntID(t *testing.T) {
	for id, want := range map[string]int64{"7": 7, "-3": -3, "0": 0} {
		if got, ok := (Envelope{ID: json.RawMessage(id)}).IntID(); !ok || got != want {
			t.Errorf("IntID(%s) = %d, %v; want %d", id, got, ok, want)
		}
	}
	for _, id := range []string{"", "null", `"7"`, "1.5", "1e3", "99999999999999999999"} {
		if got, ok := (Envelope{ID: json.RawMessage(id)}).IntID(); ok {
			t.Errorf("IntID(%s) = %d, want none", id, got)
		}
	}
}

func TestNewEvent(t *testing.T) {
	b, err := NewEvent(Event{Type: EventMessageDelta, SessionID: "0123abcd", Seq: 2, Payload: json.RawMessage(`{"text":"x"}`)})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"jsonrpc":"2.0","method":"event","params":{"type":"message.delta","session_id":"0123abcd","seq":2,"payload":{"text":"x"}}}`
	if string(b) != want {
		t.Errorf("NewEvent: got %s, want %s", b, want)
	}
	b, _ = NewEvent(Event{Type: EventReady, Payload: json.RawMessage(`{"version":"v"}`)})
	if want := `{"jsonrpc":"2.0","method":"event","params":{"type":"gateway.ready","payload":{"version":"v"}}}`; string(b) != want {
		t.Errorf("NewEvent(ready): got %s, want %s (the host's gateway.ready)", b, want)
	}
}

// TestResultFields decodes results as the host writes them (every field
// the host sends, in its order) into the wire types with unknown fields
// refused, and encodes them back to the same bytes: a renamed or missing
// field fails.
func TestResultFields(t *testing.T) {
	for _, tt := range []struct {
		name string
		json string
		into any
	}{
		{"snapshot", `{"session_id":"0123abcd","session_key":"20250101_120000_abcdef","resumed":"live","title":"t","message_count":2,` +
			`"messages":[{"role":"user","text":"hi"},{"role":"assistant","text":"hi"}],"status":"idle","running":false,"started_at":1700000000,"latest_seq":4,"epoch":"ep"}`,
			new(Snapshot)},
		{"active_list", `{"sessions":[{"id":"0123abcd","session_key":"20250101_120000_abcdef","title":"t","status":"working","message_count":1,` +
			`"started_at":1700000000,"last_active":1700000001,"viewers":2,"transports":{"ws":2}}]}`, new(ActiveList)},
		{"session.list", `{"sessions":[{"id":"20250101_120000_abcdef","title":"t","started_at":1700000000,"ended_at":1700000002,"end_reason":"closed","message_count":2,"last_active":1700000002},` +
			`{"id":"20250101_120001_abcdef","title":"","started_at":1700000000,"ended_at":null,"end_reason":"","message_count":0,"last_active":1700000000}]}`, new(StoredList)},
		{"events.since", `{"epoch":"ep","events":[{"type":"message.start","session_id":"0123abcd","seq":5,"payload":{"run_id":"r1"}}],"latest_seq":5,"truncated":false}`,
			new(EventsSince)},
		{"runs", `{"runs":[{"run_id":"r1","status":"complete","started_at":1700000000,"ended_at":1700000001},{"run_id":"r2","status":"running","started_at":1700000002,"ended_at":null}]}`,
			new(RunList)},
		{"submit", `{"status":"streaming","run_id":"r1"}`, new(SubmitResult)},
		{"close", `{"closed":true}`, new(CloseResult)},
		{"interrupt", `{"status":"idle"}`, new(InterruptResult)},
		{"message.complete", `{"text":"a b","status":"interrupted"}`, new(MessageComplete)},
		{"replay", `{"type":"pty.replay","epoch":"e","start_offset":0,"replay_end_offset":0,"reset":true,"reason":"initial","snapshot":true,"snapshot_bytes":3,"cols":80,"rows":24}`,
			new(Replay)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dec := json.NewDecoder(strings.NewReader(tt.json))
			dec.DisallowUnknownFields()
			if err := dec.Decode(tt.into); err != nil {
				t.Fatalf("decode: %v", err)
			}
			b, err := json.Marshal(tt.into)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, []byte(tt.json)) {
				t.Errorf("encoded back:\n got %s\nwant %s", b, tt.json)
			}
		})
	}
}

func TestParamsFields(t *testing.T) {
	for _, tt := range []struct {
		params any
		want   string
	}{
		{CreateParams{}, `{}`},
		{CreateParams{Cols: 80, Title: "t", CloseOnDisconnect: true, ParentSessionID: "k"}, `{"cols":80,"title":"t","close_on_disconnect":true,"parent_session_id":"k"}`},
		{BranchParams{SessionID: "s"}, `{"session_id":"s"}`},
		{ResumeParams{SessionID: "k", Cols: 100}, `{"session_id":"k","cols":100}`},
		{SessionParams{SessionID: "s"}, `{"session_id":"s"}`},
		{ListParams{}, `{}`},
		{ListParams{Limit: 5}, `{"limit":5}`},
		{EventsSinceParams{SessionID: "s"}, `{"session_id":"s","last_seen":0}`},
		{SubmitParams{SessionID: "s", Text: ""}, `{"session_id":"s","text":""}`},
	} {
		b, err := json.Marshal(tt.params)
		if err != nil || string(b) != tt.want {
			t.Errorf("%T: got %s, %v; want %s", tt.params, b, err, tt.want)
		}
	}
}
