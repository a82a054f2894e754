package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
)

// The ACP test kit (testing/acp): a deterministic ACP agent and an ACP
// client scenario runner, both on the official TypeScript SDK. Node and the
// kit's npm packages (`npm ci` in testing/acp, done by .ci/run) are
// required: a test that needs them fails without them, it never skips.

// acpSDKVersion is the @agentclientprotocol/sdk version the kit pins.
const acpSDKVersion = "2.4.0"

// acpNodeTimeout bounds one run of a kit script.
const acpNodeTimeout = 60 * time.Second

// acpKit returns the absolute path of testing/acp and the node binary,
// failing the test when node or the kit's packages are missing.
func acpKit(tb testing.TB) (dir, node string) {
	tb.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		tb.Fatalf("node is not installed: the ACP tests need it (and `npm ci` in testing/acp): %v", err)
	}
	dir, err = filepath.Abs(filepath.Join("..", "acp"))
	if err != nil {
		tb.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", "@agentclientprotocol", "sdk", "package.json"))
	if err != nil {
		tb.Fatalf("@agentclientprotocol/sdk is not installed: run `npm ci` in testing/acp: %v", err)
	}
	var pkg struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(b, &pkg); err != nil || pkg.Version != acpSDKVersion {
		tb.Fatalf("@agentclientprotocol/sdk in testing/acp is %q (%v), want %s: run `npm ci` in testing/acp", pkg.Version, err, acpSDKVersion)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "ws", "package.json")); err != nil {
		tb.Fatalf("ws is not installed: run `npm ci` in testing/acp: %v", err)
	}
	return dir, node
}

// runNode runs `node SCRIPT ARGS…` in the kit's directory with extra
// environment and returns its stdout; it fails the test on a non-zero exit
// or when the script runs longer than acpNodeTimeout.
func runNode(tb testing.TB, env []string, script string, args ...string) []byte {
	tb.Helper()
	dir, node := acpKit(tb)
	ctx, cancel := context.WithTimeout(context.Background(), acpNodeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{filepath.Join(dir, script)}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		tb.Fatalf("node %s %s: %v (timeout %v)\nstdout:\n%s\nstderr:\n%s", script, strings.Join(args, " "), err, acpNodeTimeout, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes()
}

// agentLogEntry is one line of the test agent's log (see agent.mjs).
type agentLogEntry struct {
	PID    int             `json:"pid"`
	Dir    string          `json:"dir"` // "in", "out" or "event"
	Kind   string          `json:"kind"`
	Method string          `json:"method"`
	ID     json.RawMessage `json:"id"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
	Event  string          `json:"event"`
	Reason string          `json:"reason"`
}

// readAgentLog parses the test agent's log; a missing file is no lines.
func readAgentLog(tb testing.TB, path string) []agentLogEntry {
	tb.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		tb.Fatal(err)
	}
	var entries []agentLogEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var e agentLogEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			tb.Fatalf("agent log line %q: %v", sc.Text(), err)
		}
		entries = append(entries, e)
	}
	return entries
}

// received returns the messages the agent received with method (requests
// and notifications), in order.
func received(entries []agentLogEntry, method string) []agentLogEntry {
	var out []agentLogEntry
	for _, e := range entries {
		if e.Dir == "in" && e.Method == method {
			out = append(out, e)
		}
	}
	return out
}

// responsesTo returns the responses the agent received to its own request
// with id (a request the agent sent, e.g. session/request_permission).
func responsesTo(entries []agentLogEntry, id json.RawMessage) []agentLogEntry {
	var out []agentLogEntry
	for _, e := range entries {
		if e.Dir == "in" && e.Kind == "response" && bytes.Equal(e.ID, id) {
			out = append(out, e)
		}
	}
	return out
}

// sentRequests returns the requests the agent sent with method.
func sentRequests(entries []agentLogEntry, method string) []agentLogEntry {
	var out []agentLogEntry
	for _, e := range entries {
		if e.Dir == "out" && e.Kind == "request" && e.Method == method {
			out = append(out, e)
		}
	}
	return out
}

// acpUpdate is an ACP session/update `update` object, the fields the tests
// look at.
type acpUpdate struct {
	SessionUpdate string `json:"sessionUpdate"`
	// Content is a content block for the message chunks, a list of tool call
	// contents for tool calls.
	Content    json.RawMessage `json:"content,omitempty"`
	ToolCallID string          `json:"toolCallId,omitempty"`
	Status     string          `json:"status,omitempty"`
}

// text is the update's text content block, "" when it has none.
func (u acpUpdate) text() string {
	var block struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(u.Content, &block) != nil || block.Type != "text" {
		return ""
	}
	return block.Text
}

// short is the update as kind:text (message chunks) or
// kind:toolCallId:status (tool calls), for comparisons and failure messages.
func (u acpUpdate) short() string {
	if u.ToolCallID != "" {
		return u.SessionUpdate + ":" + u.ToolCallID + ":" + u.Status
	}
	if strings.HasSuffix(u.SessionUpdate, "_chunk") {
		return u.SessionUpdate + ":" + u.text()
	}
	return u.SessionUpdate
}

// shorts maps short over us.
func shorts(us []acpUpdate) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = u.short()
	}
	return out
}

// rpcErr is a JSON-RPC error object as the kit scripts print it.
type rpcErr struct {
	Code    *int            `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

// codeIs reports whether e is an error with code.
func (e *rpcErr) codeIs(code int) bool { return e != nil && e.Code != nil && *e.Code == code }

// acpClientWait bounds the wait for a client.mjs phase or exit.
const acpClientWait = 45 * time.Second

// acpPhase is one `PHASE {…}` progress line of client.mjs.
type acpPhase struct {
	Phase      string          `json:"phase"`
	N          int             `json:"n"`
	Seq        *int64          `json:"seq"`
	As         string          `json:"as"`
	SessionID  string          `json:"sessionId"`
	RequestID  json.RawMessage `json:"requestId"`
	StopReason string          `json:"stopReason"`
	Error      *rpcErr         `json:"error"`
}

// acpSeen is one session/update a client.mjs run received.
type acpSeen struct {
	// Seq is params._meta["tether/seq"] as it was on the wire; SDKSeq as the
	// SDK handed it to the client's handler (nil: absent).
	Seq    *int64 `json:"seq"`
	SDKSeq *int64 `json:"sdkSeq"`
	// Meta and SDKMeta are the whole params._meta, on the wire and after
	// the SDK's parsing.
	Meta      json.RawMessage `json:"meta"`
	SDKMeta   json.RawMessage `json:"sdkMeta"`
	Phase     string          `json:"phase"` // "replay": before the bind's response; "live"
	SessionID string          `json:"sessionId"`
	Update    acpUpdate       `json:"update"`
}

// acpPermission is a session/request_permission a client.mjs run got.
type acpPermission struct {
	RequestID json.RawMessage `json:"requestId"`
	Params    struct {
		SessionID string `json:"sessionId"`
		ToolCall  struct {
			ToolCallID string `json:"toolCallId"`
		} `json:"toolCall"`
		Options []struct {
			OptionID string `json:"optionId"`
		} `json:"options"`
	} `json:"params"`
	Answer          json.RawMessage `json:"answer"`
	AnswerSent      bool            `json:"answerSent"`
	CancelRequested bool            `json:"cancelRequested"`
}

// acpCall is a request's outcome as client.mjs prints it.
type acpCall struct {
	Result json.RawMessage `json:"result"`
	Error  *rpcErr         `json:"error"`
}

// acpResult is what one client.mjs run printed (see its header).
type acpResult struct {
	Scenario   string  `json:"scenario"`
	Initialize acpCall `json:"initialize"`
	SessionID  string  `json:"sessionId"`
	Bind       *struct {
		Method   string          `json:"method"`
		Result   json.RawMessage `json:"result"`
		Error    *rpcErr         `json:"error"`
		Replayed int             `json:"replayed"`
	} `json:"bind"`
	Prompt *struct {
		StopReason string  `json:"stopReason"`
		Error      *rpcErr `json:"error"`
	} `json:"prompt"`
	CancelSent         bool              `json:"cancelSent"`
	List               *acpCall          `json:"list"`
	Updates            []acpSeen         `json:"updates"`
	PermissionRequests []acpPermission   `json:"permissionRequests"`
	CancelRequests     []json.RawMessage `json:"cancelRequests"`
	Close              *struct {
		Code   int    `json:"code"`
		Reason string `json:"reason"`
	} `json:"close"`
	TimedOut bool              `json:"timedOut"`
	Dropped  bool              `json:"dropped"`
	Errors   []string          `json:"errors"`
	Frames   []json.RawMessage `json:"frames"`
	raw      []byte
}

// updatesIn returns the updates of r that arrived in phase ("replay" or
// "live").
func (r acpResult) updatesIn(phase string) []acpUpdate {
	var out []acpUpdate
	for _, u := range r.Updates {
		if u.Phase == phase {
			out = append(out, u.Update)
		}
	}
	return out
}

// all returns every update r received, in order.
func (r acpResult) all() []acpUpdate {
	out := make([]acpUpdate, len(r.Updates))
	for i, u := range r.Updates {
		out[i] = u.Update
	}
	return out
}

// acpClient is a running `node client.mjs` (see startACPClient).
type acpClient struct {
	cmd     *exec.Cmd
	stdout  e2e.Buffer
	stderr  e2e.Buffer
	exited  chan struct{} // closed once the process has exited and its output is read
	waitErr error         // set before exited is closed

	mu      sync.Mutex // guards the fields below
	phases  []acpPhase
	changed chan struct{} // closed and replaced on every new phase
}

// startACPClient starts `node client.mjs SCENARIO URL ARGS…` with the
// token in ACP_TEST_TOKEN. The process is killed at cleanup if it is still
// running.
func startACPClient(tb testing.TB, url, token, scenario string, args ...string) *acpClient {
	tb.Helper()
	dir, node := acpKit(tb)
	c := &acpClient{exited: make(chan struct{}), changed: make(chan struct{})}
	c.cmd = exec.Command(node, append([]string{filepath.Join(dir, "client.mjs"), scenario, url}, args...)...)
	c.cmd.Dir = dir
	c.cmd.Env = append(os.Environ(), "ACP_TEST_TOKEN="+token)
	c.cmd.Stdout = &c.stdout
	errR, err := c.cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		tb.Fatalf("start node client.mjs: %v", err)
	}
	go func() {
		sc := bufio.NewScanner(errR)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			line := sc.Text()
			c.stderr.Write([]byte(line + "\n"))
			if rest, ok := strings.CutPrefix(line, "PHASE "); ok {
				var p acpPhase
				if json.Unmarshal([]byte(rest), &p) == nil {
					c.mu.Lock()
					c.phases = append(c.phases, p)
					close(c.changed)
					c.changed = make(chan struct{})
					c.mu.Unlock()
				}
			}
		}
		c.waitErr = c.cmd.Wait()
		close(c.exited)
	}()
	tb.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			c.cmd.Process.Kill()
			<-c.exited
		}
	})
	return c
}

// waitPhase waits until the client reported a phase called name for which
// match (nil: any) is true, and returns it.
func (c *acpClient) waitPhase(tb testing.TB, name string, match func(acpPhase) bool) acpPhase {
	tb.Helper()
	timeout := time.NewTimer(acpClientWait)
	defer timeout.Stop()
	for seen := 0; ; {
		c.mu.Lock()
		phases, changed := c.phases, c.changed
		c.mu.Unlock()
		for ; seen < len(phases); seen++ {
			if p := phases[seen]; p.Phase == name && (match == nil || match(p)) {
				return p
			}
		}
		select {
		case <-changed:
		case <-c.exited:
			c.mu.Lock()
			more := len(c.phases) > seen
			c.mu.Unlock()
			if !more {
				tb.Fatalf("client.mjs exited (%v) before phase %q\nstdout:\n%s\nstderr:\n%s", c.waitErr, name, c.stdout.String(), c.stderr.String())
			}
		case <-timeout.C:
			tb.Fatalf("client.mjs: no phase %q within %v\nstderr:\n%s", name, acpClientWait, c.stderr.String())
		}
	}
}

// result waits for the client to exit and returns what it printed. It
// fails the test if the client does not exit in time, exits non-zero
// (3: its own timeout) or prints no result.
func (c *acpClient) result(tb testing.TB) acpResult {
	tb.Helper()
	select {
	case <-c.exited:
	case <-time.After(acpClientWait):
		c.cmd.Process.Kill()
		<-c.exited
		tb.Fatalf("client.mjs did not exit within %v\nstdout:\n%s\nstderr:\n%s", acpClientWait, c.stdout.String(), c.stderr.String())
	}
	var r acpResult
	if err := json.Unmarshal([]byte(c.stdout.String()), &r); err != nil {
		tb.Fatalf("client.mjs %v: output %v\nstdout:\n%s\nstderr:\n%s", c.waitErr, err, c.stdout.String(), c.stderr.String())
	}
	r.raw = []byte(c.stdout.String())
	if c.waitErr != nil {
		tb.Fatalf("client.mjs: %v (timed out: %v)\nresult:\n%s\nstderr:\n%s", c.waitErr, r.TimedOut, c.stdout.String(), c.stderr.String())
	}
	for _, e := range r.Errors {
		tb.Errorf("client.mjs %s: %s", r.Scenario, e)
	}
	return r
}

// runACPClient runs one client.mjs scenario to its end and returns its
// result.
func runACPClient(tb testing.TB, url, token, scenario string, args ...string) acpResult {
	tb.Helper()
	return startACPClient(tb, url, token, scenario, args...).result(tb)
}

// acpRelay is a running `node relay.mjs` (testing/acp): WebSocket /acp to
// one test agent process per connection, nothing in between.
type acpRelay struct {
	URL     string // ws://127.0.0.1:PORT/acp
	Log     string // the agents' log
	cmd     *exec.Cmd
	stdout  e2e.Buffer
	exited  chan struct{}
	waitErr error
}

// startRelay starts the relay in front of the test agent (sessions kept in
// a directory of the test's own) with token as the access token.
func startRelay(tb testing.TB, token string) *acpRelay {
	tb.Helper()
	dir, node := acpKit(tb)
	agentDir := tb.TempDir()
	r := &acpRelay{Log: filepath.Join(agentDir, "agent.log"), exited: make(chan struct{})}
	r.cmd = exec.Command(node, filepath.Join(dir, "relay.mjs"), "--",
		node, filepath.Join(dir, "agent.mjs"), "--dir", agentDir, "--log", r.Log)
	r.cmd.Dir = dir
	r.cmd.Env = append(os.Environ(), "ACP_TEST_TOKEN="+token)
	r.cmd.Stderr = os.Stderr
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		tb.Fatalf("start node relay.mjs: %v", err)
	}
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			r.stdout.Write([]byte(sc.Text() + "\n"))
			if u, ok := strings.CutPrefix(sc.Text(), "relay listening on "); ok {
				listening <- u
			}
		}
		r.waitErr = r.cmd.Wait()
		close(r.exited)
	}()
	tb.Cleanup(func() {
		r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(10 * time.Second):
			r.cmd.Process.Kill()
			<-r.exited
		}
	})
	select {
	case r.URL = <-listening:
		return r
	case <-r.exited:
		tb.Fatalf("relay.mjs exited (%v) before listening:\n%s", r.waitErr, r.stdout.String())
	case <-time.After(acpClientWait):
		tb.Fatalf("relay.mjs printed no listening line within %v:\n%s", acpClientWait, r.stdout.String())
	}
	return nil
}

// auths returns how each connection the relay accepted presented the
// token ("header", "query" or "none"), in order.
func (r *acpRelay) auths(tb testing.TB) []string {
	tb.Helper()
	var out []string
	for _, l := range strings.Split(r.stdout.String(), "\n") {
		if rest, ok := strings.CutPrefix(l, "RELAY "); ok {
			var c struct {
				Auth string `json:"auth"`
			}
			if err := json.Unmarshal([]byte(rest), &c); err != nil {
				tb.Fatalf("relay line %q: %v", l, err)
			}
			out = append(out, c.Auth)
		}
	}
	return out
}

// checkFirstWins checks a permission race of the kit agent's prompt
// "permission": winner (the client that answered allow) got one request,
// answered, and chose:allow; loser got one request, withdrawn with a
// $/cancel_request of the same id, and the winner's choice. The labels
// name them in errors ("winner on h2", …).
func checkFirstWins(t *testing.T, winner, loser acpResult, wl, ll string) {
	t.Helper()
	wantPrompt(t, winner, "end_turn")
	if len(winner.PermissionRequests) != 1 || !winner.PermissionRequests[0].AnswerSent {
		t.Errorf("%s: permission requests %+v, want one, answered", wl, winner.PermissionRequests)
	}
	if got := shorts(winner.all()); !slices.Contains(got, "agent_message_chunk:chose:allow") {
		t.Errorf("%s: updates %q, want chose:allow", wl, got)
	}
	if len(loser.PermissionRequests) != 1 {
		t.Fatalf("%s: %d permission requests, want 1\n%.2000s", ll, len(loser.PermissionRequests), loser.raw)
	}
	lp := loser.PermissionRequests[0]
	if !lp.CancelRequested || len(loser.CancelRequests) != 1 || string(loser.CancelRequests[0]) != string(lp.RequestID) {
		t.Errorf("%s: request %s, $/cancel_request for %s (cancelRequested %v); want the same id withdrawn", ll, lp.RequestID, loser.CancelRequests, lp.CancelRequested)
	}
	if got := shorts(loser.all()); !slices.Contains(got, "agent_message_chunk:chose:allow") {
		t.Errorf("%s: updates %q, want chose:allow (the winner's choice)", ll, got)
	}
}
