package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Decoding errors.
var (
	// ErrNotObject: the frame is not one JSON object.
	ErrNotObject = errors.New("not a JSON object")
	// ErrVersion: the jsonrpc member is not "2.0".
	ErrVersion = errors.New(`jsonrpc is not "2.0"`)
	// ErrShape: the object is neither a request, a notification nor a
	// response.
	ErrShape = errors.New("not a JSON-RPC message")
)

// Request is a JSON-RPC request; without an ID it is a notification.
// Params is sent as it is: encode a params struct into it, or leave it
// empty for a method that takes none.
type Request struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
}

// Response is a JSON-RPC response: Result or Error, never both. The ID of
// the answer to a frame that could not be parsed is null.
type Response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *ErrorObject    `json:"error,omitempty"`
}

// ErrorObject is the error member of a response.
type ErrorObject struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// Notification is a server event as it travels: a JSON-RPC notification
// with method "event" whose params are the Event.
type Notification struct {
	JSONRPC string `json:"jsonrpc"`
	Method  string `json:"method"`
	Params  Event  `json:"params"`
}

// Event is a server event. SessionID and Seq are absent only from
// gateway.ready; Seq counts a stored session's events from 1, one by one,
// across reconnects and host restarts.
type Event struct {
	Type      string          `json:"type"`
	SessionID string          `json:"session_id,omitempty"`
	Seq       uint64          `json:"seq,omitempty"`
	Payload   json.RawMessage `json:"payload,omitempty"`
}

// Decode unmarshals the event's payload into v.
func (e Event) Decode(v any) error {
	if len(e.Payload) == 0 {
		return fmt.Errorf("%s event: no payload", e.Type)
	}
	if err := json.Unmarshal(e.Payload, v); err != nil {
		return fmt.Errorf("%s event payload: %w", e.Type, err)
	}
	return nil
}

// NewEvent returns the notification frame of an event.
func NewEvent(e Event) ([]byte, error) {
	return json.Marshal(Notification{JSONRPC: JSONRPCVersion, Method: MethodEvent, Params: e})
}

// Envelope is any JSON-RPC message as DecodeEnvelope reads it. A member
// that was absent is nil; one that was null holds "null".
type Envelope struct {
	JSONRPC string
	ID      json.RawMessage
	Method  string
	Params  json.RawMessage
	Result  json.RawMessage
	Error   *ErrorObject
}

// IsResponse reports whether m is a response: an id and a result or an
// error, no method.
func (m Envelope) IsResponse() bool {
	return m.ID != nil && m.Method == "" && (m.Result != nil || m.Error != nil)
}

// IsEvent reports whether m is a server event: the notification "event".
func (m Envelope) IsEvent() bool {
	return m.ID == nil && m.Method == MethodEvent
}

// Event decodes the params of an event notification.
func (m Envelope) Event() (Event, error) {
	if !m.IsEvent() {
		return Event{}, fmt.Errorf("%w: not an event notification", ErrShape)
	}
	var e Event
	if err := json.Unmarshal(m.Params, &e); err != nil {
		return Event{}, fmt.Errorf("event params: %w", err)
	}
	if e.Type == "" {
		return Event{}, fmt.Errorf("%w: event without a type", ErrShape)
	}
	return e, nil
}

// IntID returns the id of m as an integer, for clients that number their
// requests; ok is false for a null, string or fractional id.
func (m Envelope) IntID() (id int64, ok bool) {
	if len(m.ID) == 0 || m.ID[0] == '"' || bytes.Equal(m.ID, []byte("null")) {
		return 0, false
	}
	if err := json.Unmarshal(m.ID, &id); err != nil {
		return 0, false
	}
	return id, true
}

// envelope is the wire form of Envelope; a member that is absent stays nil.
type envelope struct {
	JSONRPC *string         `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  *string         `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   json.RawMessage `json:"error"`
}

// DecodeEnvelope decodes one frame: exactly one JSON object with jsonrpc
// "2.0" that is a request, a notification or a response. An error member
// must be an object with an integer code, or null.
func DecodeEnvelope(frame []byte) (Envelope, error) {
	trimmed := bytes.TrimSpace(frame)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return Envelope{}, ErrNotObject
	}
	var raw envelope
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if err := dec.Decode(&raw); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) || errors.Is(err, io.ErrUnexpectedEOF) {
			return Envelope{}, fmt.Errorf("%w: %v", ErrNotObject, err)
		}
		return Envelope{}, fmt.Errorf("%w: %v", ErrShape, err)
	}
	if dec.InputOffset() != int64(len(trimmed)) {
		return Envelope{}, fmt.Errorf("%w: data after the object", ErrNotObject)
	}
	if raw.JSONRPC == nil || *raw.JSONRPC != JSONRPCVersion {
		return Envelope{}, ErrVersion
	}
	m := Envelope{JSONRPC: *raw.JSONRPC, ID: raw.ID, Params: raw.Params, Result: raw.Result}
	if raw.ID != nil && !validID(raw.ID) {
		return Envelope{}, fmt.Errorf("%w: id must be a string, a number or null", ErrShape)
	}
	if raw.Error != nil && !bytes.Equal(raw.Error, []byte("null")) {
		var eo ErrorObject
		if err := json.Unmarshal(raw.Error, &eo); err != nil {
			return Envelope{}, fmt.Errorf("%w: error member: %v", ErrShape, err)
		}
		m.Error = &eo
	}
	switch {
	case raw.Method != nil:
		if *raw.Method == "" || raw.Result != nil || m.Error != nil {
			return Envelope{}, fmt.Errorf("%w: a request with an empty method, a result or an error", ErrShape)
		}
		m.Method = *raw.Method
	case raw.ID == nil:
		return Envelope{}, fmt.Errorf("%w: no method and no id", ErrShape)
	case (raw.Result == nil) == (m.Error == nil):
		return Envelope{}, fmt.Errorf("%w: a response needs exactly one of result and error", ErrShape)
	}
	return m, nil
}

// validID reports whether id is a JSON string, number or null.
func validID(id json.RawMessage) bool {
	switch id[0] {
	case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return true
	}
	return bytes.Equal(id, []byte("null"))
}
