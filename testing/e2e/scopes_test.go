package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	gobws "github.com/gobwas/ws"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/ptyclient"
	"github.com/tether-agent/tether/testing/wsclient"
	"github.com/tether-agent/tether/wire"
)

// The scope tests: credentials made with the real CLI (`tether token
// create`, `tether share`) against a real `tether serve`, over /api/ws,
// /api/pty and /acp (docs/PROTOCOL.md, "Credentials and scopes"). The
// per-method tables are unit tests (host/internal/rpc, ptyroute, acpgw);
// these show what only the running host can: the CLI's credentials, the
// gateways' close codes on the wire, the journal's `by`, and revocation
// and expiry closing open sockets within a second.

// revokeBound is how soon after a revocation or an expiry every socket
// opened with the credential must be closed (docs/PROTOCOL.md,
// "Credentials and scopes"): the spec's bound, not a wait.
const revokeBound = time.Second

// forbiddenReason is the reason of a 4403 close outside the scope.
const forbiddenReason = "outside this credential's scope"

// as returns a copy of s presenting secret instead of its access token
// (WSURL, Dial, DialRaw use it).
func as(s *e2e.Server, secret string) *e2e.Server {
	c := *s
	c.Token = secret
	return &c
}

// credentialCLI runs `tether ARGS… --json --state-dir DIR` against s
// (the CLI finds the host's URL and access token in its state dir) and
// returns the credential it printed.
func credentialCLI(tb testing.TB, s *e2e.Server, args ...string) wire.CredentialCreated {
	tb.Helper()
	args = append(args, "--json", "--state-dir", s.StateDir)
	out, stderr, code := e2e.Tether(tb, args...)
	if code != 0 {
		tb.Fatalf("tether %s: exit %d\nstdout %s\nstderr %s", strings.Join(args, " "), code, out, stderr)
	}
	var r wire.CredentialCreated
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Secret == "" {
		tb.Fatalf("tether %s: %v; printed %q", strings.Join(args, " "), err, out)
	}
	return r
}

// tokenCreate makes a credential with `tether token create --name NAME
// ARGS…`.
func tokenCreate(tb testing.TB, s *e2e.Server, name string, args ...string) wire.CredentialCreated {
	tb.Helper()
	return credentialCLI(tb, s, append([]string{"token", "create", "--name", name}, args...)...)
}

// shareCLI makes a share credential with `tether share WHAT ID ARGS…`.
func shareCLI(tb testing.TB, s *e2e.Server, what, id string, args ...string) wire.CredentialCreated {
	tb.Helper()
	return credentialCLI(tb, s, append([]string{"share", what, id}, args...)...)
}

// tokenRevoke runs `tether token revoke WHO` against s and returns when
// it has returned.
func tokenRevoke(tb testing.TB, s *e2e.Server, who string) time.Time {
	tb.Helper()
	out, stderr, code := e2e.Tether(tb, "token", "revoke", who, "--state-dir", s.StateDir)
	if code != 0 || !strings.Contains(out, "revoked") {
		tb.Fatalf("tether token revoke %s: exit %d\nstdout %s\nstderr %s", who, code, out, stderr)
	}
	return time.Now()
}

// wantForbidden calls method on c and fails the test unless the answer
// is 4030.
func wantForbidden(tb testing.TB, c *wsclient.Client, what, method string, params any) {
	tb.Helper()
	err := c.Call(ctxT(tb, 10*time.Second), method, params, nil)
	if code := wsclient.ErrorCode(err); code != wire.CodeForbidden || !strings.Contains(fmt.Sprint(err), forbiddenReason) {
		tb.Errorf("%s: %s: got %v (code %d), want 4030 %q", what, method, err, code, forbiddenReason)
	}
}

// journal returns every event of the session sid since 0.
func journal(tb testing.TB, c *wsclient.Client, sid string) wire.EventsSince {
	tb.Helper()
	var since wire.EventsSince
	call(tb, c, wire.MethodEventsSince, wire.EventsSinceParams{SessionID: sid}, &since)
	return since
}

// payloadsOf returns the payloads of the events of type typ in j.
func payloadsOf(tb testing.TB, j wire.EventsSince, typ string) []map[string]any {
	tb.Helper()
	var out []map[string]any
	for _, e := range j.Events {
		if e.Type != typ {
			continue
		}
		var p map[string]any
		if err := json.Unmarshal(e.Payload, &p); err != nil {
			tb.Fatalf("%s payload %s: %v", typ, e.Payload, err)
		}
		out = append(out, p)
	}
	return out
}

// submitAndWait submits text on sid and waits for its message.complete.
func submitAndWait(tb testing.TB, c *wsclient.Client, sid, text string) {
	tb.Helper()
	call(tb, c, wire.MethodSubmit, wire.SubmitParams{SessionID: sid, Text: text}, nil)
	if _, status := waitComplete(tb, c, sid); status != "complete" {
		tb.Fatalf("prompt %q on %s: %s, want complete", text, sid, status)
	}
}

// sockClose is how and when the host closed a socket.
type sockClose struct {
	what   string
	at     time.Time
	code   int
	reason string
	err    error // the socket ended without a close the watcher could read
}

// watchWS reports on the returned channel how c ends.
func watchWS(what string, c *wsclient.Client) <-chan sockClose {
	ch := make(chan sockClose, 1)
	go func() {
		<-c.Closed()
		at := time.Now()
		code, reason := c.CloseCode()
		ch <- sockClose{what: what, at: at, code: code, reason: reason}
	}()
	return ch
}

// watchPTY reports on the returned channel how c ends.
func watchPTY(what string, c *ptyclient.Client) <-chan sockClose {
	ch := make(chan sockClose, 1)
	go func() {
		<-c.Closed()
		at := time.Now()
		code, reason, err := c.CloseCode(context.Background())
		ch <- sockClose{what: what, at: at, code: code, reason: reason, err: err}
	}()
	return ch
}

// acpSock is a raw /acp socket (see acpRaw) that the test can also
// watch for its close, with the reason.
type acpSock struct{ *acpRaw }

// dialACPAs opens /acp on h presenting secret, and says initialize.
func dialACPAs(tb testing.TB, h acpHost, secret string) acpSock {
	tb.Helper()
	c := acpSock{dialACPRaw(tb, acpHost{Server: as(h.Server, secret), AgentDir: h.AgentDir, AgentLog: h.AgentLog})}
	if r, _ := c.call(1, "initialize", acpInitParams); r.Error != nil {
		tb.Fatalf("/acp initialize: %+v", r.Error)
	}
	return c
}

// readClose reads frames until the server's close frame (or the end of
// the connection, an error) and returns its code and reason.
func (c acpSock) readClose(within time.Duration) (code int, reason string, err error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(within))
	for {
		f, err := badReadFrame(c.r)
		if err != nil {
			return 0, "", fmt.Errorf("/acp: no close frame: %w", err)
		}
		if f.Header.OpCode != gobws.OpClose {
			continue
		}
		if len(f.Payload) < 2 {
			return 1005, "", nil
		}
		return int(f.Payload[0])<<8 | int(f.Payload[1]), string(f.Payload[2:]), nil
	}
}

// watch reports on the returned channel how the socket ends (within
// 30 s).
func (c acpSock) watch(what string) <-chan sockClose {
	ch := make(chan sockClose, 1)
	go func() {
		code, reason, err := c.readClose(30 * time.Second)
		ch <- sockClose{what: what, at: time.Now(), code: code, reason: reason, err: err}
	}()
	return ch
}

// TestScopesOverRealHost: credentials made with `tether token create`
// and `tether share`, used against one real host over its three
// gateways. A session view can resume and read its session and nothing
// more (4030, the journal unchanged); a credential for session B is
// refused session A; a `new` credential reaches what it created only;
// a pty view share watches the terminal and its input never reaches the
// PTY; a credential for another PTY is closed 4403; an /acp view can
// load but its prompt closes the socket 4403 and never reaches the
// agent; the journal names who prompted and who closed.
func TestScopesOverRealHost(t *testing.T) {
	h := startACPHost(t, acpHostConfig{Args: []string{"--pty-command", "sh"}})
	s := h.Server
	admin := s.Dial(t)

	var a, b wire.Snapshot
	call(t, admin, wire.MethodCreate, wire.CreateParams{Title: "scope-a"}, &a)
	call(t, admin, wire.MethodCreate, wire.CreateParams{Title: "scope-b"}, &b)
	submitAndWait(t, admin, a.SessionID, "first")
	before := journal(t, admin, a.SessionID)

	t.Run("session view", func(t *testing.T) {
		view := shareCLI(t, s, "session", a.SessionKey, "--view")
		if got := view.Credential.Scopes; len(got) != 1 || got[0] != "session:"+a.SessionKey+":view" {
			t.Fatalf("tether share session --view: scopes %q", got)
		}
		v := as(s, view.Secret).Dial(t)
		var snap wire.Snapshot
		call(t, v, wire.MethodResume, wire.ResumeParams{SessionID: a.SessionKey}, &snap)
		if got := journal(t, v, snap.SessionID); got.LatestSeq != before.LatestSeq || len(got.Events) != len(before.Events) {
			t.Errorf("the view's events.since: latest %d, %d events; want %d, %d", got.LatestSeq, len(got.Events), before.LatestSeq, len(before.Events))
		}
		wantForbidden(t, v, "session view", wire.MethodSubmit, wire.SubmitParams{SessionID: snap.SessionID, Text: "from the view"})
		wantForbidden(t, v, "session view", wire.MethodInterrupt, wire.SessionParams{SessionID: snap.SessionID})
		wantForbidden(t, v, "session view", wire.MethodClose, wire.SessionParams{SessionID: snap.SessionID})
		wantForbidden(t, v, "session view", wire.MethodResume, wire.ResumeParams{SessionID: b.SessionKey})
		after := journal(t, admin, a.SessionID)
		if after.LatestSeq != before.LatestSeq {
			t.Errorf("the journal after the view's refused calls: latest %d, was %d", after.LatestSeq, before.LatestSeq)
		}
		if live := liveForKey(activeList(t, admin), a.SessionKey); len(live) != 1 {
			t.Errorf("session A after the view's refused close: %d live, want 1", len(live))
		}
	})

	t.Run("another session", func(t *testing.T) {
		cred := tokenCreate(t, s, "bob", "--scope", "session:"+b.SessionKey)
		c := as(s, cred.Secret).Dial(t)
		wantForbidden(t, c, "session:B", wire.MethodResume, wire.ResumeParams{SessionID: a.SessionKey})
		wantForbidden(t, c, "session:B", wire.MethodResume, wire.ResumeParams{SessionID: "scope-a"}) // by title
		wantForbidden(t, c, "session:B", wire.MethodEventsSince, wire.EventsSinceParams{SessionID: a.SessionID})
		wantForbidden(t, c, "session:B", wire.MethodSubmit, wire.SubmitParams{SessionID: a.SessionID, Text: "from bob"})
		wantForbidden(t, c, "session:B", wire.MethodClose, wire.SessionParams{SessionID: a.SessionID})
		var snap wire.Snapshot
		call(t, c, wire.MethodResume, wire.ResumeParams{SessionID: b.SessionKey}, &snap)
		if got := journal(t, admin, a.SessionID); got.LatestSeq != before.LatestSeq {
			t.Errorf("session A after bob's refused calls: latest %d, was %d", got.LatestSeq, before.LatestSeq)
		}
	})

	t.Run("new", func(t *testing.T) {
		cred := tokenCreate(t, s, "nina")
		if got := cred.Credential.Scopes; len(got) != 1 || got[0] != "new" {
			t.Fatalf("tether token create without --scope: scopes %q, want [new]", got)
		}
		c := as(s, cred.Secret).Dial(t)
		var own wire.Snapshot
		call(t, c, wire.MethodCreate, wire.CreateParams{Title: "nina's"}, &own)
		submitAndWait(t, c, own.SessionID, "mine")
		wantForbidden(t, c, "new", wire.MethodSubmit, wire.SubmitParams{SessionID: a.SessionID, Text: "not mine"})
		wantForbidden(t, c, "new", wire.MethodResume, wire.ResumeParams{SessionID: a.SessionKey})
		// The grant lets its other connections reach what it made.
		c2 := as(s, cred.Secret).Dial(t)
		var again wire.Snapshot
		call(t, c2, wire.MethodResume, wire.ResumeParams{SessionID: own.SessionKey}, &again)
		if starts := payloadsOf(t, journal(t, c2, again.SessionID), wire.EventMessageStart); len(starts) != 1 || starts[0]["by"] != "nina" {
			t.Errorf("nina's session's message.start: %v, want one by nina", starts)
		}
	})

	t.Run("by", func(t *testing.T) {
		cred := tokenCreate(t, s, "alice", "--scope", "session:"+a.SessionKey)
		c := as(s, cred.Secret).Dial(t)
		var snap wire.Snapshot
		call(t, c, wire.MethodResume, wire.ResumeParams{SessionID: a.SessionKey}, &snap)
		submitAndWait(t, c, snap.SessionID, "from alice")
		call(t, c, wire.MethodClose, wire.SessionParams{SessionID: snap.SessionID}, nil)
		var re wire.Snapshot
		call(t, admin, wire.MethodResume, wire.ResumeParams{SessionID: a.SessionKey}, &re)
		j := journal(t, admin, re.SessionID)
		var by []string
		for _, p := range payloadsOf(t, j, wire.EventMessageStart) {
			by = append(by, fmt.Sprintf("%v:%v", p["prompt"], p["by"]))
		}
		if want := []string{"first:admin", "from alice:alice"}; fmt.Sprint(by) != fmt.Sprint(want) {
			t.Errorf("message.start prompt:by in the journal: %q, want %q", by, want)
		}
		if cl := payloadsOf(t, j, wire.EventSessionClosed); len(cl) != 1 || cl[0]["by"] != "alice" {
			t.Errorf("session.closed in the journal: %v, want one by alice", cl)
		}
	})

	t.Run("pty", func(t *testing.T) {
		tok := attachToken(t)
		w := ptyDial(t, s, "attach="+tok)
		replayOf(t, w)
		view := shareCLI(t, s, "pty", tok, "--view")

		// The view share may not write: an attach without view=1 is 4403.
		wr := ptyDial(t, as(s, view.Secret), "attach="+tok)
		if code, reason, err := wr.CloseCode(ctxT(t, 10*time.Second)); err != nil || code != wire.CloseForbidden || !strings.Contains(reason, forbiddenReason) {
			t.Errorf("a pty view share attaching as the writer: closed %d %q (%v), want 4403 %q", code, reason, err, forbiddenReason)
		}
		other := tokenCreate(t, s, "other-pty", "--scope", "pty:"+attachToken(t))
		for _, q := range []string{"attach=" + tok, "view=1&attach=" + tok} {
			oc := ptyDial(t, as(s, other.Secret), q)
			if code, reason, err := oc.CloseCode(ctxT(t, 10*time.Second)); err != nil || code != wire.CloseForbidden || !strings.Contains(reason, forbiddenReason) {
				t.Errorf("pty:OTHER on %s: closed %d %q (%v), want 4403", q, code, reason, err)
			}
		}

		v := ptyDial(t, as(s, view.Secret), "view=1&attach="+tok)
		replayOf(t, v)
		// What the view types would print V-MARK42 if the shell ran it.
		if err := v.Write([]byte("echo V-MARK$((40+2))\r")); err != nil {
			t.Fatal(err)
		}
		if err := w.Write([]byte("echo W-MARK$((2+3))\r")); err != nil {
			t.Fatal(err)
		}
		if err := v.WaitOutput(ctxT(t, 10*time.Second), func(o []byte) bool { return bytes.Contains(o, []byte("W-MARK5\r\n")) }); err != nil {
			t.Fatalf("the view share does not see the terminal's output: %v", err)
		}
		// The view's detach is its socket worker's last op, after its
		// input: once the PTY has no viewer, V-MARK was written if it
		// ever would be, and the shell prints it before D-MARK.
		v.Close()
		waitPTYViewers(t, s, tok, 0)
		if err := w.Write([]byte("echo D-MARK$((1+2))\r")); err != nil {
			t.Fatal(err)
		}
		if err := w.WaitOutput(ctxT(t, 10*time.Second), func(o []byte) bool { return bytes.Contains(o, []byte("D-MARK3\r\n")) }); err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(w.Output(), []byte("V-MARK42")) || bytes.Contains(w.Output(), []byte("V-MARK$")) {
			t.Errorf("the pty view share's input reached the PTY: %q", w.Output())
		}
	})

	t.Run("acp", func(t *testing.T) {
		ad := dialACPAs(t, h, s.Token)
		nw, _ := ad.call(2, "session/new", map[string]any{"cwd": h.AgentDir, "mcpServers": []any{}})
		var sess struct {
			SessionID string `json:"sessionId"`
		}
		if nw.Error != nil || json.Unmarshal(nw.Result, &sess) != nil || !storedKeyRe.MatchString(sess.SessionID) {
			t.Fatalf("/acp session/new: %+v %s", nw.Error, nw.Result)
		}
		prompt := func(c acpSock, id int, text string) acpRawMsg {
			r, _ := c.call(id, "session/prompt", map[string]any{"sessionId": sess.SessionID, "prompt": []any{map[string]any{"type": "text", "text": text}}})
			return r
		}
		if r := prompt(ad, 3, "admin one"); r.Error != nil {
			t.Fatalf("/acp admin prompt: %+v", r.Error)
		}

		view := shareCLI(t, s, "session", sess.SessionID, "--view")
		v := dialACPAs(t, h, view.Secret)
		load := func(c acpSock, id int) []acpRawMsg {
			r, notes := c.call(id, "session/load", map[string]any{"sessionId": sess.SessionID, "cwd": h.AgentDir, "mcpServers": []any{}})
			if r.Error != nil {
				t.Fatalf("/acp session/load: %+v, want it loaded", r.Error)
			}
			return notes
		}
		// The replay names who prompted: _meta["tether/by"].
		if by, ok := promptBy(load(v, 2), "admin one"); !ok || by != "admin" {
			t.Errorf("/acp replay to a view share: the prompt's user_message_chunk by %q (found %v), want admin", by, ok)
		}
		// So does the live update of another credential's prompt.
		wendy := tokenCreate(t, s, "wendy", "--scope", "session:"+sess.SessionID)
		wd := dialACPAs(t, h, wendy.Secret)
		load(wd, 2)
		if r := prompt(wd, 3, "wendy says"); r.Error != nil {
			t.Fatalf("/acp prompt by a session:KEY credential: %+v", r.Error)
		}
		if by := v.promptByLive(t, "wendy says"); by != "wendy" {
			t.Errorf("/acp live update of wendy's prompt at the view: by %q, want wendy", by)
		}
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": map[string]any{"sessionId": sess.SessionID, "prompt": []any{map[string]any{"type": "text", "text": "VIEW-PROMPT"}}}})
		v.send(string(b))
		if code, reason, err := v.readClose(10 * time.Second); err != nil || code != wire.CloseForbidden || !strings.Contains(reason, forbiddenReason) {
			t.Errorf("/acp session/prompt with a view share: closed %d %q (%v), want 4403 %q", code, reason, err, forbiddenReason)
		}
		// The admin's next prompt goes through the agent after the
		// view's would have.
		if r := prompt(ad, 4, "admin two"); r.Error != nil {
			t.Fatalf("/acp admin prompt after the view's: %+v", r.Error)
		}
		var texts []string
		for _, e := range received(h.log(t), "session/prompt") {
			texts = append(texts, string(e.Params))
		}
		if all := strings.Join(texts, "\n"); strings.Contains(all, "VIEW-PROMPT") || !strings.Contains(all, "admin two") {
			t.Errorf("the agent got prompts %q; want the admin's, never the view's", texts)
		}
	})
}

// openAll opens, with secret, an /api/ws socket (gateway.ready seen), an
// /api/pty socket on a new PTY (replay seen) and an /acp socket
// (initialize answered) on h, and returns their watchers.
func openAll(tb testing.TB, h acpHost, secret string) []<-chan sockClose {
	tb.Helper()
	ws := as(h.Server, secret).Dial(tb)
	p := ptyDial(tb, as(h.Server, secret), "attach="+attachToken(tb))
	replayOf(tb, p)
	a := dialACPAs(tb, h, secret)
	return []<-chan sockClose{watchWS("/api/ws", ws), watchPTY("/api/pty", p), a.watch("/acp")}
}

// waitClosed waits up to 10 s for every watcher and returns how each
// socket was closed; it fails the test for one still open.
func waitClosed(tb testing.TB, ws []<-chan sockClose) []sockClose {
	tb.Helper()
	timeout := time.After(10 * time.Second)
	var out []sockClose
	for _, w := range ws {
		select {
		case c := <-w:
			out = append(out, c)
		case <-timeout:
			var closed []string
			for _, c := range out {
				closed = append(closed, fmt.Sprintf("%s %d %q", c.what, c.code, c.reason))
			}
			tb.Fatalf("sockets still open 10 s on: %d of %d closed %q", len(out), len(ws), closed)
		}
	}
	return out
}

// refusedWith dials /api/ws and /api/pty on s with secret and fails the
// test unless both are refused 4401.
func refusedWith(tb testing.TB, s *e2e.Server, secret, what string) {
	tb.Helper()
	c, err := as(s, secret).DialRaw(ctxT(tb, 10*time.Second), "/api/ws", wsclient.Options{Token: secret})
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	if code := closeCodeOf(tb, c); code != wire.CloseUnauthorized {
		tb.Errorf("/api/ws with the %s credential: closed %d, want 4401", what, code)
	}
	p := ptyDial(tb, as(s, secret), "attach="+attachToken(tb))
	if code, reason, err := p.CloseCode(ctxT(tb, 10*time.Second)); err != nil || code != wire.CloseUnauthorized {
		tb.Errorf("/api/pty with the %s credential: closed %d %q (%v), want 4401", what, code, reason, err)
	}
}

// TestRevokeClosesSocketsWithin1s: `tether token revoke` closes the
// /api/ws, /api/pty and /acp sockets opened with the credential within
// a second of the command's return, 4401 "credential revoked", and the
// credential is refused from then on; a credential made with --ttl
// closes its sockets within a second of its expiry, 4401 "credential
// expired", and not before it.
func TestRevokeClosesSocketsWithin1s(t *testing.T) {
	h := startACPHost(t, acpHostConfig{Args: []string{"--pty-command", "sh"}})
	s := h.Server

	t.Run("revoked", func(t *testing.T) {
		cred := tokenCreate(t, s, "carol")
		watch := openAll(t, h, cred.Secret)
		// A browser signed in with it: its page credential goes with it.
		br := newBrowser(t)
		if status, set, _ := br.get(t, s.URL+"/?token="+cred.Secret); status != 200 || len(set) != 1 {
			t.Fatalf("page sign-in with carol's credential: %d, Set-Cookie %q; want 200 and one cookie", status, set)
		}
		page, err := s.DialRaw(ctxT(t, 10*time.Second), "/api/ws", wsclient.Options{Header: http.Header{"Cookie": {br.cookieHeader(s)}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { page.Close() })
		if code := closeCodeOf(t, page); code != 0 {
			t.Fatalf("/api/ws with the page cookie of carol's sign-in: closed %d, want admitted", code)
		}
		watch = append(watch, watchWS("/api/ws with the page cookie", page))
		// Another credential's sockets stay open.
		other := tokenCreate(t, s, "dave")
		keep := as(s, other.Secret).Dial(t)
		revoked := tokenRevoke(t, s, "carol")
		for _, c := range waitClosed(t, watch) {
			took := c.at.Sub(revoked)
			t.Logf("%s: closed %d %q %v after the revoke returned", c.what, c.code, c.reason, took)
			if c.err != nil || c.code != wire.CloseUnauthorized || c.reason != "credential revoked" || took > revokeBound {
				t.Errorf("%s after tether token revoke: closed %d %q (%v) %v after it returned; want 4401 %q within %v", c.what, c.code, c.reason, c.err, took, "credential revoked", revokeBound)
			}
		}
		refusedWith(t, s, cred.Secret, "revoked")
		if code := br.dialWithCookies(t, s); code != wire.CloseUnauthorized {
			t.Errorf("/api/ws with the page cookie of a revoked credential's sign-in: closed %d, want 4401", code)
		}
		var active wire.ActiveList
		if err := keep.Call(ctxT(t, 10*time.Second), wire.MethodActiveList, nil, &active); err != nil {
			t.Errorf("another credential's socket after carol's revocation: %v, want it open", err)
		}
	})

	t.Run("expired", func(t *testing.T) {
		// 3 s: time for the three sockets to open on a loaded machine.
		const ttl = 3 * time.Second
		asked := time.Now()
		cred := tokenCreate(t, s, "erin", "--ttl", "3s")
		made := time.Now()
		if exp := time.Unix(cred.Credential.Expires, 0); exp.Before(asked.Add(ttl).Truncate(time.Second)) || exp.After(made.Add(ttl)) {
			t.Errorf("--ttl 3s: expires_at %v, want between %v and %v", exp, asked.Add(ttl), made.Add(ttl))
		}
		watch := openAll(t, h, cred.Secret)
		for _, c := range waitClosed(t, watch) {
			// The credential expires between asked+ttl and made+ttl.
			early, late := c.at.Sub(asked.Add(ttl)), c.at.Sub(made.Add(ttl))
			t.Logf("%s: closed %d %q %v after the expiry (at the latest)", c.what, c.code, c.reason, late)
			if c.err != nil || c.code != wire.CloseUnauthorized || c.reason != "credential expired" || early < 0 || late > revokeBound {
				t.Errorf("%s of a --ttl 3s credential: closed %d %q (%v) %v after the expiry; want 4401 %q after the expiry and within %v of it", c.what, c.code, c.reason, c.err, late, "credential expired", revokeBound)
			}
		}
		refusedWith(t, s, cred.Secret, "expired")
	})
}

// TestScopesPermissionAndCancelBy: an ACP agent's permission request on
// session A is answered only by a credential that may write A — a view
// share or a session:B credential, on a socket bound to nothing or to A
// as a viewer, gets 4030 and the request stays open and never reaches
// the agent — and the answer and an interrupt are journaled with the
// answering credential's name (permission.resolved and message.complete
// by alice), replayed by session.events.since.
func TestScopesPermissionAndCancelBy(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	s := h.Server
	admin := s.Dial(t)
	var a, b wire.Snapshot
	call(t, admin, wire.MethodCreate, wire.CreateParams{Title: "perm-a"}, &a)
	call(t, admin, wire.MethodCreate, wire.CreateParams{Title: "perm-b"}, &b)
	alice := tokenCreate(t, s, "alice", "--scope", "session:"+a.SessionKey)
	view := shareCLI(t, s, "session", a.SessionKey, "--view")
	bob := tokenCreate(t, s, "bob", "--scope", "session:"+b.SessionKey)

	call(t, admin, wire.MethodSubmit, wire.SubmitParams{SessionID: a.SessionID, Text: "permission"}, nil)
	pr, _ := waitPermissionEvent(t, admin, wire.EventPermissionRequest)
	answer := func(sid string) map[string]any {
		return map[string]any{"session_id": sid, "request_id": pr.RequestID, "option_id": "allow"}
	}
	for _, cr := range []struct {
		name   string
		secret string
	}{{"a view share", view.Secret}, {"session:B", bob.Secret}} {
		c := as(s, cr.secret).Dial(t)
		wantForbidden(t, c, cr.name+" bound to nothing", wire.MethodPermissionRespond, answer(a.SessionID))
	}
	v := as(s, view.Secret).Dial(t)
	var vs wire.Snapshot
	call(t, v, wire.MethodResume, wire.ResumeParams{SessionID: a.SessionKey}, &vs)
	wantForbidden(t, v, "a view share viewing A", wire.MethodPermissionRespond, answer(vs.SessionID))

	al := as(s, alice.Secret).Dial(t)
	var asnap wire.Snapshot
	call(t, al, wire.MethodResume, wire.ResumeParams{SessionID: a.SessionKey}, &asnap)
	if len(asnap.PendingPermissions) != 1 {
		t.Fatalf("after the refused answers: %d pending permissions, want the one still open", len(asnap.PendingPermissions))
	}
	call(t, al, wire.MethodPermissionRespond, answer(asnap.SessionID), nil)
	res, _ := waitPermissionEvent(t, admin, wire.EventPermissionResolved)
	if opt := ""; res.OptionID == nil || *res.OptionID != "allow" || res.By != "alice" {
		if res.OptionID != nil {
			opt = *res.OptionID
		}
		t.Errorf("permission.resolved: option %q by %q, want allow by alice", opt, res.By)
	}
	if _, status := waitComplete(t, admin, a.SessionID); status != "complete" {
		t.Errorf("the permission turn: %s, want complete", status)
	}

	call(t, admin, wire.MethodSubmit, wire.SubmitParams{SessionID: a.SessionID, Text: "slow 20"}, nil)
	wantForbidden(t, v, "a view share viewing A", wire.MethodInterrupt, wire.SessionParams{SessionID: vs.SessionID})
	call(t, al, wire.MethodInterrupt, wire.SessionParams{SessionID: asnap.SessionID}, nil)
	if _, status := waitComplete(t, admin, a.SessionID); status != "interrupted" {
		t.Errorf("the slow turn after alice's interrupt: %s, want interrupted", status)
	}

	j := journal(t, admin, a.SessionID)
	if got := payloadsOf(t, j, wire.EventPermissionResolved); len(got) != 1 || got[0]["by"] != "alice" {
		t.Errorf("permission.resolved in the journal: %v, want one by alice", got)
	}
	var stopped []string
	for _, p := range payloadsOf(t, j, wire.EventMessageComplete) {
		stopped = append(stopped, fmt.Sprintf("%v:%v", p["status"], p["by"]))
	}
	if want := []string{"complete:<nil>", "interrupted:alice"}; fmt.Sprint(stopped) != fmt.Sprint(want) {
		t.Errorf("message.complete status:by in the journal: %q, want %q", stopped, want)
	}
	checkOneAnswer(t, h.log(t), "allow")
}

// acpPromptNote is the part of a session/update a prompt's
// user_message_chunk is checked by.
type acpPromptNote struct {
	Meta   map[string]any `json:"_meta"`
	Update struct {
		SessionUpdate string `json:"sessionUpdate"`
		Content       struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"update"`
}

// promptBy finds in notes the user_message_chunk of the prompt text and
// returns its _meta["tether/by"].
func promptBy(notes []acpRawMsg, text string) (by string, found bool) {
	for _, n := range notes {
		var p acpPromptNote
		if n.Method != "session/update" || json.Unmarshal(n.Params, &p) != nil {
			continue
		}
		if p.Update.SessionUpdate == "user_message_chunk" && p.Update.Content.Text == text {
			by, _ := p.Meta["tether/by"].(string)
			return by, true
		}
	}
	return "", false
}

// promptByLive reads notifications until the user_message_chunk of the
// prompt text and returns its _meta["tether/by"].
func (c acpSock) promptByLive(tb testing.TB, text string) string {
	tb.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(errsStep))
	for {
		f, err := badReadFrame(c.r)
		if err != nil {
			tb.Fatalf("/acp: waiting for the user_message_chunk %q: %v", text, err)
		}
		if f.Header.OpCode == gobws.OpClose {
			tb.Fatalf("/acp: closed (%x) before the user_message_chunk %q", f.Payload, text)
		}
		var m acpRawMsg
		if f.Header.OpCode != gobws.OpText || json.Unmarshal(f.Payload, &m) != nil {
			continue
		}
		if by, ok := promptBy([]acpRawMsg{m}, text); ok {
			return by
		}
	}
}
