package e2e_test

// Bad-input battery (issue 6, reliability suites) against the live binary:
// malformed JSON-RPC, a wrong type for every param of every method, frames
// over the limit, invalid UTF-8, binary frames on /api/ws, malformed attach
// tokens and offsets and stale cursors on /api/pty, wrong tokens, origins
// and hosts, and 1,000 sockets dropped in the middle of their handshake.
// Each refusal is docs/PROTOCOL.md's code; afterwards the host still serves, its
// goroutines and memory are back to their baseline (so are the WebSocket
// plugin's memory), and sessions stored before the battery resume with
// every message.
//
// errors_test.go checks each code once; this file checks them across the
// whole input space and in volume, and what the host is left with.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	gobws "github.com/gobwas/ws"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
	"github.com/tether-agent/tether/wire"
)

const (
	// badUnknownSID is a well-formed runtime id no session has.
	badUnknownSID = "deadbeef"
	// badUnknownKey is a well-formed stored key no session has.
	badUnknownKey = "20200101_000000_abcdef"
	// badDrops is the number of sockets dropped mid-handshake.
	badDrops = 1000
	// badDropConcurrency is how many of them are in flight at once.
	badDropConcurrency = 50
	// badRSSSlack is how far above its baseline a process's RSS may settle:
	// generous, since a Go heap grown by a 1 MiB frame or a thousand
	// sockets is returned to the OS lazily.
	badRSSSlack = 64 << 20
	// badHeapSlack is how far above its baseline the host's in-use heap
	// may settle after a forced GC.
	badHeapSlack = 8 << 20
)

// badPTYCommand prints ~9 KB (more than the 1 KiB ring) and waits.
const badPTYCommand = `sh -c 'seq 1 2000; exec sleep 600'`

// badParam is one param of a method and the JSON type it takes.
type badParam struct {
	name string
	kind string // "string", "int" (non-negative integer), "bool"
}

// badWrong are wrong-typed JSON values for each kind of param. null is
// not among them: a null param counts as absent (docs/PROTOCOL.md, section 3: a null
// session_id is 4006, checked in errors_test.go).
var badWrong = map[string][]string{
	"string": {`5`, `0`, `-1`, `1.5`, `true`, `false`, `{}`, `{"a":"b"}`, `[]`, `["x"]`},
	"int":    {`"5"`, `""`, `"x"`, `true`, `false`, `{}`, `[]`, `[1]`, `1.5`, `-1`, `1e400`, `9223372036854775808`, `-9223372036854775809`},
	"bool":   {`"true"`, `"false"`, `""`, `0`, `1`, `{}`, `[]`, `[true]`},
}

// badValid is a valid value for each param, used while another is wrong.
var badValid = map[string]string{
	"session_id":          `"` + badUnknownSID + `"`,
	"title":               `"t"`,
	"close_on_disconnect": `false`,
	"parent_session_id":   `"` + badUnknownKey + `"`,
	"cols":                `80`,
	"limit":               `10`,
	"last_seen":           `0`,
	"text":                `"hello"`,
}

// badMethods are the methods of docs/PROTOCOL.md, section 5, with their params.
var badMethods = []struct {
	method string
	params []badParam
}{
	{"session.create", []badParam{{"cols", "int"}, {"title", "string"}, {"close_on_disconnect", "bool"}, {"parent_session_id", "string"}}},
	{"session.branch", []badParam{{"session_id", "string"}}},
	{"session.resume", []badParam{{"session_id", "string"}, {"cols", "int"}}},
	{"session.activate", []badParam{{"session_id", "string"}}},
	{"session.close", []badParam{{"session_id", "string"}}},
	{"session.active_list", nil},
	{"session.list", []badParam{{"limit", "int"}}},
	{"session.events.since", []badParam{{"session_id", "string"}, {"last_seen", "int"}}},
	{"prompt.submit", []badParam{{"session_id", "string"}, {"text", "string"}}},
	{"session.runs", []badParam{{"session_id", "string"}}},
	{"session.interrupt", []badParam{{"session_id", "string"}}},
}

// badRSS reads VmRSS of pid.
func badRSS(tb testing.TB, pid int) int64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatalf("reading status of pid %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				tb.Fatalf("pid %d: VmRSS %q: %v", pid, v, err)
			}
			return kb << 10
		}
	}
	tb.Fatalf("pid %d: no VmRSS in /proc status", pid)
	return 0
}

// badPluginPID returns the pid of the host's child running `plugin ws`.
func badPluginPID(tb testing.TB, s *e2e.Server) int {
	tb.Helper()
	host := s.Cmd.Process.Pid
	for _, pid := range childPIDs(tb, host) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if bytes.Contains(cmdline, []byte("plugin\x00ws")) {
			return pid
		}
	}
	tb.Fatalf("no child of the host (pid %d) runs `plugin ws`", host)
	return 0
}

// hostHeapInuse returns the host's HeapInuse after a forced GC, from the
// admin listener's heap profile.
func hostHeapInuse(tb testing.TB, s *e2e.Server) int64 {
	tb.Helper()
	body := adminGet(tb, s, "/debug/pprof/heap?gc=1&debug=1")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "# HeapInuse = "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				tb.Fatalf("heap profile: HeapInuse %q: %v", v, err)
			}
			return n
		}
	}
	tb.Fatalf("heap profile has no HeapInuse line")
	return 0
}

// badWaitBelow polls read until it is at most limit, for up to
// settleWithin; it returns the last value read.
func badWaitBelow(read func() int64, limit int64) int64 {
	deadline := time.Now().Add(settleWithin)
	v := read()
	for v > limit && time.Now().Before(deadline) {
		time.Sleep(250 * time.Millisecond) // polling the GC's scavenger
		v = read()
	}
	return v
}

// badWSConn is a raw WebSocket client connection for frames wsclient
// cannot send: fragments, and frames the server cuts short.
type badWSConn struct {
	nc net.Conn
	r  io.Reader
}

func badDialWS(tb testing.TB, s *e2e.Server, path string) *badWSConn {
	tb.Helper()
	nc, br, _, err := gobws.Dialer{Timeout: errsStep}.Dial(ctxT(tb, errsStep), s.WSURL(path))
	if err != nil {
		tb.Fatalf("dial %s: %v", path, err)
	}
	tb.Cleanup(func() { nc.Close() })
	c := &badWSConn{nc: nc, r: nc}
	if br != nil {
		c.r = io.MultiReader(br, nc)
	}
	return c
}

// write sends frames (masked, as a client must) from a goroutine, since
// the server may close before it has read them all; the returned func
// waits for the write to end.
func (c *badWSConn) write(frames ...gobws.Frame) (wait func()) {
	var b bytes.Buffer
	for _, f := range frames {
		f.Payload = bytes.Clone(f.Payload)
		_ = gobws.WriteFrame(&b, gobws.MaskFrameInPlace(f))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = c.nc.Write(b.Bytes())
	}()
	return func() {
		select {
		case <-done:
		case <-time.After(errsStep):
			c.nc.Close()
			<-done
		}
	}
}

// closeCode reads frames until the server's close frame and returns its
// code; data frames before it are returned too. A connection that ends
// without a close frame is a failure: docs/PROTOCOL.md, section 12, wants a code.
func (c *badWSConn) closeCode(tb testing.TB) (code int, data [][]byte) {
	tb.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(errsStep))
	for {
		f, err := badReadFrame(c.r)
		if err != nil {
			tb.Fatalf("reading until the close frame: %v (a refusal must be a close frame with a code)", err)
		}
		switch f.Header.OpCode {
		case gobws.OpClose:
			if len(f.Payload) < 2 {
				return 1005, data
			}
			return int(f.Payload[0])<<8 | int(f.Payload[1]), data
		case gobws.OpText, gobws.OpBinary:
			data = append(data, f.Payload)
		}
	}
}

// badReadFrame reads one frame from the server, refusing a declared
// length over 16 MiB (the server sends nothing near that).
func badReadFrame(r io.Reader) (gobws.Frame, error) {
	h, err := gobws.ReadHeader(r)
	if err != nil {
		return gobws.Frame{}, err
	}
	if h.Length > 16<<20 {
		return gobws.Frame{}, fmt.Errorf("frame of %d bytes declared", h.Length)
	}
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(r, p); err != nil {
		return gobws.Frame{}, err
	}
	if h.Masked {
		gobws.Cipher(p, h.Mask, 0)
	}
	return gobws.Frame{Header: h, Payload: p}, nil
}

// badResponse is a JSON-RPC response read raw.
type badResponse struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code int `json:"code"`
	} `json:"error"`
}

// badExchange sends frame on c and returns the response it gets.
func badExchange(tb testing.TB, c *wsclient.Client, frame []byte, binary bool) badResponse {
	tb.Helper()
	var err error
	if binary {
		err = c.SendBinary(frame)
	} else {
		err = c.SendRaw(frame)
	}
	if err != nil {
		tb.Fatalf("send: %v", err)
	}
	raw, err := c.NextRaw(ctxT(tb, errsStep))
	if err != nil {
		tb.Fatalf("waiting for the response to %.80q: %v", frame, err)
	}
	var r badResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		tb.Fatalf("response %.200s: %v", raw, err)
	}
	return r
}

// badGarbage returns n frames that are not one JSON value: random bytes
// made valid UTF-8 (invalid UTF-8 closes the socket, checked elsewhere),
// truncated and doubled JSON, and a few classics.
func badGarbage(n int) [][]byte {
	out := [][]byte{
		[]byte("not json"), []byte(""), []byte(" "), []byte("{"), []byte("}"), []byte(`{"jsonrpc":"2.0",`),
		[]byte(`{"a":1}{"b":2}`), []byte(`{} {}`), []byte(`nul`), []byte(`tru`), []byte(`"unterminated`),
		[]byte(`{"id":1,"method":"session.list",}`), []byte(`{'id':1}`), []byte(`{"id":01}`), []byte(`[1,]`),
		[]byte(`{"a":"\x"}`), []byte(`{"a":"\ud800"`), []byte("\x00"), []byte("{\"id\":1}\x00"),
		bytes.Repeat([]byte("["), 100000),                                                          // nesting past any decoder's depth
		append(bytes.Repeat([]byte("x"), 1<<20-1), '{'),                                            // 1 MiB of garbage, at the limit
		append([]byte(`{"jsonrpc":"2.0","id":1,"method":"`), bytes.Repeat([]byte("a"), 500000)...), // unterminated string
	}
	r := rand.New(rand.NewPCG(6, 6))
	for len(out) < n {
		p := make([]byte, 1+r.IntN(200))
		for i := range p {
			p[i] = byte(r.IntN(256))
		}
		p = bytes.ToValidUTF8(p, []byte("?"))
		if json.Valid(bytes.TrimSpace(p)) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// TestBadInputBattery runs the battery against one host and checks what
// the host is left with.
func TestBadInputBattery(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{
		"--admin-listen", "127.0.0.1:0", "--pprof",
		"--orphan-grace", "0",
		"--allow-origin", "https://ok.example",
		"--pty-command", badPTYCommand,
		"--pty-buffer", "1KiB",
		"--log-level", "info",
	}})
	ctx := ctxT(t, errsStep)

	// Data stored before the battery: a session with two turns, stored
	// and released, and a live one with a turn, viewed by keeper.
	keeper := s.Dial(t)
	var stored, live snapshot
	call(t, keeper, "session.create", map[string]any{"title": "stored before the battery"}, &stored)
	for _, text := range []string{"first turn", "second turn"} {
		call(t, keeper, "prompt.submit", map[string]any{"session_id": stored.SessionID, "text": text}, nil)
		waitComplete(t, keeper, stored.SessionID)
	}
	var storedSince struct {
		LatestSeq uint64 `json:"latest_seq"`
		Epoch     string `json:"epoch"`
	}
	call(t, keeper, "session.events.since", map[string]any{"session_id": stored.SessionID, "last_seen": 0}, &storedSince)
	call(t, keeper, "session.close", map[string]any{"session_id": stored.SessionID}, nil)
	call(t, keeper, "session.create", map[string]any{"title": "live during the battery"}, &live)
	call(t, keeper, "prompt.submit", map[string]any{"session_id": live.SessionID, "text": "live turn"}, nil)
	waitComplete(t, keeper, live.SessionID)
	wantStored := []message{{Role: "user", Text: "first turn"}, {Role: "assistant", Text: "first turn"}, {Role: "user", Text: "second turn"}, {Role: "assistant", Text: "second turn"}}
	wantLive := []message{{Role: "user", Text: "live turn"}, {Role: "assistant", Text: "live turn"}}

	// A PTY whose output has rolled past its 1 KiB ring. While it writes,
	// the ring outruns the output stream and an attached socket may be
	// closed with 1013 "output gap" (a client reattaches): attach (with
	// no cursor: a screen snapshot) until the screen shows the end of the
	// output.
	ptyToken := attachToken(t)
	for deadline := time.Now().Add(errsStep); ; {
		pc := ptyDial(t, s, "attach="+ptyToken)
		r := replayOf(t, pc)
		snap, err := pc.WaitSnapshot(ctx)
		pc.Close()
		if err == nil && r.ReplayEndOffset > 1024 && bytes.Contains(snap, []byte("\r\n2000\r\n")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pty replay %+v (%v): want a rolled window ending with the last line", r, err)
		}
		time.Sleep(50 * time.Millisecond) // the child is still writing
	}
	// The token the mid-handshake drops attach to, spawned before the
	// baseline so that its PTY is part of it.
	dropToken := attachToken(t)
	dc := ptyDial(t, s, "attach="+dropToken)
	replayOf(t, dc)
	dc.Close()

	// Warm up every path once (lazy pools, the heap's first growth), then
	// take the baselines.
	warm := s.Dial(t)
	badExchange(t, warm, []byte("warm up"), false)
	badExchange(t, warm, []byte(`{"jsonrpc":"2.0","id":"w","method":"session.list"}`), true)
	warm.Close()
	baseGoroutines := goroutineBaseline(t, s)
	baseConns := s.Metric(t, "tether_connections")
	baseHeap := hostHeapInuse(t, s)
	pluginPID := badPluginPID(t, s)
	hostPID := s.Cmd.Process.Pid
	baseHostRSS, basePluginRSS := badRSS(t, hostPID), badRSS(t, pluginPID)
	activeBefore, storedBefore := len(activeList(t, keeper)), badStoredCount(t, keeper)
	t.Logf("baseline: %d host goroutines, host heap in use %d KiB, RSS host %d MiB, ws plugin %d MiB",
		baseGoroutines, baseHeap>>10, baseHostRSS>>20, basePluginRSS>>20)

	t.Run("not JSON", func(t *testing.T) {
		c := s.Dial(t)
		frames := badGarbage(300)
		for _, f := range frames {
			r := badExchange(t, c, f, false)
			if string(r.ID) != "null" || r.Error == nil || r.Error.Code != wire.CodeParseError || r.Result != nil {
				t.Errorf("frame %.60q: got id %s error %+v, want id null and %d", f, r.ID, r.Error, wire.CodeParseError)
			}
		}
		// Valid JSON that is not one request object.
		for _, f := range []string{`[]`, `[{"jsonrpc":"2.0","id":1,"method":"session.list"}]`, `42`, `"x"`, `true`, `null`, `[[[[[[[[[[]]]]]]]]]]`} {
			if r := badExchange(t, c, []byte(f), false); string(r.ID) != "null" || r.Error == nil || r.Error.Code != wire.CodeInvalidRequest {
				t.Errorf("frame %s: got id %s error %+v, want id null and %d", f, r.ID, r.Error, wire.CodeInvalidRequest)
			}
		}
		errsAlive(t, c)
		t.Logf("%d frames that are not JSON, each answered -32700 on one open socket", len(frames))
	})

	t.Run("binary frames on /api/ws", func(t *testing.T) {
		c := s.Dial(t)
		for _, f := range [][]byte{
			[]byte(`{"jsonrpc":"2.0","id":1,"method":"session.list"}`), {}, {0, 0xff, 0xfe}, []byte("\xff not utf-8 either"), bytes.Repeat([]byte{7}, 100000),
		} {
			if r := badExchange(t, c, f, true); string(r.ID) != "null" || r.Error == nil || r.Error.Code != wire.CodeInvalidRequest {
				t.Errorf("binary frame %.40q: got id %s error %+v, want id null and %d", f, r.ID, r.Error, wire.CodeInvalidRequest)
			}
		}
		errsAlive(t, c)
	})

	t.Run("wrong types", func(t *testing.T) {
		c := s.Dial(t)
		cases := 0
		check := func(t *testing.T, method string, params json.RawMessage) {
			t.Helper()
			cases++
			err := c.Call(ctxT(t, errsStep), method, params, nil)
			if got := wsclient.ErrorCode(err); got != wire.CodeInvalidParams {
				t.Errorf("%s %s: got %v (code %d), want %d", method, params, err, got, wire.CodeInvalidParams)
			}
		}
		for _, m := range badMethods {
			t.Run(m.method, func(t *testing.T) {
				// params itself of the wrong type.
				for _, p := range []string{`[]`, `[{}]`, `"x"`, `""`, `5`, `true`, `false`} {
					check(t, m.method, json.RawMessage(p))
				}
				// Each param wrong, the others valid; for a method that
				// takes a session_id, with a known live runtime id, an
				// unknown one, and an unknown stored key (params are
				// type-checked before any lookup, docs/PROTOCOL.md, section 3).
				sids := []string{`"` + live.SessionID + `"`, `"` + badUnknownSID + `"`, `"` + badUnknownKey + `"`}
				for _, wrong := range m.params {
					for _, v := range badWrong[wrong.kind] {
						contexts := []string{""}
						if wrong.name != "session_id" && hasParam(m.params, "session_id") {
							contexts = sids
						}
						for _, sid := range contexts {
							params := map[string]json.RawMessage{}
							for _, p := range m.params {
								params[p.name] = json.RawMessage(badValid[p.name])
							}
							if sid != "" {
								params["session_id"] = json.RawMessage(sid)
							}
							params[wrong.name] = json.RawMessage(v)
							b, err := json.Marshal(params)
							if err != nil {
								t.Fatal(err)
							}
							check(t, m.method, b)
						}
					}
				}
			})
		}
		errsAlive(t, c)
		t.Logf("%d wrong-typed calls, each -32602", cases)
		// Refused calls changed nothing.
		if n := len(activeList(t, c)); n != activeBefore {
			t.Errorf("live sessions: %d after the wrong-typed calls, want %d as before", n, activeBefore)
		}
		if n := badStoredCount(t, c); n != storedBefore {
			t.Errorf("stored sessions: %d after the wrong-typed calls, want %d as before", n, storedBefore)
		}
	})

	t.Run("frames over 1 MiB are 1009", func(t *testing.T) {
		const limit = 1 << 20
		big := bytes.Repeat([]byte("a"), limit+1)
		for _, tt := range []struct {
			name   string
			frames []gobws.Frame
		}{
			{"text of 1 MiB + 1", []gobws.Frame{gobws.NewTextFrame(big)}},
			{"binary of 1 MiB + 1", []gobws.Frame{gobws.NewBinaryFrame(big)}},
			{"text of 1 MiB + 1 in 3 fragments", []gobws.Frame{
				gobws.NewFrame(gobws.OpText, false, big[:limit/2]),
				gobws.NewFrame(gobws.OpContinuation, false, big[limit/2:limit]),
				gobws.NewFrame(gobws.OpContinuation, true, big[limit:]),
			}},
			{"binary of 4 MiB in 64 fragments", badFragments(gobws.OpBinary, make([]byte, 4<<20), 64)},
		} {
			t.Run(tt.name, func(t *testing.T) {
				c := badDialWS(t, s, "/api/ws")
				wait := c.write(tt.frames...)
				code, data := c.closeCode(t)
				wait()
				if code != wire.CloseTooBig {
					t.Errorf("close %d, want %d", code, wire.CloseTooBig)
				}
				for _, d := range data {
					if !bytes.Contains(d, []byte("gateway.ready")) {
						t.Errorf("got %.100q before the close, want nothing but gateway.ready", d)
					}
				}
			})
		}
	})

	t.Run("invalid UTF-8 is 1007", func(t *testing.T) {
		for _, tt := range []struct {
			name   string
			frames []gobws.Frame
		}{
			{"in a request", []gobws.Frame{gobws.NewTextFrame([]byte(`{"jsonrpc":"2.0","id":1,"method":"session.create","params":{"title":"` + "\xc3\x28" + `"}}`))}},
			{"lone continuation byte", []gobws.Frame{gobws.NewTextFrame([]byte("\x80"))}},
			{"overlong", []gobws.Frame{gobws.NewTextFrame([]byte("\xc0\xaf"))}},
			{"surrogate", []gobws.Frame{gobws.NewTextFrame([]byte(`{"a":"` + "\xed\xa0\x80" + `"}`))}},
			{"split across fragments", []gobws.Frame{
				gobws.NewFrame(gobws.OpText, false, []byte(`{"jsonrpc":"2.0","id":1,"method":"session.list","params":{"x":"`+"\xe2\x82")),
				gobws.NewFrame(gobws.OpContinuation, true, []byte("(\"}}")),
			}},
			{"cut at the end", []gobws.Frame{gobws.NewTextFrame([]byte("\xf0\x9d\x84"))}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				c := badDialWS(t, s, "/api/ws")
				wait := c.write(tt.frames...)
				code, data := c.closeCode(t)
				wait()
				if code != wire.CloseInvalidPayload {
					t.Errorf("close %d, want %d", code, wire.CloseInvalidPayload)
				}
				if len(data) > 1 {
					t.Errorf("got %d frames before the close, want only gateway.ready", len(data))
				}
			})
		}
		// Split valid UTF-8 is fine.
		c := badDialWS(t, s, "/api/ws")
		req := []byte(`{"jsonrpc":"2.0","id":7,"method":"session.list","params":{"limit":1,"x":"é✓𝄞"}}`)
		cut := bytes.Index(req, []byte("✓")) + 1
		c.write(gobws.NewFrame(gobws.OpText, false, req[:cut]), gobws.NewFrame(gobws.OpContinuation, true, req[cut:]))()
		_ = c.nc.SetReadDeadline(time.Now().Add(errsStep))
		for {
			f, err := badReadFrame(c.r)
			if err != nil || f.Header.OpCode == gobws.OpClose {
				t.Fatalf("valid UTF-8 split across fragments: got %v %v, want a response", f.Header.OpCode, err)
			}
			if bytes.Contains(f.Payload, []byte(`"id":7`)) {
				if !bytes.Contains(f.Payload, []byte(`"result"`)) {
					t.Errorf("response %s, want a result", f.Payload)
				}
				break
			}
		}
	})

	t.Run("pty: malformed attach or offset is 4400", func(t *testing.T) {
		tok := attachToken(t)
		queries := []string{
			"attach=", "attach=short", "attach=" + strings.Repeat("a", 15), "attach=" + strings.Repeat("a", 129),
			"attach=" + strings.Repeat("a", 15) + "!", "attach=" + strings.Repeat("a", 15) + "%20", "attach=" + strings.Repeat("a", 15) + ".",
			"attach=" + strings.Repeat("%C3%A9", 16), "attach=" + tok + "&attach=" + tok,
			"attach=" + tok + "&offset=", "attach=" + tok + "&offset=-1", "attach=" + tok + "&offset=x", "attach=" + tok + "&offset=1.5",
			"attach=" + tok + "&offset=1e3", "attach=" + tok + "&offset=99999999999999999999", "attach=" + tok + "&offset=0x10",
			"attach=" + tok + "&offset=1&offset=2", "attach=" + tok + "&offset=+5", "attach=" + tok + "&offset=%205",
			"offset=-1", "offset=abc",
		}
		for _, q := range queries {
			c := ptyDial(t, s, q)
			if code := closeCode(t, c); code != wire.CloseBadRequest {
				t.Errorf("/api/pty?%s: close %d, want %d", q, code, wire.CloseBadRequest)
			}
		}
		// A query that does not parse at all, with the token in a
		// header: the access checks pass, the query is malformed.
		bearer := wsclient.Options{Header: http.Header{"Authorization": {"Bearer " + s.Token}}}
		for _, q := range []string{"attach=%zz" + tok, "attach=" + tok + "&offset=%"} {
			c, err := s.DialRaw(ctxT(t, errsStep), "/api/pty?"+q, bearer)
			if err != nil {
				t.Fatalf("dial /api/pty?%s: %v", q, err)
			}
			<-c.Closed()
			if code, _ := c.CloseCode(); code != wire.CloseBadRequest {
				t.Errorf("/api/pty?%s with a bearer token: close %d, want %d", q, code, wire.CloseBadRequest)
			}
			c.Close()
		}
		// With the token in that query, the host cannot read the token
		// either: 4401 is as right as 4400 (docs/PROTOCOL.md, section 2: the token is checked
		// first).
		c := ptyDial(t, s, "attach=%zz"+tok)
		if code := closeCode(t, c); code != wire.CloseBadRequest && code != wire.CloseUnauthorized {
			t.Errorf("/api/pty?attach=%%zz…&token=…: close %d, want %d or %d", code, wire.CloseBadRequest, wire.CloseUnauthorized)
		}
		// None of them spawned a PTY for the well-formed token.
		c = ptyDial(t, s, "attach="+tok)
		if r := replayOf(t, c); r.Reason != "initial" {
			t.Errorf("first good attach of %s: %+v, want a new PTY (initial)", tok, r)
		}
		c.Close()
	})

	t.Run("pty: bad cursors reset", func(t *testing.T) {
		// With no cursor: a snapshot of the screen at the end of the
		// output; the 1 KiB ring holds the last KiB before it.
		c := ptyDial(t, s, "attach="+ptyToken)
		cur := replayOf(t, c)
		c.Close()
		end := cur.ReplayEndOffset
		const ring = 1 << 10
		if !cur.Snapshot || cur.StartOffset != end || end <= ring {
			t.Fatalf("replay %+v: want a snapshot at the end of output rolled past the ring", cur)
		}
		ringStart := end - ring
		for _, tt := range []struct {
			query, reason string
		}{
			{fmt.Sprintf("offset=%d&epoch=not-the-epoch", end), "epoch_mismatch"},
			{fmt.Sprintf("offset=%d&epoch=%s", end, strings.Repeat("e", 200)), "epoch_mismatch"},
			{fmt.Sprintf("offset=%d&epoch=%s%%00", end, cur.Epoch), "epoch_mismatch"},
			{fmt.Sprintf("offset=%d", end), "invalid_cursor"},
			{fmt.Sprintf("offset=%d&epoch=", end), "invalid_cursor"},
			{fmt.Sprintf("offset=0&epoch=%s", cur.Epoch), "offset_rolled_out"},
			{fmt.Sprintf("offset=%d&epoch=%s", ringStart-1, cur.Epoch), "offset_rolled_out"},
			{fmt.Sprintf("offset=%d&epoch=%s", end+1, cur.Epoch), "offset_ahead"},
			{fmt.Sprintf("offset=9223372036854775807&epoch=%s", cur.Epoch), "offset_ahead"},
			{fmt.Sprintf("epoch=%s", cur.Epoch), "initial"},
		} {
			// Every reset gets a snapshot at the end, no raw bytes.
			c := ptyDial(t, s, "attach="+ptyToken+"&"+tt.query)
			r := replayOf(t, c)
			if !r.Reset || r.Reason != tt.reason || r.Epoch != cur.Epoch || !r.Snapshot || r.StartOffset != end || r.ReplayEndOffset != end {
				t.Errorf("%s: replay %+v, want reset, reason %s, a snapshot at %d of epoch %s", tt.query, r, tt.reason, end, cur.Epoch)
			}
			if snap, err := c.WaitSnapshot(ctxT(t, errsStep)); err != nil || !bytes.Contains(snap, []byte("2000")) {
				t.Errorf("%s: snapshot %q, %v; want the screen with the last line", tt.query, snap, err)
			}
			if got := c.Received(); got != 0 {
				t.Errorf("%s: %d raw bytes besides the snapshot, want none", tt.query, got)
			}
			c.Close()
		}
		// The oldest cursor the ring holds resumes with the whole ring,
		// raw; the good cursor at the end with nothing.
		c = ptyDial(t, s, fmt.Sprintf("attach=%s&offset=%d&epoch=%s", ptyToken, ringStart, cur.Epoch))
		if r := replayOf(t, c); r.Reset || r.Reason != "resume" || r.StartOffset != ringStart || r.ReplayEndOffset != end {
			t.Errorf("cursor at the ring's start: %+v, want resume of [%d, %d)", r, ringStart, end)
		} else if err := c.WaitOutput(ctxT(t, errsStep), func(b []byte) bool { return int64(len(b)) >= ring }); err != nil {
			t.Errorf("cursor at the ring's start: %v", err)
		}
		c.Close()
		c = ptyDial(t, s, fmt.Sprintf("attach=%s&offset=%d&epoch=%s", ptyToken, end, cur.Epoch))
		if r := replayOf(t, c); r.Reset || r.Reason != "resume" {
			t.Errorf("good cursor after the bad ones: %+v, want resume", r)
		}
		c.Close()
	})

	t.Run("access refusals", func(t *testing.T) {
		_, port, _ := strings.Cut(s.Addr, ":")
		hdr := func(kv ...string) http.Header {
			h := http.Header{}
			for i := 0; i+1 < len(kv); i += 2 {
				h.Add(kv[i], kv[i+1])
			}
			return h
		}
		type refusal struct {
			name string
			opts wsclient.Options
			want int
		}
		var tests []refusal
		for _, tok := range []string{"", "wrong", s.Token[:len(s.Token)-1], s.Token + "x", " " + s.Token, s.Token + "\x00"} {
			tests = append(tests, refusal{fmt.Sprintf("token %q", tok), wsclient.Options{Token: tok}, wire.CloseUnauthorized})
		}
		tests = append(tests,
			refusal{"bearer wrong", wsclient.Options{Header: hdr("Authorization", "Bearer wrong")}, wire.CloseUnauthorized},
			refusal{"bearer empty", wsclient.Options{Header: hdr("Authorization", "Bearer ")}, wire.CloseUnauthorized},
			refusal{"cookie wrong", wsclient.Options{Header: hdr("Cookie", "tether_token=wrong")}, wire.CloseUnauthorized},
			refusal{"wrong token, bad origin", wsclient.Options{Token: "wrong", Origin: "http://evil.example"}, wire.CloseUnauthorized},
		)
		for _, o := range []string{"http://evil.example", "null", "http://127.0.0.1:1", "http://ok.example", "https://ok.example.evil", "file://", "http://" + s.Addr + ".evil"} {
			tests = append(tests, refusal{"origin " + o, wsclient.Options{Token: s.Token, Origin: o}, wire.CloseForbidden})
		}
		for _, h := range []string{"evil.example:" + port, "127.0.0.1:1", "127.0.0.2:" + port, "[::1]:1", "localhost.evil:" + port} {
			tests = append(tests, refusal{"host " + h, wsclient.Options{Token: s.Token, Header: hdr("Host", h)}, wire.CloseForbidden})
		}
		for _, path := range []string{"/api/ws", "/api/pty?attach=" + attachToken(t)} {
			for _, tt := range tests {
				const repeat = 5 // in volume, concurrently
				var wg sync.WaitGroup
				for range repeat {
					wg.Go(func() {
						ctx, cancel := context.WithTimeout(context.Background(), errsStep)
						defer cancel()
						c, err := s.DialRaw(ctx, path, tt.opts)
						if err != nil {
							t.Errorf("%s %s: dial: %v", path, tt.name, err)
							return
						}
						defer c.Close()
						select {
						case <-c.Closed():
						case <-ctx.Done():
							t.Errorf("%s %s: not closed within %v", path, tt.name, errsStep)
							return
						}
						if code, _ := c.CloseCode(); code != tt.want {
							t.Errorf("%s %s: close %d, want %d", path, tt.name, code, tt.want)
						}
					})
				}
				wg.Wait()
			}
		}
	})

	t.Run("1000 sockets dropped mid-handshake", func(t *testing.T) {
		badHandshakeDrops(t, s, dropToken)
	})

	// The host still serves: a new client, a new session with a run, a
	// PTY.
	t.Run("still serving", func(t *testing.T) {
		c := s.Dial(t)
		var snap snapshot
		call(t, c, "session.create", map[string]any{"title": "after the battery"}, &snap)
		call(t, c, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": "still serving"}, nil)
		if text, status := waitComplete(t, c, snap.SessionID); text != "still serving" || status != "complete" {
			t.Errorf("run after the battery: %q %q", text, status)
		}
		call(t, c, "session.close", map[string]any{"session_id": snap.SessionID}, nil)
		p := ptyDial(t, s, "attach="+ptyToken)
		if r := replayOf(t, p); r.ReplayEndOffset == 0 {
			t.Errorf("pty after the battery: %+v, want its output", r)
		}
		p.Close()
		c.Close()
	})

	// Stored data is intact.
	t.Run("stored data intact", func(t *testing.T) {
		c := s.Dial(t)
		var resumed snapshot
		call(t, c, "session.resume", map[string]any{"session_id": stored.SessionKey}, &resumed)
		// What was read before the battery, and the close's own
		// session.closed after it.
		wantSeq := storedSince.LatestSeq + 1
		if fmt.Sprint(resumed.Messages) != fmt.Sprint(wantStored) || resumed.Epoch != storedSince.Epoch || resumed.LatestSeq != wantSeq {
			t.Errorf("stored session after the battery: messages %v epoch %q latest_seq %d; want %v, %q, %d",
				resumed.Messages, resumed.Epoch, resumed.LatestSeq, wantStored, storedSince.Epoch, wantSeq)
		}
		var since struct {
			Events    []json.RawMessage `json:"events"`
			Truncated bool              `json:"truncated"`
		}
		call(t, c, "session.events.since", map[string]any{"session_id": resumed.SessionID, "last_seen": 0}, &since)
		var lastType string
		for i, raw := range since.Events {
			var ev struct {
				Seq  uint64
				Type string
			}
			if err := json.Unmarshal(raw, &ev); err != nil || ev.Seq != uint64(i+1) {
				t.Errorf("journal of the stored session: event %d has seq %d (%v), want %d", i, ev.Seq, err, i+1)
				break
			}
			lastType = ev.Type
		}
		if since.Truncated || uint64(len(since.Events)) != wantSeq || lastType != "session.closed" {
			t.Errorf("journal: %d events ending with %q, truncated %v; want %d ending with session.closed, false", len(since.Events), lastType, since.Truncated, wantSeq)
		}
		call(t, c, "session.close", map[string]any{"session_id": resumed.SessionID}, nil)
		var again snapshot
		call(t, keeper, "session.activate", map[string]any{"session_id": live.SessionID}, &again)
		if fmt.Sprint(again.Messages) != fmt.Sprint(wantLive) {
			t.Errorf("live session after the battery: messages %v, want %v", again.Messages, wantLive)
		}
		c.Close()
	})

	// Resources back to baseline.
	t.Run("back to baseline", func(t *testing.T) {
		waitGoroutines(t, s, baseGoroutines)
		if got := badWaitBelow(func() int64 { return int64(s.Metric(t, "tether_connections")) }, int64(baseConns)+1); got > int64(baseConns)+1 {
			t.Errorf("tether_connections: %d, baseline %v (keeper open): connections leaked", got, baseConns)
		}
		heap := badWaitBelow(func() int64 { return hostHeapInuse(t, s) }, baseHeap+badHeapSlack)
		hostRSS := badWaitBelow(func() int64 { return badRSS(t, hostPID) }, baseHostRSS+badRSSSlack)
		pluginRSS := badWaitBelow(func() int64 { return badRSS(t, pluginPID) }, basePluginRSS+badRSSSlack)
		t.Logf("after: host heap in use %d KiB (baseline %d), RSS host %d MiB (baseline %d), ws plugin %d MiB (baseline %d)",
			heap>>10, baseHeap>>10, hostRSS>>20, baseHostRSS>>20, pluginRSS>>20, basePluginRSS>>20)
		if heap > baseHeap+badHeapSlack {
			t.Errorf("host heap in use %d KiB after the battery, baseline %d KiB (slack %d KiB)", heap>>10, baseHeap>>10, badHeapSlack>>10)
		}
		if hostRSS > baseHostRSS+badRSSSlack {
			t.Errorf("host RSS %d MiB after the battery, baseline %d MiB (slack %d MiB)", hostRSS>>20, baseHostRSS>>20, badRSSSlack>>20)
		}
		if pluginRSS > basePluginRSS+badRSSSlack {
			t.Errorf("ws plugin RSS %d MiB after the battery, baseline %d MiB (slack %d MiB)", pluginRSS>>20, basePluginRSS>>20, badRSSSlack>>20)
		}
		if p := badPluginPID(t, s); p != pluginPID {
			t.Errorf("ws plugin pid %d, was %d: the plugin restarted during the battery", p, pluginPID)
		}
	})
	errsNoErrorLogs(t, s)
}

// hasParam reports whether params has one called name.
func hasParam(params []badParam, name string) bool {
	for _, p := range params {
		if p.name == name {
			return true
		}
	}
	return false
}

// badStoredCount returns the number of stored sessions.
func badStoredCount(tb testing.TB, c *wsclient.Client) int {
	tb.Helper()
	var res struct {
		Sessions []json.RawMessage `json:"sessions"`
	}
	call(tb, c, "session.list", map[string]any{"limit": 10000}, &res)
	return len(res.Sessions)
}

// badFragments splits p into n fragments of a message of opcode op.
func badFragments(op gobws.OpCode, p []byte, n int) []gobws.Frame {
	frames := make([]gobws.Frame, n)
	for i := range n {
		o := gobws.OpContinuation
		if i == 0 {
			o = op
		}
		frames[i] = gobws.NewFrame(o, i == n-1, p[len(p)*i/n:len(p)*(i+1)/n])
	}
	return frames
}

// badHandshakeDrops opens badDrops TCP connections to the public listener,
// badDropConcurrency at a time, and abandons each somewhere in its
// handshake: before a byte, mid request line, mid headers, with garbage,
// or with a complete upgrade (refused or admitted, to /api/ws or to
// /api/pty) followed at once by a reset, before or after the 101.
func badHandshakeDrops(t *testing.T, s *e2e.Server, ptyToken string) {
	upgrade := func(target string) string {
		return "GET " + target + " HTTP/1.1\r\nHost: " + s.Addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	}
	full := upgrade("/api/ws?token=" + s.Token)
	variants := []struct {
		name     string
		send     string
		read101  bool // read the 101 before the reset
		graceful bool // FIN rather than RST
	}{
		{name: "nothing", graceful: true},
		{name: "nothing, reset"},
		{name: "half a request line", send: "GET /api/w", graceful: true},
		{name: "request line only", send: "GET /api/ws?token=" + s.Token + " HTTP/1.1\r\n"},
		{name: "headers without the blank line", send: full[:len(full)-2], graceful: true},
		{name: "half the headers, reset", send: full[:len(full)/2]},
		{name: "garbage", send: "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 TLS hello to a plain listener"},
		{name: "upgrade without token, reset", send: upgrade("/api/ws")},
		{name: "upgrade, reset", send: full},
		{name: "upgrade, 101, reset", send: full, read101: true},
		{name: "upgrade, 101, close", send: full, read101: true, graceful: true},
		{name: "upgrade to a pty, reset", send: upgrade("/api/pty?attach=" + ptyToken + "&token=" + s.Token)},
		{name: "upgrade to a pty, 101, reset", send: upgrade("/api/pty?attach=" + ptyToken + "&token=" + s.Token), read101: true},
		{name: "upgrade with a frame, reset", send: full + "\x81\x85\x01\x02\x03\x04" + "ab"},
		{name: "healthz, no read", send: "GET /healthz HTTP/1.1\r\nHost: " + s.Addr + "\r\n\r\n"},
	}
	counts := make([]int, len(variants))
	for i := range badDrops {
		counts[i%len(variants)]++
	}
	sem := make(chan struct{}, badDropConcurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	start := time.Now()
	for i := range badDrops {
		v := variants[i%len(variants)]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := badDropOne(s.Addr, v.send, v.read101, v.graceful); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Sprintf("%s: %v", v.name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for i, e := range errs {
		if i == 10 {
			t.Errorf("... and %d more", len(errs)-10)
			break
		}
		t.Error(e)
	}
	t.Logf("%d sockets abandoned mid-handshake in %v (%d variants, %d each)", badDrops, time.Since(start).Round(time.Millisecond), len(variants), counts[0])
}

// badDropOne opens one connection, sends send, optionally reads the 101
// response, and closes (with a reset unless graceful).
func badDropOne(addr, send string, read101, graceful bool) error {
	nc, err := net.DialTimeout("tcp", addr, errsStep)
	if err != nil {
		return err
	}
	tc := nc.(*net.TCPConn)
	defer func() {
		if !graceful {
			_ = tc.SetLinger(0)
		}
		_ = tc.Close()
	}()
	if send != "" {
		if _, err := io.WriteString(tc, send); err != nil {
			return err
		}
	}
	if read101 {
		_ = tc.SetReadDeadline(time.Now().Add(errsStep))
		line, err := bufio.NewReader(tc).ReadString('\n')
		if err != nil {
			return fmt.Errorf("reading the status line: %w", err)
		}
		if !strings.HasPrefix(line, "HTTP/1.1 101 ") {
			return fmt.Errorf("status line %q, want 101", line)
		}
	}
	return nil
}
