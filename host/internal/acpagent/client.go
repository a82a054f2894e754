package acpagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"unicode/utf8"

	"github.com/coder/acp-go-sdk"
	"github.com/tether-agent/tether/host/agent"
)

// client is tether as the ACP client of one agent process.
type client struct {
	f *Factory
	p *process
}

var _ acp.Client = (*client)(nil)

// SessionUpdate routes an update to its session's turn: journaled as
// acp.update (and its text as message.delta). Updates the agent replays
// while tether loads a session into it are dropped (the journal holds
// them), and so are updates outside a turn.
func (c *client) SessionUpdate(_ context.Context, n acp.SessionNotification) error {
	defer c.p.order.handledOne()
	s := c.f.route(n.SessionId)
	if s == nil {
		return nil
	}
	ev := s.events()
	if ev == nil {
		return nil
	}
	raw, err := encodeUpdate(n.Update)
	if err != nil {
		return nil
	}
	ev.Update(raw)
	if ch := n.Update.AgentMessageChunk; ch != nil && ch.Content.Text != nil {
		ev.Delta(ch.Content.Text.Text)
	}
	return nil
}

// direct handles a session/update line that is a text
// agent_message_chunk without the library (order hands it over before
// the library would read it): SessionUpdate of what the library would
// decode. Any other line is left to the library (false).
func (c *client) direct(line []byte) bool {
	n, ok := decodeTextChunk(line)
	if !ok {
		return false
	}
	_ = c.SessionUpdate(context.Background(), n)
	return true
}

// decodeTextChunk decodes a session/update notification of one text
// agent_message_chunk into what the library decodes it to, for lines
// whose members are all ones the library reads, by their exact names
// (it matches struct members case-insensitively), each once: the
// envelope's jsonrpc, method and params; the params' sessionId, update
// and _meta; the update's sessionUpdate, content and _meta; the
// content's type and text. Anything else is not ok: the library decodes
// it. The line is checked once (json.Valid) and then only scanned; the
// text and the session id are decoded by encoding/json only when they
// hold escapes. TestDecodeTextChunkIsTheLibrarys holds the two equal.
func decodeTextChunk(line []byte) (acp.SessionNotification, bool) {
	var n acp.SessionNotification
	if !json.Valid(line) {
		return n, false
	}
	var params, update, content []byte
	isUpdate := false
	if !members(line, func(k string, v []byte) bool {
		switch k {
		case "jsonrpc":
			_, ok := jsonString(v)
			return ok
		case "method":
			m, ok := jsonString(v)
			isUpdate = m == acp.ClientMethodSessionUpdate
			return ok
		case "params":
			params = v
			return true
		}
		return false
	}, "jsonrpc", "method", "params") || !isUpdate || params == nil {
		return n, false
	}
	if !members(params, func(k string, v []byte) bool {
		switch k {
		case "sessionId":
			sid, ok := jsonString(v)
			n.SessionId = acp.SessionId(sid)
			return ok
		case "update":
			update = v
			return true
		case "_meta":
			return json.Unmarshal(v, &n.Meta) == nil
		}
		return false
	}, "sessionId", "update", "_meta") || update == nil {
		return n, false
	}
	ch := &acp.SessionUpdateAgentMessageChunk{}
	if !members(update, func(k string, v []byte) bool {
		switch k {
		case "sessionUpdate":
			var ok bool
			ch.SessionUpdate, ok = jsonString(v)
			return ok
		case "content":
			content = v
			return true
		case "_meta":
			return json.Unmarshal(v, &ch.Meta) == nil
		}
		return false
	}, "sessionUpdate", "content", "_meta") || ch.SessionUpdate != "agent_message_chunk" || content == nil {
		return n, false
	}
	text := &acp.ContentBlockText{}
	hasText := false
	if !members(content, func(k string, v []byte) bool {
		var ok bool
		switch k {
		case "type":
			text.Type, ok = jsonString(v)
		case "text":
			text.Text, ok = jsonString(v)
			hasText = true
		}
		return ok
	}, "type", "text") || text.Type != "text" || !hasText {
		return n, false
	}
	ch.Content.Text = text
	n.Update.AgentMessageChunk = ch
	return n, true
}

// members calls f with each member of the JSON object b (valid JSON) and
// reports whether b is an object whose members are all of keys, each
// once, with no escape in their names, and f returned true for each.
func members(b []byte, f func(key string, val []byte) bool, keys ...string) bool {
	var seen uint
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return true
	}
	for i < len(b) && b[i] == '"' {
		end := i + 1 + bytes.IndexByte(b[i+1:], '"')
		if end <= i || bytes.IndexByte(b[i+1:end], '\\') >= 0 {
			return false
		}
		key := string(b[i+1 : end])
		k := slices.Index(keys, key)
		if k < 0 || seen&(1<<k) != 0 {
			return false
		}
		seen |= 1 << k
		i = skipSpace(b, end+1) // at ':'
		start := skipSpace(b, i+1)
		stop := skipValue(b, start)
		if !f(key, b[start:stop]) {
			return false
		}
		i = skipSpace(b, stop)
		if i < len(b) && b[i] == '}' {
			return true
		}
		i = skipSpace(b, i+1) // past ','
	}
	return false
}

// skipSpace returns the index of the first byte at or after i that is
// not JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the index just past the JSON value (valid JSON) that
// starts at i.
func skipValue(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
			if depth < 0 {
				return i
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
	}
	return i
}

// jsonString decodes a JSON string (null decodes to "", as into a Go
// string); ok is false for any other value.
func jsonString(v []byte) (string, bool) {
	if len(v) >= 2 && v[0] == '"' && bytes.IndexByte(v, '\\') < 0 && utf8.Valid(v) {
		return string(v[1 : len(v)-1]), true
	}
	var s string
	if (len(v) == 0 || v[0] != '"') && string(v) != "null" {
		return "", false
	}
	return s, json.Unmarshal(v, &s) == nil
}

// encodeUpdate is json.Marshal(u), the library's encoding of an update,
// written directly for the commonest kind — an agent_message_chunk of
// text with no messageId, its _meta (if any) as decoded from JSON:
// {"_meta":…,"content":{"text":…,"type":"text"},"sessionUpdate":
// "agent_message_chunk"} — instead of through the library's variants
// (each encoded, decoded into a map and encoded again).
// TestEncodeUpdateIsTheLibrarys holds the two equal.
func encodeUpdate(u acp.SessionUpdate) ([]byte, error) {
	ch := u.AgentMessageChunk
	if u.UserMessageChunk != nil || ch == nil || ch.MessageId != nil || ch.Content.Text == nil || !utf8.ValidString(ch.Content.Text.Text) || !decodedJSON(ch.Meta) {
		return json.Marshal(u)
	}
	text, err := json.Marshal(ch.Content.Text.Text)
	if err != nil {
		return nil, fmt.Errorf("encoding an update's text: %w", err)
	}
	var meta []byte
	if len(ch.Meta) > 0 {
		if meta, err = json.Marshal(ch.Meta); err != nil {
			return nil, fmt.Errorf("encoding an update's _meta: %w", err)
		}
	}
	b := make([]byte, 0, len(meta)+len(text)+len(textChunkHead)+len(textChunkTail)+10)
	if meta != nil {
		b = append(b, `{"_meta":`...)
		b = append(b, meta...)
		b = append(b, ',')
	} else {
		b = append(b, '{')
	}
	b = append(b, textChunkHead...)
	b = append(b, text...)
	return append(b, textChunkTail...), nil
}

// The library's encoding of a text agent_message_chunk around its text.
const (
	textChunkHead = `"content":{"text":`
	textChunkTail = `,"type":"text"},"sessionUpdate":"agent_message_chunk"}`
)

// decodedJSON reports whether v holds only what decoding JSON into an
// any makes (maps of string keys, slices, float64, valid strings, bools,
// nil), which encoding again, decoding and encoding once more leaves
// byte for byte as one encoding does.
func decodedJSON(v any) bool {
	switch v := v.(type) {
	case nil, bool:
		return true
	case float64:
		return !math.IsNaN(v) && !math.IsInf(v, 0)
	case string:
		return utf8.ValidString(v)
	case []any:
		for _, e := range v {
			if !decodedJSON(e) {
				return false
			}
		}
		return true
	case map[string]any:
		for k, e := range v {
			if !utf8.ValidString(k) || !decodedJSON(e) {
				return false
			}
		}
		return true
	}
	return false
}

// RequestPermission asks the session's viewers; the first answer is the
// agent's. A request outside a turn is cancelled.
func (c *client) RequestPermission(ctx context.Context, r acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	cancelled := acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeCancelled()}
	// The updates the agent sent before it come first (its tool call).
	c.p.order.waitBefore(ctx, permKey(string(r.SessionId), string(r.ToolCall.ToolCallId)))
	s := c.f.route(r.SessionId)
	if s == nil {
		return cancelled, nil
	}
	ev := s.events()
	if ev == nil {
		return cancelled, nil
	}
	tc, _ := json.Marshal(r.ToolCall)
	opts, _ := json.Marshal(r.Options)
	option, ok, err := ev.Permission(ctx, agent.PermissionRequest{ToolCall: tc, Options: opts})
	if err != nil || !ok {
		return cancelled, nil
	}
	return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeSelected(acp.PermissionOptionId(option))}, nil
}

var errUnsupported = errors.New("tether offers no file system or terminal to agents")

// ReadTextFile implements acp.Client: not offered.
func (c *client) ReadTextFile(context.Context, acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	return acp.ReadTextFileResponse{}, errUnsupported
}

// WriteTextFile implements acp.Client: not offered.
func (c *client) WriteTextFile(context.Context, acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	return acp.WriteTextFileResponse{}, errUnsupported
}

// CreateTerminal implements acp.Client: not offered.
func (c *client) CreateTerminal(context.Context, acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	return acp.CreateTerminalResponse{}, errUnsupported
}

// KillTerminal implements acp.Client: not offered.
func (c *client) KillTerminal(context.Context, acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	return acp.KillTerminalResponse{}, errUnsupported
}

// TerminalOutput implements acp.Client: not offered.
func (c *client) TerminalOutput(context.Context, acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	return acp.TerminalOutputResponse{}, errUnsupported
}

// ReleaseTerminal implements acp.Client: not offered.
func (c *client) ReleaseTerminal(context.Context, acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	return acp.ReleaseTerminalResponse{}, errUnsupported
}

// WaitForTerminalExit implements acp.Client: not offered.
func (c *client) WaitForTerminalExit(context.Context, acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	return acp.WaitForTerminalExitResponse{}, errUnsupported
}
