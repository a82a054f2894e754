package rpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/tether-agent/tether/wire"
)

// rpcError is a JSON-RPC error object.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

func (e *rpcError) Error() string { return fmt.Sprintf("%d %s", e.Code, e.Message) }

func errorf(code int, format string, args ...any) *rpcError {
	return &rpcError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// request is a decoded JSON-RPC request.
type request struct {
	JSONRPC json.RawMessage `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  json.RawMessage `json:"method"`
	Params  json.RawMessage `json:"params"`

	// arrived is when the gateway decoded it.
	arrived time.Time `json:"-"`
	// raw is a copy of the frame it was decoded from, on a cluster host
	// (to relay it to another host).
	raw []byte
}

var nullID = json.RawMessage("null")

// decodeRequest parses a text frame in one pass: invalid JSON is -32700,
// a JSON value that is not an object -32600. The request's fields are
// copies (json.RawMessage copies what it decodes), so data may be reused.
func decodeRequest(data []byte) (*request, *rpcError) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		if !json.Valid(trimmed) {
			return nil, errorf(wire.CodeParseError, "parse error")
		}
		return nil, errorf(wire.CodeInvalidRequest, "a request must be one JSON object")
	}
	req := &request{arrived: time.Now()}
	if err := json.Unmarshal(trimmed, req); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, errorf(wire.CodeParseError, "parse error")
		}
		return nil, errorf(wire.CodeInvalidRequest, "invalid request: %v", err)
	}
	return req, nil
}

// validID returns id if it is a valid JSON-RPC id (string, number, null),
// else null.
func validID(id json.RawMessage) json.RawMessage {
	if len(id) == 0 {
		return nullID
	}
	switch id[0] {
	case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'n':
		return id
	}
	return nullID
}

// params is a decoded params object.
type params map[string]json.RawMessage

func parseParams(raw json.RawMessage) (params, *rpcError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, nullID) {
		return params{}, nil
	}
	if raw[0] != '{' {
		return nil, errorf(wire.CodeInvalidParams, "params must be an object")
	}
	var p params
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, errorf(wire.CodeInvalidParams, "params must be an object")
	}
	return p, nil
}

func (p params) has(name string) bool {
	v, ok := p[name]
	return ok && !bytes.Equal(v, nullID)
}

func (p params) str(name string) (string, *rpcError) {
	if !p.has(name) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(p[name], &s); err != nil {
		return "", errorf(wire.CodeInvalidParams, "%s must be a string", name)
	}
	return s, nil
}

func (p params) boolean(name string) (bool, *rpcError) {
	if !p.has(name) {
		return false, nil
	}
	var b bool
	if err := json.Unmarshal(p[name], &b); err != nil {
		return false, errorf(wire.CodeInvalidParams, "%s must be a boolean", name)
	}
	return b, nil
}

// integer decodes a non-negative integer (a JSON number with no fraction).
func (p params) integer(name string) (int64, bool, *rpcError) {
	if !p.has(name) {
		return 0, false, nil
	}
	// A JSON string holding a number would decode into a json.Number too:
	// only a number token is an integer.
	if c := p[name][0]; c != '-' && (c < '0' || c > '9') {
		return 0, false, errorf(wire.CodeInvalidParams, "%s must be a non-negative integer", name)
	}
	// The value is one JSON number token (params decoded it): an integer
	// is digits with an optional minus, which is what ParseInt takes.
	v, err := strconv.ParseInt(string(p[name]), 10, 64)
	if err != nil || v < 0 {
		return 0, false, errorf(wire.CodeInvalidParams, "%s must be a non-negative integer", name)
	}
	return v, true, nil
}

// sessionID type-checks session_id; a missing or empty one is 4006.
func (p params) sessionID() (string, *rpcError) {
	s, err := p.str("session_id")
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", errorf(wire.CodeSessionRequired, "session_id required")
	}
	return s, nil
}
