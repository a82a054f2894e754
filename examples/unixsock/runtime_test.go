package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

// event is one session event as a client saw it.
type event struct {
	Type    string          `json:"type"`
	Session string          `json:"session_id"`
	Seq     uint64          `json:"seq"`
	Payload json.RawMessage `json:"payload"`
}

// TestRuntimeLoadSharedSession: a host starts with ws only; the example
// Unix-socket transport is loaded at runtime (`tether plugins load`); a
// WebSocket client and a line client on the Unix socket watch one session
// and submit prompts from both sides: both see the same events, once, in
// seq order, and session.active_list counts one viewer on each transport.
// Unloading the Unix transport mid-run closes its client with 1012 while
// the run completes on ws, untouched; once the transport is loaded again,
// the line client resumes the session and catches up from its last seq.
func TestRuntimeLoadSharedSession(t *testing.T) {
	bin, sum := buildPlugin(t)
	s := e2e.Start(t, e2e.Config{Args: []string{"--echo-delay", "10ms", "--pty-command", ""}})
	load := func() {
		t.Helper()
		out, errOut, code := e2e.Tether(t, "plugins", "load", "transport:unix="+bin+"#"+sum, "--state-dir", s.StateDir)
		if code != 0 || !strings.Contains(out, "unix") {
			t.Fatalf("tether plugins load: exit %d\n%s%s", code, out, errOut)
		}
	}
	load()
	sock := filepath.Join(s.StateDir, "unix.sock") // the default address of an added transport

	// Access is the host's on a loaded transport too: a wrong token is 4401.
	bad, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", sock, err)
	}
	defer bad.Close()
	_ = bad.SetDeadline(time.Now().Add(30 * time.Second))
	refused := &lineClient{t: t, nc: bad, r: bufio.NewReader(bad)}
	refused.writeLine("TETHER token=wrong")
	if m := refused.readMessage(); m["close"] != float64(4401) {
		t.Errorf("wrong token on the loaded transport: got %v, want the close line with 4401", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	w := s.Dial(t)
	var snap struct {
		SessionID  string `json:"session_id"`
		SessionKey string `json:"session_key"`
		LatestSeq  uint64 `json:"latest_seq"`
	}
	if err := w.Call(ctx, "session.create", map[string]any{"title": "two transports"}, &snap); err != nil {
		t.Fatal(err)
	}
	u := dialLines(t, sock, s.Token)
	u.call("session.activate", map[string]any{"session_id": snap.SessionID})
	checkTransports(ctx, t, w, snap.SessionID, map[string]int{"ws": 1, "unix": 1})

	// Prompts from both sides: both clients see the same events.
	var wsEvents []event
	wsUntilComplete := func() {
		t.Helper()
		for {
			e, err := w.NextEvent(ctx)
			if err != nil {
				t.Fatalf("ws client: %v", err)
			}
			ev := event{Type: e.Type, Session: e.SessionID, Seq: e.Seq, Payload: e.Payload}
			wsEvents = append(wsEvents, ev)
			if ev.Type == "message.complete" {
				return
			}
		}
	}
	if err := w.Call(ctx, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": "from the browser side"}, nil); err != nil {
		t.Fatal(err)
	}
	wsUntilComplete()
	u.untilEvent("message.complete")
	u.call("prompt.submit", map[string]any{"session_id": snap.SessionID, "text": "from the terminal side"})
	wsUntilComplete()
	u.untilEvent("message.complete")
	if !reflect.DeepEqual(compact(t, wsEvents), compact(t, u.events)) {
		t.Fatalf("the two transports saw different events:\nws:   %v\nunix: %v", compact(t, wsEvents), compact(t, u.events))
	}
	checkSeqs(t, wsEvents, snap.LatestSeq+1)
	if n := len(wsEvents); n != 2*(1+4+1) {
		t.Errorf("%d events, want 12: start, four deltas, complete for each prompt", n)
	}

	// Unload the Unix transport mid-run: its client gets 1012, the run
	// completes on ws.
	long := strings.TrimSpace(strings.Repeat("word ", 150))
	if err := w.Call(ctx, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": long}, nil); err != nil {
		t.Fatal(err)
	}
	u.untilEvent("message.delta")
	if out, errOut, code := e2e.Tether(t, "plugins", "unload", "unix", "--state-dir", s.StateDir); code != 0 || strings.Contains(out, "unix") {
		t.Fatalf("tether plugins unload unix: exit %d\n%s%s", code, out, errOut)
	}
	if code := u.untilClose(); code != 1012 {
		t.Errorf("the Unix client's close after the unload: %d, want 1012", code)
	}
	lastSeen := u.events[len(u.events)-1].Seq
	var active struct {
		Sessions []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"sessions"`
	}
	if err := w.Call(ctx, "session.active_list", nil, &active); err != nil {
		t.Fatal(err)
	}
	if len(active.Sessions) != 1 || active.Sessions[0].Status != "working" {
		t.Errorf("after the unload: %+v, want the session still working (unloaded mid-run)", active.Sessions)
	}
	checkTransports(ctx, t, w, snap.SessionID, map[string]int{"ws": 1})
	before := len(wsEvents)
	wsUntilComplete()
	var done struct{ Text, Status string }
	_ = json.Unmarshal(wsEvents[len(wsEvents)-1].Payload, &done)
	if done.Status != "complete" || done.Text != long {
		t.Errorf("the run after the unload ended %q with %d bytes, want complete with the whole prompt", done.Status, len(done.Text))
	}
	if n := len(wsEvents) - before; n != 1+150+1 {
		t.Errorf("the ws client saw %d events of the run, want 152", n)
	}

	// Loaded again: the client resumes the session by key and catches up.
	load()
	u2 := dialLines(t, sock, s.Token)
	res := u2.call("session.resume", map[string]any{"session_id": snap.SessionKey})
	if res["session_id"] != snap.SessionID {
		t.Errorf("resume on the reloaded transport: session %v, want the live %s", res["session_id"], snap.SessionID)
	}
	since := u2.call("session.events.since", map[string]any{"session_id": snap.SessionID, "last_seen": lastSeen})
	var missed []event
	b, _ := json.Marshal(since["events"])
	if err := json.Unmarshal(b, &missed); err != nil {
		t.Fatal(err)
	}
	var want []event
	for _, e := range wsEvents {
		if e.Seq > lastSeen {
			want = append(want, e)
		}
	}
	if !reflect.DeepEqual(compact(t, missed), compact(t, want)) {
		t.Errorf("events.since after the reload: %d events, want the %d the ws client saw after seq %d", len(missed), len(want), lastSeen)
	}
	checkTransports(ctx, t, w, snap.SessionID, map[string]int{"ws": 1, "unix": 1})
	u2.call("prompt.submit", map[string]any{"session_id": snap.SessionID, "text": "back again"})
	wsUntilComplete()
	if got := u2.untilEvent("message.complete"); got.Seq != wsEvents[len(wsEvents)-1].Seq {
		t.Errorf("the reloaded client's message.complete has seq %d, the ws client's %d", got.Seq, wsEvents[len(wsEvents)-1].Seq)
	}

	// `tether plugins reload unix` swaps it as ws is swapped: the socket
	// path is the transport's own, so the old process goes first (1012),
	// then a fresh one serves the same path and the client resumes.
	if out, errOut, code := e2e.Tether(t, "plugins", "reload", "unix", "--state-dir", s.StateDir); code != 0 {
		t.Fatalf("tether plugins reload unix: exit %d\n%s%s", code, out, errOut)
	}
	if code := u2.untilClose(); code != 1012 {
		t.Errorf("the Unix client's close after the reload: %d, want 1012", code)
	}
	u3 := dialLines(t, sock, s.Token)
	if res := u3.call("session.resume", map[string]any{"session_id": snap.SessionKey}); res["session_id"] != snap.SessionID {
		t.Errorf("resume after the reload: session %v, want %s", res["session_id"], snap.SessionID)
	}
	checkTransports(ctx, t, w, snap.SessionID, map[string]int{"ws": 1, "unix": 1})
}

// checkTransports checks session.active_list's viewers per transport.
func checkTransports(ctx context.Context, t *testing.T, w *wsclient.Client, sid string, want map[string]int) {
	t.Helper()
	var active struct {
		Sessions []struct {
			ID         string         `json:"id"`
			Viewers    int            `json:"viewers"`
			Transports map[string]int `json:"transports"`
		} `json:"sessions"`
	}
	if err := w.Call(ctx, "session.active_list", nil, &active); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range want {
		total += n
	}
	for _, s := range active.Sessions {
		if s.ID == sid {
			if s.Viewers != total || !reflect.DeepEqual(s.Transports, want) {
				t.Errorf("session.active_list: %d viewers %v, want %d %v", s.Viewers, s.Transports, total, want)
			}
			return
		}
	}
	t.Errorf("session.active_list has no session %s", sid)
}

// compact renders events for comparison (payloads as compact JSON).
func compact(t *testing.T, evs []event) []string {
	t.Helper()
	out := make([]string, len(evs))
	for i, e := range evs {
		var v any
		if err := json.Unmarshal(e.Payload, &v); err != nil {
			t.Fatalf("event %d payload %q: %v", e.Seq, e.Payload, err)
		}
		p, _ := json.Marshal(v)
		out[i] = fmt.Sprintf("%s %d %s %s", e.Session, e.Seq, e.Type, p)
	}
	return out
}

// checkSeqs checks that evs have seq first, first+1, … (each once, in
// order).
func checkSeqs(t *testing.T, evs []event, first uint64) {
	t.Helper()
	for i, e := range evs {
		if e.Seq != first+uint64(i) {
			t.Fatalf("event %d has seq %d, want %d", i, e.Seq, first+uint64(i))
		}
	}
}

// lines is a client of the line protocol whose reader runs in the
// background, so events are recorded in arrival order while calls wait.
type lines struct {
	t      *testing.T
	nc     net.Conn
	in     chan map[string]any
	nextID int
	events []event // every event received so far
}

// dialLines connects to sock, sends the handshake and reads
// gateway.ready. The connection is closed at the end of the test.
func dialLines(t *testing.T, sock, token string) *lines {
	t.Helper()
	nc, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", sock, err)
	}
	_ = nc.SetDeadline(time.Now().Add(time.Minute))
	c := &lines{t: t, nc: nc, in: make(chan map[string]any, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(c.in)
		r := bufio.NewReader(nc)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			var m map[string]any
			if json.Unmarshal(line, &m) != nil {
				m = map[string]any{"unparsed": string(line)}
			}
			c.in <- m
		}
	}()
	t.Cleanup(func() {
		nc.Close()
		<-done
	})
	if _, err := fmt.Fprintf(nc, "TETHER token=%s\n", token); err != nil {
		t.Fatal(err)
	}
	if m := c.next(); param(m, "type") != "gateway.ready" {
		t.Fatalf("first line: %v, want gateway.ready", m)
	}
	return c
}

// next returns the next message, recording it if it is an event.
func (c *lines) next() map[string]any {
	c.t.Helper()
	m, ok := <-c.in
	if !ok {
		c.t.Fatal("the Unix-socket connection ended")
	}
	if m["method"] == "event" {
		var e event
		b, _ := json.Marshal(m["params"])
		_ = json.Unmarshal(b, &e)
		if e.Session != "" {
			c.events = append(c.events, e)
		}
	}
	return m
}

// call sends a request and returns its result.
func (c *lines) call(method string, params any) map[string]any {
	c.t.Helper()
	c.nextID++
	id := c.nextID
	p, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	if _, err := c.nc.Write(append(p, '\n')); err != nil {
		c.t.Fatalf("%s: %v", method, err)
	}
	for {
		m := c.next()
		if m["id"] != float64(id) {
			continue
		}
		if m["error"] != nil {
			c.t.Fatalf("%s: error %v", method, m["error"])
		}
		res, _ := m["result"].(map[string]any)
		return res
	}
}

// untilEvent reads up to the next event of type typ and returns it.
func (c *lines) untilEvent(typ string) event {
	c.t.Helper()
	for {
		if m := c.next(); m["method"] == "event" && param(m, "type") == typ {
			return c.events[len(c.events)-1]
		}
	}
}

// untilClose reads up to the close line and returns its code.
func (c *lines) untilClose() int {
	c.t.Helper()
	for {
		m := c.next()
		if code, ok := m["close"].(float64); ok {
			return int(code)
		}
	}
}
