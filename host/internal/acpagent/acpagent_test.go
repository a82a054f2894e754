package acpagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/acp-go-sdk"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/metrics"
)

// The test binary is also the ACP agent these tests run as a real
// subprocess: with envAgent set, TestMain serves ACP on stdio instead.
const (
	envAgent  = "ACPAGENT_TEST_AGENT"  // "1": be the agent
	envLoad   = "ACPAGENT_TEST_LOAD"   // "1": advertise loadSession
	envOnTerm = "ACPAGENT_TEST_ONTERM" // a file the agent writes on SIGTERM, before it exits
	envMoan   = "ACPAGENT_TEST_MOAN"   // "1": complain on stderr about every unknown extension request
)

func TestMain(m *testing.M) {
	if os.Getenv(envAgent) == "1" {
		serveTestAgent()
		return
	}
	goleak.VerifyTestMain(m)
}

// testAgent answers prompts by their first word:
//
//	echo TEXT  one agent_message_chunk TEXT, end_turn
//	ask        a permission request, then "chose OPTION" (or "chose none")
//	hang       a chunk "hanging", then nothing until session/cancel, then cancelled
//	die        a chunk, then the process exits
//	env        the names of its TETHER_* environment variables
//	flood N    N chunks "0 ", "1 ", … as fast as it can write them
//	blocks     one chunk: the prompt's content blocks as JSON, as it got them
//
// A prompt whose first block is not text is answered like "blocks".
// session/load (when advertised) replays a chunk "replayed", which tether
// must drop.
type testAgent struct {
	conn *acp.AgentSideConnection
	mu   sync.Mutex
	n    int
	hung map[acp.SessionId]chan struct{}
}

func serveTestAgent() {
	fmt.Fprintln(os.Stderr, "test agent starting")
	if path := os.Getenv(envOnTerm); path != "" {
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		go func() {
			<-term
			_ = os.WriteFile(path, []byte("saved"), 0o600)
			os.Exit(0)
		}()
	}
	a := &testAgent{hung: map[acp.SessionId]chan struct{}{}}
	a.conn = acp.NewAgentSideConnection(a, os.Stdout, os.Stdin)
	a.conn.SetLogger(slog.New(slog.DiscardHandler))
	<-a.conn.Done()
	if os.Getenv(envOnTerm) != "" {
		// An agent that saves on SIGTERM: stdin's end (which the host
		// closes first) is not yet the signal to exit.
		time.Sleep(5 * time.Second) // the SIGTERM handler exits first
	}
}

func (a *testAgent) Initialize(context.Context, acp.InitializeRequest) (acp.InitializeResponse, error) {
	return acp.InitializeResponse{ProtocolVersion: acp.ProtocolVersionNumber, AgentCapabilities: acp.AgentCapabilities{
		LoadSession:        os.Getenv(envLoad) == "1",
		PromptCapabilities: acp.PromptCapabilities{EmbeddedContext: true},
	}}, nil
}

// HandleExtensionMethod knows no extension method; with envMoan it says
// so on stderr each time, as many real agents do.
func (a *testAgent) HandleExtensionMethod(_ context.Context, method string, _ json.RawMessage) (any, error) {
	if os.Getenv(envMoan) == "1" {
		fmt.Fprintf(os.Stderr, "error: unknown method %s\n", method)
	}
	return nil, acp.NewMethodNotFound(method)
}

func (a *testAgent) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, nil
}

func (a *testAgent) NewSession(_ context.Context, p acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	a.mu.Lock()
	a.n++
	id := fmt.Sprintf("agent-%d-%d", os.Getpid(), a.n)
	a.mu.Unlock()
	fmt.Fprintf(os.Stderr, "new session %s in %s\n", id, p.Cwd)
	return acp.NewSessionResponse{SessionId: acp.SessionId(id)}, nil
}

func (a *testAgent) LoadSession(ctx context.Context, p acp.LoadSessionRequest) (acp.LoadSessionResponse, error) {
	err := a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: p.SessionId, Update: acp.UpdateAgentMessageText("replayed")})
	return acp.LoadSessionResponse{}, err
}

func (a *testAgent) Prompt(ctx context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	text := "blocks"
	if len(p.Prompt) > 0 && p.Prompt[0].Text != nil {
		text = p.Prompt[0].Text.Text
	}
	cmd, arg, _ := strings.Cut(text, " ")
	say := func(s string) error {
		return a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: p.SessionId, Update: acp.UpdateAgentMessageText(s)})
	}
	switch cmd {
	case "echo":
		if err := say(arg); err != nil {
			return acp.PromptResponse{}, err
		}
	case "ask":
		if err := a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: p.SessionId, Update: acp.StartToolCall("t1", "write file")}); err != nil {
			return acp.PromptResponse{}, err
		}
		resp, err := a.conn.RequestPermission(ctx, acp.RequestPermissionRequest{
			SessionId: p.SessionId,
			ToolCall:  acp.ToolCallUpdate{ToolCallId: "t1"},
			Options: []acp.PermissionOption{
				{OptionId: "allow", Name: "Allow", Kind: acp.PermissionOptionKindAllowOnce},
				{OptionId: "deny", Name: "Deny", Kind: acp.PermissionOptionKindRejectOnce},
			},
		})
		if err != nil {
			return acp.PromptResponse{}, err
		}
		chose := "none"
		if resp.Outcome.Selected != nil {
			chose = string(resp.Outcome.Selected.OptionId)
		}
		if err := say("chose " + chose); err != nil {
			return acp.PromptResponse{}, err
		}
	case "hang":
		ch := make(chan struct{})
		a.mu.Lock()
		a.hung[p.SessionId] = ch
		a.mu.Unlock()
		if err := say("hanging"); err != nil {
			return acp.PromptResponse{}, err
		}
		<-ch
		return acp.PromptResponse{StopReason: acp.StopReasonCancelled}, nil
	case "die":
		_ = say("dying")
		os.Exit(3)
	case "flood":
		n, _ := strconv.Atoi(arg)
		for i := range n {
			if err := say(fmt.Sprintf("%d ", i)); err != nil {
				return acp.PromptResponse{}, err
			}
		}
	case "blocks":
		b, err := json.Marshal(p.Prompt)
		if err != nil {
			return acp.PromptResponse{}, err
		}
		if err := say(string(b)); err != nil {
			return acp.PromptResponse{}, err
		}
	case "env":
		var names []string
		for _, kv := range os.Environ() {
			if strings.HasPrefix(kv, "TETHER_") {
				names = append(names, kv)
			}
		}
		if err := say(fmt.Sprintf("tether env: %q", names)); err != nil {
			return acp.PromptResponse{}, err
		}
	default:
		return acp.PromptResponse{}, acp.NewInvalidParams(map[string]any{"prompt": text})
	}
	return acp.PromptResponse{StopReason: acp.StopReasonEndTurn}, nil
}

func (a *testAgent) Cancel(_ context.Context, p acp.CancelNotification) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ch := a.hung[p.SessionId]; ch != nil {
		close(ch)
		delete(a.hung, p.SessionId)
	}
	return nil
}

func (a *testAgent) ListSessions(context.Context, acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	return acp.ListSessionsResponse{Sessions: []acp.SessionInfo{}}, nil
}

func (a *testAgent) ResumeSession(context.Context, acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	return acp.ResumeSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionResume)
}

func (a *testAgent) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionClose)
}

func (a *testAgent) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetMode)
}

func (a *testAgent) SetSessionConfigOption(context.Context, acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	return acp.SetSessionConfigOptionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetConfigOption)
}

// syncBuffer is a log sink read while written.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs the test binary as the agent (loadSession advertised when
// load) behind a Factory.
func start(t *testing.T, load bool, opts ...func(*Config)) (*Factory, *syncBuffer) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(envAgent, "1")
	t.Setenv("TETHER_TOKEN", "secret-that-must-not-leak")
	if load {
		t.Setenv(envLoad, "1")
	} else {
		t.Setenv(envLoad, "")
	}
	logs := &syncBuffer{}
	cfg := Config{Argv: []string{self}, Cwd: t.TempDir(), Log: zerolog.New(logs), Metrics: metrics.New()}
	for _, o := range opts {
		o(&cfg)
	}
	f := New(cfg)
	if err := f.Start(context.Background()); err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(f.Close)
	return f, logs
}

// events records what a turn reports; Permission answers with answer.
type events struct {
	mu      sync.Mutex
	deltas  []string
	updates []string
	asked   chan agent.PermissionRequest
	answer  string // "" cancels
	// seenAtAsk is how many updates had been reported when the
	// permission was asked.
	seenAtAsk int
}

func newEvents(answer string) *events {
	return &events{asked: make(chan agent.PermissionRequest, 4), answer: answer}
}

func (e *events) Delta(text string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.deltas = append(e.deltas, text)
}

func (e *events) Update(u json.RawMessage) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.updates = append(e.updates, string(u))
}

func (e *events) Permission(_ context.Context, req agent.PermissionRequest) (string, bool, error) {
	e.mu.Lock()
	e.seenAtAsk = len(e.updates)
	e.mu.Unlock()
	e.asked <- req
	return e.answer, e.answer != "", nil
}

func (e *events) text() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.deltas, "")
}

func turn(t *testing.T, a agent.Agent, prompt string, ev agent.Events) (string, error) {
	t.Helper()
	return turnMessage(t, a, agent.Message{Role: agent.RoleUser, Text: prompt}, ev)
}

func turnMessage(t *testing.T, a agent.Agent, prompt agent.Message, ev agent.Events) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return a.(agent.Turner).Turn(ctx, nil, prompt, ev)
}

// TestTurnUpdatesAndPermission: a turn's session/update notifications
// reach Events as the ACP update objects (chunk text also as deltas),
// a permission request is asked through Events and its answer goes to the
// agent, and the turn ends with the agent's stop reason. The agent runs
// in the configured cwd with no TETHER_* variables, and its stderr is
// logged with the field agent.
func TestTurnUpdatesAndPermission(t *testing.T) {
	f, logs := start(t, false)
	if got := f.Capabilities(); !got.PromptCapabilities.EmbeddedContext {
		t.Errorf("capabilities = %+v, want the agent's", got)
	}
	a, err := f.NewAgent(context.Background(), "k1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ev := newEvents("")
	if reason, err := turn(t, a, "echo hello", ev); err != nil || reason != "end_turn" {
		t.Fatalf("turn = %q, %v", reason, err)
	}
	if ev.text() != "hello" || len(ev.updates) != 1 || !strings.Contains(ev.updates[0], `"sessionUpdate":"agent_message_chunk"`) {
		t.Fatalf("deltas %q updates %q", ev.deltas, ev.updates)
	}
	ev = newEvents("deny")
	if reason, err := turn(t, a, "ask", ev); err != nil || reason != "end_turn" {
		t.Fatalf("ask turn = %q, %v", reason, err)
	}
	req := <-ev.asked
	if !strings.Contains(string(req.Options), `"optionId":"allow"`) || !strings.Contains(string(req.ToolCall), `"toolCallId":"t1"`) {
		t.Fatalf("permission request = %s %s", req.ToolCall, req.Options)
	}
	if ev.text() != "chose deny" {
		t.Fatalf("after answering deny the agent said %q", ev.text())
	}
	ev = newEvents("")
	if _, err := turn(t, a, "ask", ev); err != nil || ev.text() != "chose none" {
		t.Fatalf("a cancelled permission: %q, %v; want chose none", ev.text(), err)
	}
	// The agent sends its tool call, then asks: the request is never
	// reported before the update that came first (the SDK hands requests
	// over on goroutines of their own).
	for i := range 20 {
		ev = newEvents("allow")
		if _, err := turn(t, a, "ask", ev); err != nil {
			t.Fatal(err)
		}
		if ev.seenAtAsk != 1 || !strings.Contains(ev.updates[0], `"sessionUpdate":"tool_call"`) {
			t.Fatalf("round %d: the permission request came after %d updates (%q), want after the tool call", i, ev.seenAtAsk, ev.updates)
		}
	}
	ev = newEvents("")
	if _, err := turn(t, a, "env", ev); err != nil || ev.text() != "tether env: []" {
		t.Fatalf("the agent's TETHER_ environment: %q, %v; want none", ev.text(), err)
	}
	var st state
	if err := json.Unmarshal(a.(agent.Stateful).State(), &st); err != nil || !strings.HasPrefix(st.SessionID, "agent-") {
		t.Fatalf("state = %s, %v", a.(agent.Stateful).State(), err)
	}
	if !strings.Contains(logs.String(), `"agent":`) || !strings.Contains(logs.String(), "test agent starting") {
		t.Fatalf("the agent's stderr is not in the log with the field agent: %s", logs)
	}
}

// hangEvents says when the agent reported it hangs.
type hangEvents struct {
	*events
	hanging chan struct{}
	once    sync.Once
}

func (h *hangEvents) Delta(text string) {
	h.events.Delta(text)
	if text == "hanging" {
		h.once.Do(func() { close(h.hanging) })
	}
}

// TestCancelSendsSessionCancel: cancelling a turn's context sends
// session/cancel, and the turn ends with the agent's cancelled.
// TestTurnSendsTheContentBlocks: a prompt's content blocks reach the
// agent as the client sent them (types and fields), not one text block.
func TestTurnSendsTheContentBlocks(t *testing.T) {
	f, _ := start(t, false)
	a, err := f.NewAgent(context.Background(), "k1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	content := `[{"type":"text","text":"blocks"},` +
		`{"type":"image","mimeType":"image/png","data":"iVBORw0KGgo=","uri":"file:///shot.png"},` +
		`{"type":"resource","resource":{"uri":"file:///a.go","mimeType":"text/x-go","text":"package a\n"}},` +
		`{"type":"resource_link","uri":"file:///b.go","name":"b.go"}]`
	ev := newEvents("")
	if reason, err := turnMessage(t, a, agent.Message{Role: agent.RoleUser, Text: "blocks", Content: json.RawMessage(content)}, ev); err != nil || reason != "end_turn" {
		t.Fatalf("turn = %q, %v", reason, err)
	}
	var got, want any
	if err := json.Unmarshal([]byte(ev.text()), &got); err != nil {
		t.Fatalf("the agent got %q: %v", ev.text(), err)
	}
	_ = json.Unmarshal([]byte(content), &want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the agent got %s\nwant %s", ev.text(), content)
	}
}

func TestCancelSendsSessionCancel(t *testing.T) {
	f, _ := start(t, false)
	a, err := f.NewAgent(context.Background(), "k1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan string, 1)
	ev := &hangEvents{events: newEvents(""), hanging: make(chan struct{})}
	go func() {
		r, _ := a.(agent.Turner).Turn(ctx, nil, agent.Message{Role: agent.RoleUser, Text: "hang"}, ev)
		done <- r
	}()
	<-ev.hanging // the prompt is in flight at the agent
	cancel()
	select {
	case r := <-done:
		if r != "cancelled" {
			t.Fatalf("stop reason = %q, want cancelled", r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a cancelled turn did not end")
	}
}

// TestCrashFailsTurnAndReattaches: the agent exiting mid-turn fails the
// turn with ErrAgentDown; the host restarts it, and the session's next
// turn reattaches with session/load — whose replay is not reported — when
// the agent can load, or with a new agent session (context reset) when it
// cannot.
func TestCrashFailsTurnAndReattaches(t *testing.T) {
	for _, load := range []bool{true, false} {
		t.Run(fmt.Sprintf("load=%v", load), func(t *testing.T) {
			f, _ := start(t, load)
			a, err := f.NewAgent(context.Background(), "k1", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			before := string(a.(agent.Stateful).State())
			if _, err := turn(t, a, "die", newEvents("")); !errors.Is(err, ErrAgentDown) {
				t.Fatalf("turn of a dying agent: %v, want ErrAgentDown", err)
			}
			ev := newEvents("")
			if reason, err := turn(t, a, "echo back", ev); err != nil || reason != "end_turn" {
				t.Fatalf("turn after the restart = %q, %v", reason, err)
			}
			if ev.text() != "back" {
				t.Fatalf("after the restart the turn reported %q, want only its own text (no replay)", ev.text())
			}
			st := a.(agent.Stateful)
			if load {
				if st.ContextReset() || string(st.State()) != before {
					t.Fatalf("with loadSession: reset %v, state %s (was %s); want the same agent session", st.ContextReset(), st.State(), before)
				}
			} else if !st.ContextReset() || string(st.State()) == before {
				t.Fatalf("without loadSession: reset %v, state %s (was %s); want a new agent session, reset", st.ContextReset(), st.State(), before)
			}
		})
	}
}

// TestStoredStateReattaches: a Factory given a stored state (after a host
// restart) loads that agent session when the agent can.
func TestStoredStateReattaches(t *testing.T) {
	f, _ := start(t, true)
	a, err := f.NewAgent(context.Background(), "k1", json.RawMessage(`{"session_id":"agent-old-1","cwd":"/srv/project"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got := string(a.(agent.Stateful).State()); got != `{"session_id":"agent-old-1","cwd":"/srv/project"}` {
		t.Fatalf("state = %s, want the stored one kept", got)
	}
	if a.(agent.Stateful).ContextReset() {
		t.Fatal("a loaded session reports its context reset")
	}
}

// TestStartFails: a command that is not there fails Start with a message
// naming it.
func TestStartFails(t *testing.T) {
	f := New(Config{Argv: []string{"/nonexistent/agent"}, Log: zerolog.Nop(), Metrics: metrics.New()})
	err := f.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/agent") {
		t.Fatalf("start = %v", err)
	}
	f.Close()
}

// TestHungAgentRestarted: an agent stopped with SIGSTOP does not answer
// its health ping; it is killed and restarted (reason unresponsive), and
// the session's next turn works on the new process.
func TestHungAgentRestarted(t *testing.T) {
	f, logs := start(t, true, func(c *Config) { c.HealthInterval, c.HealthTimeout = 50*time.Millisecond, 300*time.Millisecond })
	a, err := f.NewAgent(context.Background(), "k1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p, err := f.current(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	<-p.done // killed by the health check
	ev := newEvents("")
	if reason, err := turn(t, a, "echo alive", ev); err != nil || reason != "end_turn" || ev.text() != "alive" {
		t.Fatalf("turn after the restart = %q, %v, %q", reason, err, ev.text())
	}
	if got := testutil.ToFloat64(f.cfg.Metrics.PluginRestarts.WithLabelValues("agent", "unresponsive")); got != 1 {
		t.Errorf("restarts{agent,unresponsive} = %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "did not answer its health ping") {
		t.Errorf("no log of the unresponsive agent: %s", logs)
	}
}

// TestAgentThatDoesNotKnowThePing: an agent that answers the health ping
// with "method not found" and complains on stderr about it is alive: it
// is pinged once, complains at most once, is never restarted, and the
// error answer is logged at debug only; from then on its process state
// is watched, so a SIGSTOP still gets it restarted.
func TestAgentThatDoesNotKnowThePing(t *testing.T) {
	t.Setenv(envMoan, "1")
	watched := make(chan bool)
	f, logs := start(t, true, func(c *Config) {
		c.HealthInterval, c.HealthTimeout = 10*time.Millisecond, 300*time.Millisecond
		c.watched = watched
	})
	a, err := f.NewAgent(context.Background(), "k1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for n := 0; <-watched; n++ { // pings until the error answer
		if n == 100 {
			t.Fatal("still pinging after 100 error answers")
		}
	}
	for range 20 { // twenty more checks, none a ping
		if <-watched {
			t.Fatal("pinged again after an error answer")
		}
	}
	if n := strings.Count(logs.String(), "unknown method "+pingMethod); n > 1 {
		t.Errorf("the agent complained %d times about the ping, want at most once:\n%s", n, logs)
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "health ping with an error") && !strings.Contains(line, `"level":"debug"`) {
			t.Errorf("the error answer is logged above debug: %s", line)
		}
	}
	for _, r := range []string{"crashed", "unresponsive"} {
		if got := testutil.ToFloat64(f.cfg.Metrics.PluginRestarts.WithLabelValues("agent", r)); got != 0 {
			t.Errorf("restarts{agent,%s} = %v, want 0", r, got)
		}
	}
	ev := newEvents("")
	if reason, err := turn(t, a, "echo still here", ev); err != nil || reason != "end_turn" || ev.text() != "still here" {
		t.Fatalf("turn = %q, %v, %q", reason, err, ev.text())
	}

	// Not pinged, and stopped: restarted all the same.
	p, err := f.current(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	select { // (watch's sends do not wait for a reader)
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("a stopped agent that is not pinged was not restarted within 10 s")
	}
	ev = newEvents("")
	if reason, err := turn(t, a, "echo back", ev); err != nil || reason != "end_turn" || ev.text() != "back" {
		t.Fatalf("turn after the restart = %q, %v, %q", reason, err, ev.text())
	}
	if got := testutil.ToFloat64(f.cfg.Metrics.PluginRestarts.WithLabelValues("agent", "unresponsive")); got != 1 {
		t.Errorf("restarts{agent,unresponsive} after a SIGSTOP = %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "stopped (SIGSTOP)") {
		t.Errorf("no log of the stopped agent: %s", logs)
	}
}

// TestCloseLetsTheAgentSave: at shutdown the agent gets its stdin closed
// and SIGTERM and a grace to exit, so it can save its sessions.
func TestCloseLetsTheAgentSave(t *testing.T) {
	saved := t.TempDir() + "/saved"
	t.Setenv(envOnTerm, saved)
	f, _ := start(t, false)
	f.Close()
	if b, err := os.ReadFile(saved); err != nil || string(b) != "saved" {
		t.Fatalf("the agent did not save on SIGTERM: %q, %v", b, err)
	}
}

// slowEvents handles each update slowly, as a loaded host does.
type slowEvents struct{ *events }

func (s slowEvents) Update(u json.RawMessage) {
	time.Sleep(100 * time.Microsecond) // a slow journal, not synchronisation
	s.events.Update(u)
}

// TestFloodingAgentIsPacedNotCut: an agent that streams faster than tether
// takes its updates is slowed down (its stdout is read no faster than
// they are handled) instead of overflowing the ACP library's queue, which
// closes the connection: the turn ends end_turn with every update.
func TestFloodingAgentIsPacedNotCut(t *testing.T) {
	f, logs := start(t, false)
	a, err := f.NewAgent(context.Background(), "k1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const n = 3000
	ev := slowEvents{newEvents("")}
	reason, err := turn(t, a, fmt.Sprintf("flood %d", n), ev)
	if err != nil || reason != "end_turn" {
		t.Fatalf("flood turn = %q, %v; log: %s", reason, err, logs)
	}
	if got := len(ev.updates); got != n {
		t.Fatalf("%d updates reported, want %d", got, n)
	}
}
