package e2e_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
	"github.com/tether-agent/tether/wire"
)

// dialWhenKnown dials /api/ws on s with secret until s admits it: a
// credential made on another host of the cluster reaches s through the
// cluster's bucket a moment later. It fails the test after 10 s.
func dialWhenKnown(tb testing.TB, s *e2e.Server, secret string) *wsclient.Client {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := as(s, secret).DialRaw(ctxT(tb, 10*time.Second), "/api/ws", wsclient.Options{Token: secret})
		if err != nil {
			tb.Fatal(err)
		}
		code := closeCodeOf(tb, c)
		if code == 0 {
			tb.Cleanup(func() { c.Close() })
			return c
		}
		c.Close()
		if code != wire.CloseUnauthorized || time.Now().After(deadline) {
			tb.Fatalf("a credential made on another host, on %s: closed %d, want admitted", s.Addr, code)
		}
	}
}

// TestRevokeAcrossCluster: on a two-host embedded cluster, a credential
// made on h1 is honoured on h2 with its scope — a session view of a
// session live on h1, resumed on h2 (relayed to h1), reads it, and its
// prompt and close are 4030 with the journal unchanged; a credential for
// another session is 4030 there; h2's cluster-wide session.active_list
// shows each only what it reaches — and revoking it on h1 closes its
// sockets on h2 (a plain one, one relayed to h1 for the session, a PTY
// of h2) within 1 s, 4401 "credential revoked"; h2 then refuses it.
// A --ttl credential made on h1 closes its socket on h2 within 1 s of
// its expiry, "credential expired".
func TestRevokeAcrossCluster(t *testing.T) {
	hosts := startClusterOf(t, 2, clusterSecret(t), nil, "--pty-command", "sh")
	h1, h2 := hosts[0], hosts[1]
	admin := h1.Dial(t)
	var a, b wire.Snapshot
	call(t, admin, wire.MethodCreate, wire.CreateParams{Title: "on-h1"}, &a)
	call(t, admin, wire.MethodCreate, wire.CreateParams{Title: "other"}, &b)
	submitAndWait(t, admin, a.SessionID, "first")
	before := journal(t, admin, a.SessionID)

	t.Run("scope on h2", func(t *testing.T) {
		view := shareCLI(t, h1.Server, "session", a.SessionKey, "--view")
		v := dialWhenKnown(t, h2.Server, view.Secret)
		var snap wire.Snapshot
		call(t, v, wire.MethodResume, wire.ResumeParams{SessionID: a.SessionKey}, &snap)
		if snap.SessionID != a.SessionID {
			t.Fatalf("the view's resume on h2: session %s, want h1's live %s", snap.SessionID, a.SessionID)
		}
		if got := journal(t, v, snap.SessionID); got.LatestSeq != before.LatestSeq {
			t.Errorf("the view's events.since on h2: latest %d, want %d", got.LatestSeq, before.LatestSeq)
		}
		wantForbidden(t, v, "session view on h2", wire.MethodSubmit, wire.SubmitParams{SessionID: snap.SessionID, Text: "from the view"})
		wantForbidden(t, v, "session view on h2", wire.MethodInterrupt, wire.SessionParams{SessionID: snap.SessionID})
		wantForbidden(t, v, "session view on h2", wire.MethodClose, wire.SessionParams{SessionID: snap.SessionID})
		if after := journal(t, admin, a.SessionID); after.LatestSeq != before.LatestSeq {
			t.Errorf("the journal on h1 after the view's refused calls on h2: latest %d, was %d", after.LatestSeq, before.LatestSeq)
		}

		bob := tokenCreate(t, h1.Server, "bob", "--scope", "session:"+b.SessionKey)
		c := dialWhenKnown(t, h2.Server, bob.Secret)
		wantForbidden(t, c, "session:B on h2", wire.MethodResume, wire.ResumeParams{SessionID: a.SessionKey})

		// A new credential's session made on h2 is granted to it
		// cluster-wide: it resumes and prompts it from h1 (relayed to
		// h2, which applies the grant).
		nina := tokenCreate(t, h1.Server, "nina")
		n2 := dialWhenKnown(t, h2.Server, nina.Secret)
		var own wire.Snapshot
		call(t, n2, wire.MethodCreate, wire.CreateParams{Title: "nina's"}, &own)
		waitGranted(t, h1.Server, "nina", "session:"+own.SessionKey)
		n1 := as(h1.Server, nina.Secret).Dial(t)
		var there wire.Snapshot
		call(t, n1, wire.MethodResume, wire.ResumeParams{SessionID: own.SessionKey}, &there)
		if there.SessionID != own.SessionID {
			t.Errorf("nina's resume on h1 of her session live on h2: %s, want %s", there.SessionID, own.SessionID)
		}
		submitAndWait(t, n1, there.SessionID, "from h1")
		wantForbidden(t, n1, "new on h1", wire.MethodResume, wire.ResumeParams{SessionID: a.SessionKey})

		// The cluster-wide active list, at h2, shows each only its own.
		for _, w := range []struct {
			who  string
			c    *wsclient.Client
			want string
		}{{"the view of A", v, a.SessionKey}, {"session:B", c, b.SessionKey}, {"nina", n2, own.SessionKey}} {
			var keys []string
			for _, e := range activeList(t, w.c) {
				keys = append(keys, e.SessionKey)
			}
			if len(keys) != 1 || keys[0] != w.want {
				t.Errorf("session.active_list on h2 for %s: %q, want only %s", w.who, keys, w.want)
			}
		}
		if n := len(activeList(t, h2.Dial(t))); n != 3 {
			t.Errorf("session.active_list on h2 for admin: %d sessions, want 3 (h1's two and nina's)", n)
		}
	})

	t.Run("pty scope", func(t *testing.T) {
		// A PTY of h1, its writer the admin on h1.
		tok := attachToken(t)
		w := ptyDial(t, h1.Server, "attach="+tok)
		replayOf(t, w)
		view := shareCLI(t, h1.Server, "pty", tok, "--view")
		nick := tokenCreate(t, h1.Server, "nick")
		dialWhenKnown(t, h2.Server, nick.Secret).Close()
		refused := func(what string, s *e2e.Server, secret, query string) {
			t.Helper()
			c := ptyDial(t, as(s, secret), query)
			if code, reason, err := c.CloseCode(ctxT(t, 10*time.Second)); err != nil || code != wire.CloseForbidden {
				t.Errorf("%s: closed %d %q (%v), want 4403", what, code, reason, err)
			}
		}
		// A new credential may make PTYs, never join one that exists:
		// on the PTY's host and from another.
		refused("a new credential attaching h1's PTY on h1", h1.Server, nick.Secret, "attach="+tok)
		refused("a new credential attaching h1's PTY from h2", h2.Server, nick.Secret, "attach="+tok)
		refused("a pty view share attaching as the writer from h2", h2.Server, view.Secret, "attach="+tok)
		v := ptyDial(t, as(h2.Server, view.Secret), "view=1&attach="+tok)
		replayOf(t, v)
		if err := w.Write([]byte("echo W-MARK$((2+3))\r")); err != nil {
			t.Fatal(err)
		}
		if err := v.WaitOutput(ctxT(t, 10*time.Second), func(o []byte) bool { return bytes.Contains(o, []byte("W-MARK5\r\n")) }); err != nil {
			t.Fatalf("the pty view share on h2 does not see h1's PTY: %v", err)
		}
		select {
		case <-w.Closed():
			code, reason, _ := w.CloseCode(ctxT(t, time.Second))
			t.Errorf("the admin's writer on h1 closed %d %q: another credential took the PTY", code, reason)
		default:
		}

		// What a new credential makes, it reaches again (from another
		// socket, either host).
		mine := attachToken(t)
		m := ptyDial(t, as(h1.Server, nick.Secret), "attach="+mine)
		replayOf(t, m)
		m.Close()
		for _, s := range []*e2e.Server{h1.Server, h2.Server} {
			// The grant is stored after the attach, and reaches h2
			// through the cluster's bucket.
			waitGranted(t, s, "nick", "pty:"+mine)
			again := ptyDial(t, as(s, nick.Secret), "attach="+mine)
			if _, err := again.Replay(ctxT(t, 10*time.Second)); err != nil {
				code, reason, _ := again.CloseCode(ctxT(t, time.Second))
				t.Errorf("the new credential reattaching the PTY it made, on %s: %v (closed %d %q)", s.Addr, err, code, reason)
			}
			again.Close()
		}
	})

	t.Run("revoke", func(t *testing.T) {
		cred := tokenCreate(t, h1.Server, "frank", "--scope", "session:"+a.SessionKey, "--scope", "new")
		plain := dialWhenKnown(t, h2.Server, cred.Secret)
		relayed := as(h2.Server, cred.Secret).Dial(t)
		var snap wire.Snapshot
		call(t, relayed, wire.MethodResume, wire.ResumeParams{SessionID: a.SessionKey}, &snap)
		p := ptyDial(t, as(h2.Server, cred.Secret), "attach="+attachToken(t))
		replayOf(t, p)
		watch := []<-chan sockClose{watchWS("/api/ws on h2", plain), watchWS("/api/ws on h2 relayed to h1", relayed), watchPTY("/api/pty on h2", p)}

		revoked := tokenRevoke(t, h1.Server, "frank")
		for _, c := range waitClosed(t, watch) {
			took := c.at.Sub(revoked)
			t.Logf("%s: closed %d %q %v after the revoke on h1 returned", c.what, c.code, c.reason, took)
			if c.err != nil || c.code != wire.CloseUnauthorized || c.reason != "credential revoked" || took > revokeBound {
				t.Errorf("%s after tether token revoke on h1: closed %d %q (%v) %v after it returned; want 4401 %q within %v", c.what, c.code, c.reason, c.err, took, "credential revoked", revokeBound)
			}
		}
		refusedWith(t, h2.Server, cred.Secret, "revoked")
		refusedWith(t, h1.Server, cred.Secret, "revoked")
		if live := liveForKey(activeList(t, admin), a.SessionKey); len(live) != 1 {
			t.Errorf("session A after the revoked viewer's sockets closed: %d live, want 1 (a revocation closes sockets, not sessions)", len(live))
		}
	})

	t.Run("expired", func(t *testing.T) {
		const ttl = 3 * time.Second
		asked := time.Now()
		cred := tokenCreate(t, h1.Server, "gina", "--ttl", "3s")
		made := time.Now()
		c := dialWhenKnown(t, h2.Server, cred.Secret)
		got := waitClosed(t, []<-chan sockClose{watchWS("/api/ws on h2", c)})[0]
		early, late := got.at.Sub(asked.Add(ttl)), got.at.Sub(made.Add(ttl))
		t.Logf("%s: closed %d %q %v after the expiry (at the latest)", got.what, got.code, got.reason, late)
		if got.code != wire.CloseUnauthorized || got.reason != "credential expired" || early < 0 || late > revokeBound {
			t.Errorf("%s with a --ttl 3s credential made on h1: closed %d %q %v after the expiry; want 4401 %q after it and within %v", got.what, got.code, got.reason, late, "credential expired", revokeBound)
		}
		refusedWith(t, h2.Server, cred.Secret, "expired")
	})
}

// waitGranted polls `tether token list --json` on s until the
// credential called name has scope (a grant is stored after the attach
// or create that earns it, and reaches other hosts through the
// cluster's bucket). It fails the test after 10 s.
func waitGranted(tb testing.TB, s *e2e.Server, name, scope string) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, stderr, code := e2e.Tether(tb, "token", "list", "--json", "--state-dir", s.StateDir)
		if code != 0 {
			tb.Fatalf("tether token list: exit %d: %s", code, stderr)
		}
		var creds []wire.CredentialInfo
		if err := json.Unmarshal([]byte(out), &creds); err != nil {
			tb.Fatalf("tether token list --json: %v\n%s", err, out)
		}
		for _, c := range creds {
			if c.Name == name && slices.Contains(c.Scopes, scope) {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s on %s: no scope %s after 10 s: %s", name, s.Addr, scope, out)
		}
		time.Sleep(50 * time.Millisecond) // polling another process's state
	}
}

// acpClusterArgs are the flags of host i of a cluster running the ACP
// test agent, each host with its agent's directory and log under base.
func acpClusterArgs(tb testing.TB, base string) func(i int) []string {
	kit, node := acpKit(tb)
	return func(i int) []string {
		dir := filepath.Join(base, fmt.Sprintf("agent%d", i+1))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			tb.Fatal(err)
		}
		words := []string{node, filepath.Join(kit, "agent.mjs"), "--dir", dir, "--log", filepath.Join(dir, "agent.log")}
		for j, w := range words {
			words[j] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
		}
		return []string{"--agent", "acp", "--agent-command", strings.Join(words, " "), "--agent-cwd", dir}
	}
}

// TestScopesACPAcrossCluster: /acp on h2 for a session live on h1 (the
// connection relayed to h1's /acp with the identity h2 verified): a
// view share made on h1 loads it, sees who prompted, and its
// session/prompt closes its socket 4403 and never reaches h1's agent; a
// session:B credential's load of it is refused 4403.
func TestScopesACPAcrossCluster(t *testing.T) {
	base := t.TempDir()
	hosts := startClusterOf(t, 2, clusterSecret(t), acpClusterArgs(t, base))
	h1, h2 := acpHost{Server: hosts[0].Server, AgentDir: filepath.Join(base, "agent1"), AgentLog: filepath.Join(base, "agent1", "agent.log")},
		acpHost{Server: hosts[1].Server, AgentDir: filepath.Join(base, "agent2"), AgentLog: filepath.Join(base, "agent2", "agent.log")}

	ad := dialACPAs(t, h1, h1.Token)
	nw, _ := ad.call(2, "session/new", map[string]any{"cwd": h1.AgentDir, "mcpServers": []any{}})
	var sess struct {
		SessionID string `json:"sessionId"`
	}
	if nw.Error != nil || json.Unmarshal(nw.Result, &sess) != nil || sess.SessionID == "" {
		t.Fatalf("/acp session/new on h1: %+v %s", nw.Error, nw.Result)
	}
	promptParams := func(text string) map[string]any {
		return map[string]any{"sessionId": sess.SessionID, "prompt": []any{map[string]any{"type": "text", "text": text}}}
	}
	if r, _ := ad.call(3, "session/prompt", promptParams("admin one")); r.Error != nil {
		t.Fatalf("/acp prompt on h1: %+v", r.Error)
	}
	loadParams := map[string]any{"sessionId": sess.SessionID, "cwd": h2.AgentDir, "mcpServers": []any{}}

	view := shareCLI(t, h1.Server, "session", sess.SessionID, "--view")
	dialWhenKnown(t, h2.Server, view.Secret).Close()
	v := dialACPAs(t, h2, view.Secret)
	r, notes := v.call(2, "session/load", loadParams)
	if r.Error != nil {
		t.Fatalf("/acp session/load on h2 of h1's session with a view share: %+v, want it loaded", r.Error)
	}
	if by, ok := promptBy(notes, "admin one"); !ok || by != "admin" {
		t.Errorf("/acp replay on h2: the prompt's user_message_chunk by %q (found %v), want admin", by, ok)
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": promptParams("VIEW-PROMPT")})
	v.send(string(b))
	if code, reason, err := v.readClose(10 * time.Second); err != nil || code != wire.CloseForbidden || !strings.Contains(reason, forbiddenReason) {
		t.Errorf("/acp session/prompt on h2 with a view share: closed %d %q (%v), want 4403 %q", code, reason, err, forbiddenReason)
	}

	bob := tokenCreate(t, h1.Server, "bob", "--scope", "session:20990101_000000_abcdef")
	dialWhenKnown(t, h2.Server, bob.Secret).Close()
	bc := dialACPAs(t, h2, bob.Secret)
	lb, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "session/load", "params": loadParams})
	bc.send(string(lb))
	if code, reason, err := bc.readClose(10 * time.Second); err != nil || code != wire.CloseForbidden {
		t.Errorf("/acp session/load on h2 of h1's session with another session's credential: closed %d %q (%v), want 4403", code, reason, err)
	}

	// One more prompt through h1's agent: the view's would be in its
	// log by now.
	if r, _ := ad.call(4, "session/prompt", promptParams("admin two")); r.Error != nil {
		t.Fatalf("/acp prompt on h1 after the view's: %+v", r.Error)
	}
	if loads := received(h2.log(t), "session/load"); len(loads) != 0 {
		t.Errorf("h2's agent loaded %d sessions: the loads were not relayed to h1, where the session is live", len(loads))
	}
	for _, h := range []acpHost{h1, h2} {
		for _, e := range received(h.log(t), "session/prompt") {
			if strings.Contains(string(e.Params), "VIEW-PROMPT") {
				t.Errorf("the view share's prompt reached the agent of %s: %s", h.Addr, e.Params)
			}
		}
	}
}
