package wire

import (
	"encoding/json"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// resizeRef is the resize rule written the other way round, as a
// reference for ParseResize: a regular expression and the range.
var resizeRef = regexp.MustCompile(`^\x1b\[RESIZE:([0-9]+);([0-9]+)\]$`)

func refParseResize(frame []byte) (int, int, bool) {
	if len(frame) > 64 {
		return 0, 0, false
	}
	m := resizeRef.FindSubmatch(frame)
	if m == nil {
		return 0, 0, false
	}
	num := func(b []byte) (int, bool) {
		s := strings.TrimLeft(string(b), "0")
		if s == "" || len(s) > 5 {
			return 0, false
		}
		n, err := strconv.Atoi(s)
		return n, err == nil && n >= 1 && n <= MaxSize
	}
	c, ok1 := num(m[1])
	r, ok2 := num(m[2])
	if !ok1 || !ok2 {
		return 0, 0, false
	}
	return c, r, true
}

func TestParseResize(t *testing.T) {
	for _, tt := range []struct {
		frame      string
		cols, rows int
		ok         bool
	}{
		{"\x1b[RESIZE:120;40]", 120, 40, true},
		{"\x1b[RESIZE:1;1]", 1, 1, true},
		{"\x1b[RESIZE:10000;10000]", 10000, 10000, true},
		{"\x1b[RESIZE:0080;024]", 80, 24, true},
		{"\x1b[RESIZE:" + strings.Repeat("0", 51) + "1;1]", 1, 1, true}, // 64 bytes
		{"\x1b[RESIZE:" + strings.Repeat("0", 52) + "1;1]", 0, 0, false},
		{"\x1b[RESIZE:10001;40]", 0, 0, false},
		{"\x1b[RESIZE:120;10001]", 0, 0, false},
		{"\x1b[RESIZE:0;40]", 0, 0, false},
		{"\x1b[RESIZE:120;0]", 0, 0, false},
		{"\x1b[RESIZE:+120;40]", 0, 0, false},
		{"\x1b[RESIZE:120;+40]", 0, 0, false},
		{"\x1b[RESIZE:-1;40]", 0, 0, false},
		{"\x1b[RESIZE:-0;40]", 0, 0, false},
		{"\x1b[RESIZE: 120;40]", 0, 0, false},
		{"\x1b[RESIZE:120;40 ]", 0, 0, false},
		{"\x1b[RESIZE:120;40]\n", 0, 0, false},
		{"\x1b[RESIZE:120;40;1]", 0, 0, false},
		{"\x1b[RESIZE:120,40]", 0, 0, false},
		{"\x1b[RESIZE:;40]", 0, 0, false},
		{"\x1b[RESIZE:120;]", 0, 0, false},
		{"\x1b[RESIZE:1_0;40]", 0, 0, false},
		{"\x1b[RESIZE:0x10;40]", 0, 0, false},
		{"\x1b[RESIZE:120;40", 0, 0, false},
		{"\x1b[resize:120;40]", 0, 0, false},
		{"x\x1b[RESIZE:120;40]", 0, 0, false},
		{"", 0, 0, false},
	} {
		t.Run(strconv.Quote(tt.frame), func(t *testing.T) {
			c, r, ok := ParseResize([]byte(tt.frame))
			if c != tt.cols || r != tt.rows || ok != tt.ok {
				t.Errorf("ParseResize: got %d, %d, %v; want %d, %d, %v", c, r, ok, tt.cols, tt.rows, tt.ok)
			}
			rc, rr, rok := refParseResize([]byte(tt.frame))
			if rc != c || rr != r || rok != ok {
				t.Errorf("reference: got %d, %d, %v; ParseResize %d, %d, %v", rc, rr, rok, c, r, ok)
			}
		})
	}
}

func TestEncodeResize(t *testing.T) {
	if got, want := string(EncodeResize(120, 40)), "\x1b[RESIZE:120;40]"; got != want {
		t.Errorf("EncodeResize(120, 40) = %q, want %q", got, want)
	}
	for _, size := range [][2]int{{1, 1}, {80, 24}, {MaxSize, MaxSize}, {MaxSize, 1}} {
		b := EncodeResize(size[0], size[1])
		if c, r, ok := ParseResize(b); !ok || c != size[0] || r != size[1] {
			t.Errorf("ParseResize(EncodeResize(%d, %d)) = %d, %d, %v", size[0], size[1], c, r, ok)
		}
		if !IsResize(b) {
			t.Errorf("IsResize(%q) = false", b)
		}
	}
	for _, size := range [][2]int{{0, 24}, {80, 0}, {-1, 24}, {MaxSize + 1, 24}} {
		if _, _, ok := ParseResize(EncodeResize(size[0], size[1])); ok {
			t.Errorf("the escape of %dx%d parses; the host would resize to it", size[0], size[1])
		}
	}
}

func TestIsResize(t *testing.T) {
	for frame, want := range map[string]bool{
		"\x1b[RESIZE:120;40]": true,
		"\x1b[RESIZE:":        true,
		"\x1b[RESIZE:garbage": true,
		"\x1b[RESIZE":         false,
		"\x1b[A":              false,
		"ls\r":                false,
		"":                    false,
	} {
		if got := IsResize([]byte(frame)); got != want {
			t.Errorf("IsResize(%q) = %v, want %v", frame, got, want)
		}
	}
}

func TestAttachTokens(t *testing.T) {
	for tok, want := range map[string]bool{
		strings.Repeat("a", 15):   false,
		strings.Repeat("a", 16):   true,
		strings.Repeat("Z", 128):  true,
		strings.Repeat("0", 129):  false,
		"abc-DEF_0123456789":      true,
		"-startswithadash":        true,
		"0123456789abcdef!":       false,
		"0123456789 abcdef":       false,
		"0123456789abcdef\n":      false,
		"ééééééééééééééééé":       false,
		"0123456789abcdef%41":     false,
		"0123456789abcdef/../../": false,
	} {
		if got := ValidAttachToken(tok); got != want {
			t.Errorf("ValidAttachToken(%q) = %v, want %v", tok, got, want)
		}
	}
	seen := map[string]bool{}
	for range 100 {
		tok := NewAttachToken()
		if !ValidAttachToken(tok) || len(tok) != 32 || strings.HasPrefix(tok, "-") {
			t.Fatalf("NewAttachToken() = %q: want 32 hex digits", tok)
		}
		if seen[tok] {
			t.Fatalf("NewAttachToken() repeated %q", tok)
		}
		seen[tok] = true
	}
}

func TestPTYURL(t *testing.T) {
	base := &url.URL{Scheme: "wss", Host: "h.example:8443", Path: "/pre/", User: url.User("u"), Fragment: "f"}
	for _, tt := range []struct {
		q    PTYQuery
		want string
	}{
		{PTYQuery{}, "wss://h.example:8443/pre/api/pty"},
		{PTYQuery{Attach: "0123456789abcdef"}, "wss://h.example:8443/pre/api/pty?attach=0123456789abcdef"},
		{PTYQuery{Attach: "0123456789abcdef", View: true}, "wss://h.example:8443/pre/api/pty?attach=0123456789abcdef&view=1"},
		{PTYQuery{Attach: "0123456789abcdef", HasCursor: true, Offset: 0, Epoch: "e 1&x"},
			"wss://h.example:8443/pre/api/pty?attach=0123456789abcdef&epoch=e+1%26x&offset=0"},
		{PTYQuery{Attach: "0123456789abcdef", Offset: 5, Epoch: "e1"}, "wss://h.example:8443/pre/api/pty?attach=0123456789abcdef"},
	} {
		if got := PTYURL(base, tt.q).String(); got != tt.want {
			t.Errorf("PTYURL(%+v) = %s, want %s", tt.q, got, tt.want)
		}
	}
	if got := PTYURL(&url.URL{Scheme: "ws", Host: "127.0.0.1:1"}, PTYQuery{}).String(); got != "ws://127.0.0.1:1/api/pty" {
		t.Errorf("PTYURL of a bare host = %s", got)
	}
}

// TestReplaySnapshotBytes: a snapshot's header carries snapshot_bytes,
// also when it is 0; a raw replay's carries none of the snapshot fields.
func TestReplaySnapshotBytes(t *testing.T) {
	for _, tt := range []struct {
		name string
		r    Replay
		want string
	}{
		{"empty snapshot", Replay{Type: ReplayType, Epoch: "e1", Reset: true, Reason: ReasonInitial, Snapshot: true, Cols: 80, Rows: 24},
			`{"type":"pty.replay","epoch":"e1","start_offset":0,"replay_end_offset":0,"reset":true,"reason":"initial","snapshot":true,"snapshot_bytes":0,"cols":80,"rows":24}`},
		{"snapshot", Replay{Type: ReplayType, Epoch: "e1", StartOffset: 9, ReplayEndOffset: 9, Reset: true, Reason: ReasonOffsetAhead, Snapshot: true, SnapshotBytes: 120, Cols: 80, Rows: 24},
			`{"type":"pty.replay","epoch":"e1","start_offset":9,"replay_end_offset":9,"reset":true,"reason":"offset_ahead","snapshot":true,"snapshot_bytes":120,"cols":80,"rows":24}`},
		{"raw", Replay{Type: ReplayType, Epoch: "e1", StartOffset: 3, ReplayEndOffset: 10, Reason: ReasonResume},
			`{"type":"pty.replay","epoch":"e1","start_offset":3,"replay_end_offset":10,"reset":false,"reason":"resume"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.r)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Errorf("json.Marshal(%+v) = %s\nwant %s", tt.r, b, tt.want)
			}
			if got, err := DecodeReplay(b); err != nil || got != tt.r {
				t.Errorf("DecodeReplay(%s) = %+v, %v; want %+v", b, got, err, tt.r)
			}
		})
	}
}

func TestDecodeReplay(t *testing.T) {
	for _, tt := range []struct {
		name, frame string
		want        Replay
		ok          bool
	}{
		{"resume", `{"type":"pty.replay","epoch":"e1","start_offset":3,"replay_end_offset":10,"reset":false,"reason":"resume"}`,
			Replay{Type: ReplayType, Epoch: "e1", StartOffset: 3, ReplayEndOffset: 10, Reason: ReasonResume}, true},
		{"initial", `{"type":"pty.replay","epoch":"e1","start_offset":0,"replay_end_offset":5,"reset":true,"reason":"initial"}`,
			Replay{Type: ReplayType, Epoch: "e1", ReplayEndOffset: 5, Reset: true, Reason: ReasonInitial}, true},
		{"snapshot", `{"type":"pty.replay","epoch":"e1","start_offset":9,"replay_end_offset":9,"reset":true,"reason":"epoch_mismatch","snapshot":true,"snapshot_bytes":120,"cols":80,"rows":24}`,
			Replay{Type: ReplayType, Epoch: "e1", StartOffset: 9, ReplayEndOffset: 9, Reset: true, Reason: ReasonEpochMismatch, Snapshot: true, SnapshotBytes: 120, Cols: 80, Rows: 24}, true},
		{"empty snapshot", `{"type":"pty.replay","epoch":"e1","start_offset":0,"replay_end_offset":0,"reset":true,"reason":"initial","snapshot":true,"snapshot_bytes":0,"cols":80,"rows":24}`,
			Replay{Type: ReplayType, Epoch: "e1", Reset: true, Reason: ReasonInitial, Snapshot: true, Cols: 80, Rows: 24}, true},
		{"unknown reason", `{"type":"pty.replay","epoch":"e","start_offset":0,"replay_end_offset":0,"reset":true,"reason":"later"}`,
			Replay{Type: ReplayType, Epoch: "e", Reset: true, Reason: "later"}, true},
		{"padding", " {\"type\":\"pty.replay\",\"reset\":true,\"reason\":\"initial\"}\n", Replay{Type: ReplayType, Reset: true, Reason: ReasonInitial}, true},
		{"other type", `{"type":"pty.other","reset":true,"reason":"initial"}`, Replay{}, false},
		{"no type", `{"reset":true,"reason":"initial"}`, Replay{}, false},
		{"numeric epoch", `{"type":"pty.replay","epoch":7,"reset":true,"reason":"initial"}`, Replay{}, false},
		{"end before start", `{"type":"pty.replay","start_offset":5,"replay_end_offset":4,"reset":true,"reason":"initial"}`, Replay{}, false},
		{"negative", `{"type":"pty.replay","start_offset":-1,"replay_end_offset":4,"reset":true,"reason":"initial"}`, Replay{}, false},
		{"resume with reset", `{"type":"pty.replay","reset":true,"reason":"resume"}`, Replay{}, false},
		{"no reset without resume", `{"type":"pty.replay","reset":false,"reason":"initial"}`, Replay{}, false},
		{"snapshot without reset", `{"type":"pty.replay","reset":false,"reason":"resume","snapshot":true,"snapshot_bytes":1,"cols":80,"rows":24}`, Replay{}, false},
		{"snapshot with a window", `{"type":"pty.replay","start_offset":0,"replay_end_offset":4,"reset":true,"reason":"initial","snapshot":true,"snapshot_bytes":1,"cols":80,"rows":24}`, Replay{}, false},
		{"snapshot without size", `{"type":"pty.replay","reset":true,"reason":"initial","snapshot":true,"snapshot_bytes":1}`, Replay{}, false},
		{"snapshot negative", `{"type":"pty.replay","reset":true,"reason":"initial","snapshot":true,"snapshot_bytes":-1,"cols":80,"rows":24}`, Replay{}, false},
		{"snapshot bytes alone", `{"type":"pty.replay","reset":true,"reason":"initial","snapshot_bytes":5}`, Replay{}, false},
		{"two objects", `{"type":"pty.replay","reset":true,"reason":"initial"}{}`, Replay{}, false},
		{"trailing garbage", `{"type":"pty.replay","reset":true,"reason":"initial"} }`, Replay{}, false},
		{"array", `[{"type":"pty.replay"}]`, Replay{}, false},
		{"not json", `pty.replay`, Replay{}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeReplay([]byte(tt.frame))
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("DecodeReplay: got %+v, %v; want %+v, ok %v", got, err, tt.want, tt.ok)
			}
		})
	}
}

func TestReconnectable(t *testing.T) {
	want := map[int]bool{CloseGoingAway: true, CloseAbnormal: true, CloseServiceRestart: true, CloseTryAgainLater: true}
	for _, code := range []int{CloseNormal, CloseGoingAway, CloseProtocolError, CloseNoStatus, CloseAbnormal, CloseInvalidPayload,
		CloseTooBig, CloseInternalError, CloseServiceRestart, CloseTryAgainLater, CloseBadRequest, CloseUnauthorized,
		CloseForbidden, CloseNotFound, CloseNotLoopback, CloseSuperseded, CloseProcessExited, CloseNoSuchTerminal} {
		if got := Reconnectable(code); got != want[code] {
			t.Errorf("Reconnectable(%d) = %v, want %v", code, got, want[code])
		}
	}
}
