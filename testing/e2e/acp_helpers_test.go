package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
