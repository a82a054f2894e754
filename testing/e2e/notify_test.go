package e2e_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

// notifySecret is the webhooks' secret in these tests.
const notifySecret = "0123456789abcdef0123456789abcdef"

// hookEvent is a webhook body (docs/PROTOCOL.md §19).
type hookEvent struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	Session   string `json:"session"`
	Title     string `json:"title"`
	RunID     string `json:"run_id"`
	By        string `json:"by"`
	Time      string `json:"time"`
	Link      string `json:"link"`
	RequestID string `json:"request_id"`
	Reason    string `json:"reason"`
}

// hookCall is one POST the receiver got.
type hookCall struct {
	ev     hookEvent
	body   string
	status int    // what the receiver answered
	pid    string // X-Hook-Pid: the hook plugin process that sent it
}

// receiver is a webhook receiver: it checks each POST's signature and
// content type (a bad one fails the test), answers the scripted statuses
// first and 204 after, and records every call.
type receiver struct {
	t     *testing.T
	srv   *http.Server
	url   string
	calls chan hookCall

	mu       sync.Mutex // guards the fields below
	script   []int
	unsigned bool // a notifier plugin's posts: no signature to check
}

// startReceiver serves a receiver on ln (a new 127.0.0.1:0 listener
// when nil), answering statuses first.
func startReceiver(t *testing.T, ln net.Listener, statuses ...int) *receiver {
	t.Helper()
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	r := &receiver{t: t, url: "http://" + ln.Addr().String() + "/hook", calls: make(chan hookCall, 100), script: statuses}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = r.srv.Close()
		<-done
	})
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		r.t.Errorf("receiver: reading the body: %v", err)
		return
	}
	m := hmac.New(sha256.New, []byte(notifySecret))
	m.Write(body)
	r.mu.Lock()
	unsigned := r.unsigned
	r.mu.Unlock()
	if want := "sha256=" + hex.EncodeToString(m.Sum(nil)); !unsigned && !hmac.Equal([]byte(req.Header.Get("X-Tether-Signature")), []byte(want)) {
		r.t.Errorf("receiver: X-Tether-Signature %q, want %q", req.Header.Get("X-Tether-Signature"), want)
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/json" || req.Method != http.MethodPost {
		r.t.Errorf("receiver: %s with Content-Type %q, want a POST of application/json", req.Method, ct)
	}
	var ev hookEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		r.t.Errorf("receiver: body %s: %v", body, err)
	}
	r.mu.Lock()
	status := http.StatusNoContent
	if len(r.script) > 0 {
		status, r.script = r.script[0], r.script[1:]
	}
	r.mu.Unlock()
	w.WriteHeader(status)
	r.calls <- hookCall{ev: ev, body: string(body), status: status, pid: req.Header.Get("X-Hook-Pid")}
}

// next is the receiver's next call.
func (r *receiver) next(t *testing.T, what string) hookCall {
	t.Helper()
	select {
	case c := <-r.calls:
		return c
	case <-time.After(30 * time.Second):
		t.Fatalf("receiver: no call within 30s, waiting for %s", what)
		return hookCall{}
	}
}

// nextDelivered skips failed answers and returns the next call answered
// with 2xx, and the calls before it.
func (r *receiver) nextDelivered(t *testing.T, what string) (hookCall, []hookCall) {
	t.Helper()
	var before []hookCall
	for {
		c := r.next(t, what)
		if c.status/100 == 2 {
			return c, before
		}
		before = append(before, c)
	}
}

// notifySecretFile writes the secret to a 0600 file.
func notifySecretFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "notify-secret")
	if err := os.WriteFile(p, []byte(notifySecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// notifyArgs are tether serve's flags for a webhook at url.
func notifyArgs(t *testing.T, url string) []string {
	return []string{"--notify-webhook", url, "--notify-secret-file", notifySecretFile(t), "--public-url", "https://tether.example/t"}
}

// newSessionRun creates a session on c and submits text; it returns the
// session's id and key and the run's id.
func newSessionRun(t *testing.T, c *wsclient.Client, text string) (sid, key, runID string) {
	t.Helper()
	var snap struct {
		SessionID  string `json:"session_id"`
		SessionKey string `json:"session_key"`
	}
	call(t, c, "session.create", map[string]any{}, &snap)
	var res struct {
		RunID string `json:"run_id"`
	}
	call(t, c, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": text}, &res)
	return snap.SessionID, snap.SessionKey, res.RunID
}

// checkHook checks a delivered event's fields.
func checkHook(t *testing.T, got hookEvent, typ, key, runID string) {
	t.Helper()
	if got.ID == "" || got.Type != typ || got.Session != key || got.RunID != runID || got.Time == "" {
		t.Errorf("webhook: got %+v, want %s of run %s in session %s, with an id and a time", got, typ, runID, key)
	}
	if want := "https://tether.example/t/?session=" + key; got.Link != want {
		t.Errorf("webhook link: got %q, want %q (no credential in it)", got.Link, want)
	}
}

// TestNotifyWebhook: a completed and a failed run reach the webhook,
// signed; a delivery answered 500 twice is retried with the same body
// and counted once; after a restart nothing delivered is sent again.
func TestNotifyWebhook(t *testing.T) {
	r := startReceiver(t, nil, 500, 500)
	agentArgs := []string{"--agent", "exec", "--agent-command", `sh -c 'read l; test "$l" != fail && echo ok'`, "--admin-listen", "127.0.0.1:0"}
	args := append(agentArgs, notifyArgs(t, r.url)...)
	s := e2e.Start(t, e2e.Config{Args: args})
	c := s.Dial(t)

	sid, key, runID := newSessionRun(t, c, "hello")
	if _, status := waitComplete(t, c, sid); status != "complete" {
		t.Fatalf("run: %s, want complete", status)
	}
	got, failed := r.nextDelivered(t, "run.completed")
	checkHook(t, got.ev, "run.completed", key, runID)
	if got.ev.Title != "hello" || got.ev.By != "admin" {
		t.Errorf("run.completed: title %q by %q, want hello by admin", got.ev.Title, got.ev.By)
	}
	if len(failed) != 2 {
		t.Fatalf("calls answered 500 before the delivery: %d, want 2", len(failed))
	}
	for _, f := range failed {
		if f.body != got.body {
			t.Errorf("a retry's body %s differs from the delivered %s: the same bytes, the same id, are sent each time", f.body, got.body)
		}
	}

	sid2, key2, runID2 := newSessionRun(t, c, "fail")
	if _, status := waitComplete(t, c, sid2); status != "failed" {
		t.Fatalf("run: %s, want failed", status)
	}
	got2 := r.next(t, "run.failed")
	checkHook(t, got2.ev, "run.failed", key2, runID2)
	if got2.status != http.StatusNoContent || got2.ev.Reason == "" {
		t.Errorf("run.failed: answered %d, reason %q; want 204 and a reason", got2.status, got2.ev.Reason)
	}
	waitFor(t, func() bool { return s.Metric(t, "tether_notifications_pending") == 0 }, "the outbox to empty")
	if n := s.Metric(t, "tether_notifications_sent_total"); n != 2 {
		t.Errorf("tether_notifications_sent_total: %v, want 2", n)
	}
	if n := s.Metric(t, "tether_notification_retries_total"); n != 2 {
		t.Errorf("tether_notification_retries_total: %v, want 2", n)
	}

	// A restart sends what the outbox kept first: the next host's first
	// call is its own new event, nothing delivered before.
	c.Close()
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("host exit: %d, %v", code, err)
	}
	s2 := e2e.Start(t, e2e.Config{StateDir: s.StateDir, Args: args})
	c2 := s2.Dial(t)
	sid3, key3, runID3 := newSessionRun(t, c2, "again")
	waitComplete(t, c2, sid3)
	got3 := r.next(t, "the new host's run.completed")
	checkHook(t, got3.ev, "run.completed", key3, runID3)
}

// TestNotifyKeptAcrossRestart: with the receiver down, a notification
// is stored; the host stops; the next host, with the receiver up,
// delivers it once, with the same id.
func TestNotifyKeptAcrossRestart(t *testing.T) {
	// The receiver's address, free for now: nothing listens there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	url := "http://" + addr + "/hook"
	args := append([]string{"--agent", "exec", "--agent-command", "cat"}, notifyArgs(t, url)...)
	s := e2e.Start(t, e2e.Config{Args: args})
	c := s.Dial(t)
	sid, key, runID := newSessionRun(t, c, "while down")
	waitComplete(t, c, sid)
	// The first attempt failed: the host logs it with the event's id.
	var id string
	waitFor(t, func() bool {
		id = loggedNotifyID(s.Stderr.String())
		return id != ""
	}, "a failed delivery to be logged")
	c.Close()
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("host exit: %d, %v", code, err)
	}

	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the receiver's port was taken meanwhile: %v", err)
	}
	r := startReceiver(t, ln)
	e2e.Start(t, e2e.Config{StateDir: s.StateDir, Args: args})
	got := r.next(t, "the kept run.completed")
	checkHook(t, got.ev, "run.completed", key, runID)
	if got.ev.ID != id {
		t.Errorf("after the restart: id %s, want the first host's %s", got.ev.ID, id)
	}
}

// loggedNotifyID is the id of the first "notification not delivered"
// line of a host's JSON log, or "".
func loggedNotifyID(log string) string {
	for line := range strings.SplitSeq(log, "\n") {
		var l struct {
			Message string `json:"message"`
			ID      string `json:"id"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && strings.HasPrefix(l.Message, "notification not delivered") {
			return l.ID
		}
	}
	return ""
}

// TestNotifyPermission: an ACP agent's permission request reaches the
// webhook with its request id, before anyone answers it.
func TestNotifyPermission(t *testing.T) {
	r := startReceiver(t, nil)
	h := startACPHost(t, acpHostConfig{Args: notifyArgs(t, r.url)})
	nv := h.Dial(t)
	sid, key, runID := newSessionRun(t, nv, "permission")
	pr, _ := waitPermissionEvent(t, nv, "permission.request")
	got := r.next(t, "permission.requested")
	checkHook(t, got.ev, "permission.requested", key, runID)
	var reqID string
	if err := json.Unmarshal(pr.RequestID, &reqID); err != nil || got.ev.RequestID != reqID {
		t.Errorf("permission.requested: request_id %q, want %s", got.ev.RequestID, pr.RequestID)
	}
	call(t, nv, "permission.respond", map[string]any{"session_id": sid, "request_id": reqID, "option_id": "allow"}, nil)
	waitComplete(t, nv, sid)
	checkHook(t, r.next(t, "run.completed").ev, "run.completed", key, runID)
}

// TestNotifyTestCommand: tether notify test sends a test notification
// through every webhook and prints each answer; one that failed makes it
// exit 1; it is not retried.
func TestNotifyTestCommand(t *testing.T) {
	a := startReceiver(t, nil, 500)
	b := startReceiver(t, nil)
	args := append(notifyArgs(t, a.url), "--notify-webhook", b.url)
	s := e2e.Start(t, e2e.Config{Args: args})

	stdout, stderr, exit := e2e.Tether(t, "notify", "test", "--state-dir", s.StateDir)
	if exit != 1 || strings.Count(stdout, ": failed: ") != 1 || strings.Count(stdout, ": ok: 204 No Content") != 1 {
		t.Errorf("notify test with a failing webhook: exit %d, stdout %q, stderr %q; want 1, one failed and one ok line", exit, stdout, stderr)
	}
	for _, r := range []*receiver{a, b} {
		if c := r.next(t, "the test notification"); c.ev.Type != "test" || c.ev.ID == "" {
			t.Errorf("test notification: got %+v, want type test with an id", c.ev)
		}
	}
	stdout, stderr, exit = e2e.Tether(t, "notify", "test", "--state-dir", s.StateDir)
	if exit != 0 || strings.Count(stdout, ": ok: 204 No Content") != 2 {
		t.Errorf("notify test: exit %d, stdout %q, stderr %q; want 0, two ok lines", exit, stdout, stderr)
	}
	a.next(t, "the second test notification")
	b.next(t, "the second test notification")
	select {
	case c := <-a.calls:
		t.Errorf("a test notification was retried: %+v", c.ev)
	default:
	}
}

// hookPluginEnv makes the test binary serve a notifier plugin that posts
// each notification to $hookPluginEnv, as a webhook without signature,
// after writing its pid to $hookPluginPidEnv (hookPluginScript).
const (
	hookPluginEnv    = "E2E_HOOK_PLUGIN_URL"
	hookPluginPidEnv = "E2E_HOOK_PLUGIN_PID"
)

// hookPlugin is the notifier the test binary serves as a plugin.
type hookPlugin struct{ url string }

func (h hookPlugin) Notify(ctx context.Context, id string, body []byte) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tether-Event-Id", id)
	req.Header.Set("X-Hook-Pid", strconv.Itoa(os.Getpid()))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return resp.Status, errors.New("rejected: " + resp.Status)
	}
	return resp.Status, nil
}

func serveHookPlugin() {
	_ = os.WriteFile(os.Getenv(hookPluginPidEnv), []byte(strconv.Itoa(os.Getpid())), 0o600)
	contract.ServeNotifier(hookPlugin{url: os.Getenv(hookPluginEnv)})
}

// hookPluginScript is a notifier plugin posting to url: the test binary
// re-executed. While the file gate exists it waits before starting (a
// plugin down for as long as the test wants); pidFile gets its pid.
func hookPluginScript(t *testing.T, url, gate, pidFile string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "hook.sh")
	body := fmt.Sprintf("#!/bin/sh\nwhile [ -e %q ]; do sleep 0.05; done\n%s=%q %s=%q exec %q \"$@\"\n", gate, hookPluginEnv, url, hookPluginPidEnv, pidFile, self)
	if err := os.WriteFile(p, []byte(body), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestNotifyPlugin: a notifier plugin (--plugin notify:NAME=PATH), built
// in the test, gets every notification; killed, it is restarted, and a
// notification raised while it was down is delivered once it is back.
func TestNotifyPlugin(t *testing.T) {
	r := startReceiver(t, nil)
	r.mu.Lock()
	r.unsigned = true
	r.mu.Unlock()
	dir := t.TempDir()
	gate, pidFile := filepath.Join(dir, "gate"), filepath.Join(dir, "pid")
	s := e2e.Start(t, e2e.Config{Args: []string{"--agent", "exec", "--agent-command", "cat",
		"--plugin", "notify:hook=" + hookPluginScript(t, r.url, gate, pidFile), "--public-url", "https://tether.example/t"}})
	c := s.Dial(t)
	sid, key, runID := newSessionRun(t, c, "one")
	waitComplete(t, c, sid)
	checkHook(t, r.next(t, "run.completed through the plugin").ev, "run.completed", key, runID)
	if p := pluginsJSON(t, s.StateDir)["hook"]; p.Kind != "notify" || p.State != "running" || p.Pid == 0 {
		t.Errorf("tether plugins list: hook is %+v, want a running notify plugin", p)
	}

	// Down: killed, and held from starting again.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(pidFile)
	pid, _ := strconv.Atoi(string(b))
	if err != nil || pid <= 0 {
		t.Fatalf("plugin pid file: %q, %v", b, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitLogLine(t, s, "notify plugin ended; restarting", map[string]any{"plugin": "hook"})
	sid2, key2, runID2 := newSessionRun(t, c, "two")
	waitComplete(t, c, sid2)
	waitLogLine(t, s, "notification not delivered: retrying", map[string]any{"notifier": "plugin:hook"})
	select {
	case call := <-r.calls:
		t.Fatalf("delivered while the plugin was down: %+v", call.ev)
	default:
	}
	// Back: the pending notification arrives.
	if err := os.Remove(gate); err != nil {
		t.Fatal(err)
	}
	checkHook(t, r.next(t, "the notification pending while the plugin was down").ev, "run.completed", key2, runID2)
	before := pluginsJSON(t, s.StateDir)["hook"]
	if before.Restarts != 1 || before.State != "running" {
		t.Errorf("tether plugins list after the kill: hook is %+v, want running, 1 restart", before)
	}

	// Reloaded: a fresh process, no restart counted, and the next
	// notification goes through it.
	if out, errOut, code := e2e.Tether(t, "plugins", "reload", "hook", "--state-dir", s.StateDir); code != 0 || !strings.Contains(out, "hook") {
		t.Fatalf("tether plugins reload hook: exit %d\n%s%s", code, out, errOut)
	}
	after := pluginsJSON(t, s.StateDir)["hook"]
	if after.Pid == before.Pid || after.Pid == 0 || after.State != "running" || after.Restarts != 1 {
		t.Errorf("after tether plugins reload hook: %+v (before: pid %d), want a new running process and still 1 restart", after, before.Pid)
	}
	if err := syscall.Kill(before.Pid, 0); err == nil {
		t.Errorf("the swapped-out notifier process %d still runs", before.Pid)
	}
	sid3, key3, runID3 := newSessionRun(t, c, "three")
	waitComplete(t, c, sid3)
	call := r.next(t, "run.completed through the reloaded plugin")
	checkHook(t, call.ev, "run.completed", key3, runID3)
	if call.pid != strconv.Itoa(after.Pid) {
		t.Errorf("the notification after the reload came through pid %q, want the new process %d", call.pid, after.Pid)
	}
	// Not stopped on its own: its notifications would pile up.
	if _, errOut, code := e2e.Tether(t, "plugins", "stop", "hook", "--state-dir", s.StateDir); code != 1 || !strings.Contains(errOut, "is a notifier") {
		t.Errorf("tether plugins stop hook: exit %d %q, want 1 and why", code, errOut)
	}
	if p := pluginsJSON(t, s.StateDir)["hook"]; p.Pid != after.Pid || p.State != "running" {
		t.Errorf("after a refused stop: hook is %+v, want pid %d running", p, after.Pid)
	}
}

// TestNotifyPTYExited: a terminal whose process exits tells the webhook
// its attach token and exit status, with a link that opens it.
func TestNotifyPTYExited(t *testing.T) {
	r := startReceiver(t, nil)
	s := e2e.Start(t, e2e.Config{Args: append([]string{"--pty-command", `sh -c 'read x; exit 3'`}, notifyArgs(t, r.url)...)})
	tok := attachToken(t)
	c := ptyDial(t, s, "attach="+tok)
	replayOf(t, c)
	if err := c.Write([]byte("\r")); err != nil {
		t.Fatal(err)
	}
	if code := closeCode(t, c); code != 4410 {
		t.Fatalf("close code %d, want 4410", code)
	}
	got := r.next(t, "pty.exited")
	var ev struct {
		Type     string `json:"type"`
		PTY      string `json:"pty"`
		ExitCode *int   `json:"exit_code"`
		Link     string `json:"link"`
	}
	if err := json.Unmarshal([]byte(got.body), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Type != "pty.exited" || ev.PTY != tok || ev.ExitCode == nil || *ev.ExitCode != 3 || ev.Link != "https://tether.example/t/?attach="+tok {
		t.Errorf("webhook: got %s, want pty.exited of %s with exit_code 3 and its link", got.body, tok)
	}
}

// TestNotifyCluster: each cluster member tells of the runs it runs (the
// session's owner), from an outbox of its own, <state-dir>/outbox.db: a
// run is told once, not by every member.
func TestNotifyCluster(t *testing.T) {
	r := startReceiver(t, nil)
	hosts := startCluster3(t, notifyArgs(t, r.url)...)
	for i, h := range hosts[:2] {
		c := h.Dial(t)
		sid, key, runID := newSessionRun(t, c, fmt.Sprintf("run %d", i))
		waitComplete(t, c, sid)
		// The next call is this run's: the previous one was not told
		// again by another member.
		checkHook(t, r.next(t, "run.completed").ev, "run.completed", key, runID)
		if _, err := os.Stat(filepath.Join(h.StateDir, "outbox.db")); err != nil {
			t.Errorf("%s's outbox: %v", h.ID, err)
		}
	}
}
