package rpc

import (
	"encoding/json"
	"testing"

	"github.com/tether-agent/tether/wire"
)

func TestParseParams(t *testing.T) {
	tests := []struct {
		name     string
		raw      string
		wantCode int // 0: no error
		wantKeys []string
	}{
		{name: "absent", raw: ""},
		{name: "null", raw: "null"},
		{name: "null with spaces", raw: " \n null\t"},
		{name: "empty object", raw: "{}"},
		{name: "object", raw: `{"a":1,"b":"x"}`, wantKeys: []string{"a", "b"}},
		{name: "object with spaces", raw: ` { "a" : null } `, wantKeys: []string{"a"}},
		{name: "array", raw: "[1]", wantCode: wire.CodeInvalidParams},
		{name: "empty array", raw: "[]", wantCode: wire.CodeInvalidParams},
		{name: "string", raw: `"x"`, wantCode: wire.CodeInvalidParams},
		{name: "number", raw: "1", wantCode: wire.CodeInvalidParams},
		{name: "true", raw: "true", wantCode: wire.CodeInvalidParams},
		{name: "malformed object", raw: `{"a":}`, wantCode: wire.CodeInvalidParams},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var raw json.RawMessage
			if tt.raw != "" {
				raw = json.RawMessage(tt.raw)
			}
			p, err := parseParams(raw)
			if tt.wantCode != 0 {
				if err == nil || err.Code != tt.wantCode {
					t.Fatalf("parseParams(%s): got %v, %v; want code %d", tt.raw, p, err, tt.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseParams(%s): got error %v, want nil", tt.raw, err)
			}
			if p == nil {
				t.Fatalf("parseParams(%s): got nil params, want an empty map at least", tt.raw)
			}
			if len(p) != len(tt.wantKeys) {
				t.Errorf("parseParams(%s): got %d keys, want %d", tt.raw, len(p), len(tt.wantKeys))
			}
			for _, k := range tt.wantKeys {
				if _, ok := p[k]; !ok {
					t.Errorf("parseParams(%s): got no key %q, want it", tt.raw, k)
				}
			}
		})
	}
}

// mustParams parses a params object for the field tests.
func mustParams(tb testing.TB, raw string) params {
	tb.Helper()
	p, err := parseParams(json.RawMessage(raw))
	if err != nil {
		tb.Fatalf("parseParams(%s): got error %v, want nil", raw, err)
	}
	return p
}

func TestParamsInteger(t *testing.T) {
	tests := []struct {
		name     string
		raw      string
		want     int64
		wantSet  bool
		wantCode int
	}{
		{name: "absent", raw: `{}`},
		{name: "null", raw: `{"n":null}`},
		{name: "zero", raw: `{"n":0}`, want: 0, wantSet: true},
		{name: "positive", raw: `{"n":42}`, want: 42, wantSet: true},
		{name: "max int64", raw: `{"n":9223372036854775807}`, want: 1<<63 - 1, wantSet: true},
		{name: "above int64", raw: `{"n":9223372036854775808}`, wantCode: wire.CodeInvalidParams},
		{name: "huge", raw: `{"n":123456789012345678901234567890}`, wantCode: wire.CodeInvalidParams},
		{name: "huge exponent", raw: `{"n":1e400}`, wantCode: wire.CodeInvalidParams},
		{name: "negative", raw: `{"n":-1}`, wantCode: wire.CodeInvalidParams},
		{name: "min int64", raw: `{"n":-9223372036854775808}`, wantCode: wire.CodeInvalidParams},
		{name: "fraction", raw: `{"n":1.5}`, wantCode: wire.CodeInvalidParams},
		{name: "string", raw: `{"n":"1"}`, wantCode: wire.CodeInvalidParams},
		{name: "bool", raw: `{"n":true}`, wantCode: wire.CodeInvalidParams},
		{name: "object", raw: `{"n":{}}`, wantCode: wire.CodeInvalidParams},
		{name: "array", raw: `{"n":[1]}`, wantCode: wire.CodeInvalidParams},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, set, err := mustParams(t, tt.raw).integer("n")
			if tt.wantCode != 0 {
				if err == nil || err.Code != tt.wantCode {
					t.Fatalf("integer(%s): got %d, %v, %v; want code %d", tt.raw, got, set, err, tt.wantCode)
				}
				return
			}
			if err != nil || got != tt.want || set != tt.wantSet {
				t.Errorf("integer(%s): got %d, %v, %v; want %d, %v, nil", tt.raw, got, set, err, tt.want, tt.wantSet)
			}
		})
	}
}

func TestParamsStrBoolean(t *testing.T) {
	strTests := []struct {
		raw      string
		want     string
		wantCode int
	}{
		{raw: `{}`, want: ""},
		{raw: `{"s":null}`, want: ""},
		{raw: `{"s":""}`, want: ""},
		{raw: `{"s":"x\u00e9"}`, want: "xé"},
		{raw: `{"s":5}`, wantCode: wire.CodeInvalidParams},
		{raw: `{"s":false}`, wantCode: wire.CodeInvalidParams},
		{raw: `{"s":["x"]}`, wantCode: wire.CodeInvalidParams},
		{raw: `{"s":{"x":1}}`, wantCode: wire.CodeInvalidParams},
	}
	for _, tt := range strTests {
		got, err := mustParams(t, tt.raw).str("s")
		switch {
		case tt.wantCode != 0 && (err == nil || err.Code != tt.wantCode):
			t.Errorf("str(%s): got %q, %v; want code %d", tt.raw, got, err, tt.wantCode)
		case tt.wantCode == 0 && (err != nil || got != tt.want):
			t.Errorf("str(%s): got %q, %v; want %q, nil", tt.raw, got, err, tt.want)
		}
	}
	boolTests := []struct {
		raw      string
		want     bool
		wantCode int
	}{
		{raw: `{}`, want: false},
		{raw: `{"b":null}`, want: false},
		{raw: `{"b":true}`, want: true},
		{raw: `{"b":false}`, want: false},
		{raw: `{"b":1}`, wantCode: wire.CodeInvalidParams},
		{raw: `{"b":"true"}`, wantCode: wire.CodeInvalidParams},
	}
	for _, tt := range boolTests {
		got, err := mustParams(t, tt.raw).boolean("b")
		switch {
		case tt.wantCode != 0 && (err == nil || err.Code != tt.wantCode):
			t.Errorf("boolean(%s): got %v, %v; want code %d", tt.raw, got, err, tt.wantCode)
		case tt.wantCode == 0 && (err != nil || got != tt.want):
			t.Errorf("boolean(%s): got %v, %v; want %v, nil", tt.raw, got, err, tt.want)
		}
	}
}

func TestParamsSessionID(t *testing.T) {
	tests := []struct {
		name     string
		raw      string
		want     string
		wantCode int
	}{
		{name: "missing", raw: `{}`, wantCode: wire.CodeSessionRequired},
		{name: "null", raw: `{"session_id":null}`, wantCode: wire.CodeSessionRequired},
		{name: "empty", raw: `{"session_id":""}`, wantCode: wire.CodeSessionRequired},
		{name: "number", raw: `{"session_id":5}`, wantCode: wire.CodeInvalidParams},
		{name: "bool", raw: `{"session_id":true}`, wantCode: wire.CodeInvalidParams},
		{name: "array", raw: `{"session_id":["deadbeef"]}`, wantCode: wire.CodeInvalidParams},
		{name: "runtime id", raw: `{"session_id":"deadbeef"}`, want: "deadbeef"},
		{name: "stored key", raw: `{"session_id":"20250102_030405_abcdef"}`, want: "20250102_030405_abcdef"},
		{name: "title", raw: `{"session_id":"my title"}`, want: "my title"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := mustParams(t, tt.raw).sessionID()
			if tt.wantCode != 0 {
				if err == nil || err.Code != tt.wantCode {
					t.Fatalf("sessionID(%s): got %q, %v; want code %d", tt.raw, got, err, tt.wantCode)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("sessionID(%s): got %q, %v; want %q, nil", tt.raw, got, err, tt.want)
			}
		})
	}
}

func TestValidID(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "null"},
		{"null", "null"},
		{"1", "1"},
		{"-7", "-7"},
		{`"abc"`, `"abc"`},
		{"true", "null"},
		{"{}", "null"},
		{"[1]", "null"},
	}
	for _, tt := range tests {
		var in json.RawMessage
		if tt.in != "" {
			in = json.RawMessage(tt.in)
		}
		if got := string(validID(in)); got != tt.want {
			t.Errorf("validID(%s): got %s, want %s", tt.in, got, tt.want)
		}
	}
}
