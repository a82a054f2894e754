package acpgw

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/coder/acp-go-sdk"

	"github.com/tether-agent/tether/host/agent"
)

// rawUpdates are updates as agents send them: every kind, text that JSON
// escapes (HTML, line separators, quotes), _meta, unknown members and an
// unknown kind.
var rawUpdates = []string{
	`{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"plain"}}`,
	`{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"<a href=\"x\">&amp;</a> \u2028 \u00e9\t\n\\ \ud83d\ude00"}}`,
	`{"sessionUpdate":"agent_thought_chunk","content":{"type":"text","text":"hmm"}}`,
	`{"sessionUpdate":"tool_call","toolCallId":"c1","title":"Read <file>","status":"pending","kind":"read","locations":[{"path":"/a","line":3}]}`,
	`{"sessionUpdate":"tool_call_update","toolCallId":"c1","status":"completed","content":[{"type":"content","content":{"type":"text","text":"done"}}]}`,
	`{"sessionUpdate":"plan","entries":[{"content":"a","priority":"high","status":"pending","extra":1}]}`,
	`{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi","_meta":{"x":1}},"_meta":{"a":1,"b":[1.5,"z"],"big":12345678901234567890},"future":true}`,
	`{"sessionUpdate":"future_kind","content":{"type":"text","text":"x"}}`,
	`{"sessionUpdate":"future_kind","foo":1}`,
}

// journaled is what the ACP agent journals of an update the agent sent:
// the library's decoding of it, encoded again (acpagent's SessionUpdate).
func journaled(t *testing.T, raw string) (json.RawMessage, acp.SessionUpdate) {
	t.Helper()
	var n acp.SessionNotification
	if err := json.Unmarshal([]byte(`{"sessionId":"s","update":`+raw+`}`), &n); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	b, err := json.Marshal(n.Update)
	if err != nil {
		t.Fatal(err)
	}
	return b, n.Update
}

// updater is an agent whose every turn sends rawUpdates, journaled as the
// ACP agent journals them.
type updater struct{ updates []json.RawMessage }

var _ agent.Turner = updater{}

func (updater) Run(context.Context, []agent.Message, string, func(string)) error {
	return errors.New("a Turner's Run is never called")
}

func (u updater) Turn(_ context.Context, _ []agent.Message, _ agent.Message, ev agent.Events) (string, error) {
	for _, b := range u.updates {
		ev.Update(b)
	}
	return "end_turn", nil
}

func (updater) Close() error { return nil }

// libraryLine is the line the ACP library writes for session/update n.
func libraryLine(t *testing.T, n acp.SessionNotification) []byte {
	t.Helper()
	var out bytes.Buffer
	pr, pw := io.Pipe()
	asc := acp.NewAgentSideConnection(&acpAgent{}, &out, pr)
	asc.SetLogger(slog.New(slog.DiscardHandler))
	err := asc.SessionUpdate(context.Background(), n)
	_ = pw.Close()
	<-asc.Done()
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n"))
}

// TestRawUpdatesAsTheLibraryWrites: an acp.update goes to /acp clients
// without being decoded (notifyRaw), live and in a session/load's replay;
// each session/update frame is byte for byte the one the ACP library
// writes for the decoded update with its tether/seq.
func TestRawUpdatesAsTheLibraryWrites(t *testing.T) {
	var u updater
	var want []acp.SessionUpdate
	for _, raw := range rawUpdates {
		b, dec := journaled(t, raw)
		u.updates = append(u.updates, b)
		want = append(want, dec)
	}
	e := newEnv(t, agent.FactoryFunc(func(context.Context, string, json.RawMessage) (agent.Agent, error) { return u, nil }))
	a := e.connect()
	a.initialize(t)
	sid := a.newSession(t, "/p")
	if _, err := a.prompt(t, sid, "go"); err != nil {
		t.Fatal(err)
	}
	b := e.connect()
	b.initialize(t)
	if _, err := b.cs.LoadSession(ctx(t), acp.LoadSessionRequest{SessionId: acp.SessionId(sid), Cwd: "/p", McpServers: []acp.McpServer{}}); err != nil {
		t.Fatalf("session/load: %v", err)
	}
	for name, cl := range map[string]*client{"live": a, "replayed": b} {
		var got [][]byte
		var seqs []uint64
		for _, f := range cl.out.sent() {
			var m struct {
				Method string
				Params struct {
					Meta   map[string]any `json:"_meta"`
					Update struct {
						Kind string `json:"sessionUpdate"`
					} `json:"update"`
				}
			}
			if json.Unmarshal(f, &m) != nil || m.Method != acp.ClientMethodSessionUpdate || m.Params.Update.Kind == "user_message_chunk" && m.Params.Meta[MetaBy] != nil {
				continue // not an update, or the prompt
			}
			got = append(got, f)
			seqs = append(seqs, uint64(m.Params.Meta[MetaSeq].(float64)))
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d session/update frames, want %d: %q", name, len(got), len(want), got)
		}
		for i := range got {
			line := libraryLine(t, acp.SessionNotification{SessionId: acp.SessionId(sid), Update: want[i], Meta: map[string]any{MetaSeq: seqs[i]}})
			if !bytes.Equal(got[i], line) {
				t.Errorf("%s update %d:\n got %s\nwant %s", name, i, got[i], line)
			}
		}
	}
}

// TestScanParams: event params in the table's layout are read without
// decoding the payload; any other layout is left to the full decoder,
// which reads the same event.
func TestScanParams(t *testing.T) {
	for _, tc := range []struct {
		in   string
		scan bool
	}{
		{`{"type":"acp.update","session_id":"s1","seq":42,"payload":{"a":[1,"}"]}}`, true},
		{`{"type":"message.delta","session_id":"s1","seq":1,"payload":{"text":"x"}}`, true},
		{`{"session_id":"s1","type":"acp.update","seq":42,"payload":{}}`, false},
		{`{"type":"a\"b","session_id":"s1","seq":42,"payload":{}}`, false},
		{`{"type":"acp.update","session_id":"s\u0031","seq":42,"payload":{}}`, false},
		{`{"type":"acp.update","session_id":"s1","seq":-1,"payload":{}}`, false},
		{`{"type":"acp.update", "session_id":"s1","seq":42,"payload":{}}`, false},
	} {
		ev, ok := scanParams([]byte(tc.in))
		if ok != tc.scan {
			t.Errorf("scanParams(%s) ok = %v, want %v", tc.in, ok, tc.scan)
			continue
		}
		var want event
		wantOK := json.Unmarshal([]byte(tc.in), &want) == nil
		if got, gotOK := parseParams([]byte(tc.in)); gotOK != wantOK || gotOK && (got.Type != want.Type || got.SessionID != want.SessionID || got.Seq != want.Seq || !bytes.Equal(got.Payload, want.Payload)) {
			t.Errorf("parseParams(%s) = %+v, %v; json.Unmarshal: %+v, %v", tc.in, got, gotOK, want, wantOK)
		}
		if ok && string(ev.Payload) != string(want.Payload) {
			t.Errorf("scanParams(%s) payload %s, want %s", tc.in, ev.Payload, want.Payload)
		}
	}
}
