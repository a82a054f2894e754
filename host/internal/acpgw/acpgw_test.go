package acpgw

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/acp-go-sdk"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/host/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is a table, a store and the /acp endpoint over them.
type env struct {
	t     *testing.T
	tbl   *session.Table
	st    *store.Store
	gw    *Gateway
	conns int
}

func newEnv(t *testing.T, agents agent.Factory) *env {
	t.Helper()
	return newEnvWith(t, agents, nil)
}

// newEnvWith is newEnv with the table's config changed by opt.
func newEnvWith(t *testing.T, agents agent.Factory, opt func(*session.Config)) *env {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	cfg := session.Config{Store: st, Agents: agents, Log: zerolog.Nop(), Metrics: m}
	if opt != nil {
		opt(&cfg)
	}
	tbl := session.NewTable(cfg)
	gw := New(Config{Table: tbl, Store: st, Cwd: "/srv", Version: "test", Log: zerolog.Nop(), Metrics: m})
	e := &env{t: t, tbl: tbl, st: st, gw: gw}
	t.Cleanup(func() {
		gw.Close()
		if err := tbl.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		st.Close()
	})
	return e
}

// wire is the transport between one client and the endpoint: frames the
// endpoint sends become lines the client reads; lines the client writes
// become frames.
type wireSender struct {
	mu     sync.Mutex
	pw     *io.PipeWriter
	closed bool
	code   int
	frames [][]byte // raw frames sent, for tests that read them
	queue  chan []byte
	gone   chan struct{} // closed at the connection's close
}

// newWireSender returns a sender whose frames a goroutine writes to pw in
// order, never blocking the endpoint (the queue is deep enough for any
// test here), until stop.
func newWireSender(pw *io.PipeWriter) *wireSender {
	w := &wireSender{pw: pw, queue: make(chan []byte, 1<<14), gone: make(chan struct{})}
	go func() {
		for data := range w.queue {
			_, _ = pw.Write(data)
		}
		// Closed: the client reads the end, as from a closed socket.
		_ = pw.Close()
	}()
	return w
}

func (w *wireSender) Send(cmd contract.Command) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch cmd.Kind {
	case contract.CommandSend:
		if w.closed {
			return
		}
		w.frames = append(w.frames, bytes.Clone(cmd.Data))
		w.queue <- append(bytes.Clone(cmd.Data), '\n')
	case contract.CommandClose:
		if !w.closed {
			w.closed, w.code = true, cmd.Code
			close(w.queue)
			if w.gone != nil {
				close(w.gone)
			}
		}
	}
}

func (w *wireSender) WaitRoom(context.Context, time.Duration) bool { return true }

// client is an acp-go-sdk client on a connection of the endpoint.
type client struct {
	t    *testing.T
	conn *conn
	out  *wireSender
	lw   *lineWriter
	cs   *acp.ClientSideConnection

	mu      sync.Mutex
	updates []acp.SessionNotification
	changed chan struct{} // signalled after each update
	asked   chan acp.RequestPermissionRequest
	answer  func(ctx context.Context, r acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error)
}

// lineWriter hands each line the client writes to the endpoint as a frame.
type lineWriter struct {
	mu    sync.Mutex
	c     *conn
	buf   []byte
	after func(line []byte) // called after each line was handed over
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := bytes.Clone(w.buf[:i])
		w.c.OnFrame(line, false)
		if w.after != nil {
			w.after(line)
		}
		w.buf = w.buf[i+1:]
	}
}

func (e *env) connect() *client {
	e.t.Helper()
	return e.connectAs(adminWho)
}

// connectAs opens a connection with who's credential.
func (e *env) connectAs(who access.Identity) *client {
	e.t.Helper()
	e.conns++
	pr, pw := io.Pipe()
	out := newWireSender(pw)
	c := e.gw.Open(link.Opening{ID: contract.TransportID{Instance: "t", Conn: uint64(e.conns)}, Transport: "ws", Event: &contract.Event{}, Out: out, Who: who}).(*conn)
	cl := &client{t: e.t, conn: c, out: out, asked: make(chan acp.RequestPermissionRequest, 16), changed: make(chan struct{}, 1)}
	cl.lw = &lineWriter{c: c}
	cl.cs = acp.NewClientSideConnection(cl, cl.lw, pr)
	cl.cs.SetLogger(slog.New(slog.DiscardHandler))
	e.t.Cleanup(func() { cl.close() })
	return cl
}

// close ends the connection as a socket close does.
func (cl *client) close() {
	cl.conn.OnClosed()
	cl.out.mu.Lock()
	if !cl.out.closed {
		cl.out.closed = true
		close(cl.out.queue)
	}
	cl.out.mu.Unlock()
	_ = cl.out.pw.Close()
	<-cl.cs.Done()
}

func (cl *client) SessionUpdate(_ context.Context, n acp.SessionNotification) error {
	cl.mu.Lock()
	cl.updates = append(cl.updates, n)
	cl.mu.Unlock()
	select {
	case cl.changed <- struct{}{}:
	default:
	}
	return nil
}

func (cl *client) RequestPermission(ctx context.Context, r acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	cl.asked <- r
	if cl.answer != nil {
		return cl.answer(ctx, r)
	}
	<-ctx.Done()
	return acp.RequestPermissionResponse{}, ctx.Err()
}

func (cl *client) ReadTextFile(context.Context, acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	return acp.ReadTextFileResponse{}, acp.NewMethodNotFound("fs/read_text_file")
}

func (cl *client) WriteTextFile(context.Context, acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	return acp.WriteTextFileResponse{}, acp.NewMethodNotFound("fs/write_text_file")
}

func (cl *client) CreateTerminal(context.Context, acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	return acp.CreateTerminalResponse{}, acp.NewMethodNotFound("terminal/create")
}

func (cl *client) KillTerminal(context.Context, acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	return acp.KillTerminalResponse{}, acp.NewMethodNotFound("terminal/kill")
}

func (cl *client) TerminalOutput(context.Context, acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	return acp.TerminalOutputResponse{}, acp.NewMethodNotFound("terminal/output")
}

func (cl *client) ReleaseTerminal(context.Context, acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	return acp.ReleaseTerminalResponse{}, acp.NewMethodNotFound("terminal/release")
}

func (cl *client) WaitForTerminalExit(context.Context, acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	return acp.WaitForTerminalExitResponse{}, acp.NewMethodNotFound("terminal/wait_for_exit")
}

// update is one received session/update, flattened.
type update struct {
	session string
	seq     uint64
	kind    string // user, agent or other
	text    string
}

// received returns the updates so far, flattened.
func (cl *client) received() []update {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	out := make([]update, 0, len(cl.updates))
	for _, n := range cl.updates {
		u := update{session: string(n.SessionId), kind: "other"}
		if f, ok := n.Meta[MetaSeq].(float64); ok {
			u.seq = uint64(f)
		}
		switch {
		case n.Update.UserMessageChunk != nil:
			u.kind = "user"
			if tb := n.Update.UserMessageChunk.Content.Text; tb != nil {
				u.text = tb.Text
			}
		case n.Update.AgentMessageChunk != nil:
			u.kind = "agent"
			if tb := n.Update.AgentMessageChunk.Content.Text; tb != nil {
				u.text = tb.Text
			}
		}
		out = append(out, u)
	}
	return out
}

// agentText is the concatenated agent text of updates.
func agentText(us []update) string {
	var b strings.Builder
	for _, u := range us {
		if u.kind == "agent" {
			b.WriteString(u.text)
		}
	}
	return b.String()
}

func (cl *client) initialize(t *testing.T) acp.InitializeResponse {
	t.Helper()
	resp, err := cl.cs.Initialize(ctx(t), acp.InitializeRequest{ProtocolVersion: acp.ProtocolVersionNumber})
	if err != nil {
		t.Fatalf("initialize: %v", err)
	}
	return resp
}

func (cl *client) newSession(t *testing.T, cwd string) string {
	t.Helper()
	resp, err := cl.cs.NewSession(ctx(t), acp.NewSessionRequest{Cwd: cwd, McpServers: []acp.McpServer{}})
	if err != nil {
		t.Fatalf("session/new: %v", err)
	}
	return string(resp.SessionId)
}

func (cl *client) prompt(t *testing.T, sid, text string) (acp.PromptResponse, error) {
	t.Helper()
	return cl.cs.Prompt(ctx(t), acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: []acp.ContentBlock{acp.TextBlock(text)}})
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// requestCode is the JSON-RPC code of err, or 0.
func requestCode(err error) int {
	var re *acp.RequestError
	if errors.As(err, &re) {
		return re.Code
	}
	return 0
}

// TestInitializeAndPrompt: tether answers initialize as an agent that
// loads, resumes and lists sessions; session/new gives the stored key;
// session/prompt streams the echo agent's deltas as agent_message_chunk
// updates with increasing tether/seq and answers end_turn when the run
// ends, its answer stored.
func TestInitializeAndPrompt(t *testing.T) {
	e := newEnv(t, agent.NewEchoFactory(0))
	cl := e.connect()
	init := cl.initialize(t)
	if init.ProtocolVersion != 1 || !init.AgentCapabilities.LoadSession ||
		init.AgentCapabilities.SessionCapabilities.Resume == nil || init.AgentCapabilities.SessionCapabilities.List == nil {
		t.Fatalf("initialize = %+v, want protocol 1 with loadSession, resume and list", init)
	}
	sid := cl.newSession(t, "/work/project")
	if _, err := e.st.GetSession(context.Background(), sid); err != nil {
		t.Fatalf("session/new gave %q, not a stored key: %v", sid, err)
	}
	resp, err := cl.prompt(t, sid, "hello brave world")
	if err != nil {
		t.Fatalf("prompt: %v", err)
	}
	if resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("stopReason = %q, want end_turn", resp.StopReason)
	}
	us := cl.received()
	if got := agentText(us); got != "hello brave world" {
		t.Fatalf("agent text = %q, want the echo of the prompt", got)
	}
	var last uint64
	for _, u := range us {
		if u.kind == "user" {
			t.Errorf("the prompting client got its own prompt back: %+v", u)
		}
		if u.session != sid || u.seq <= last {
			t.Errorf("update %+v: want session %s and a seq above %d", u, sid, last)
		}
		last = u.seq
	}
	msgs, err := e.st.Messages(context.Background(), sid)
	if err != nil || len(msgs) != 2 || msgs[1].Text != "hello brave world" {
		t.Fatalf("stored messages = %+v, %v; want the prompt and its answer", msgs, err)
	}
}

// TestLoadReplaysHistoryBeforeAnswering: a second client's session/load
// gets the whole history — the prompts as user_message_chunk, the answers
// as agent_message_chunk, in journal order — before its response, and
// then the live updates of a prompt the first client sends, the prompt
// itself included.
func TestLoadReplaysHistoryBeforeAnswering(t *testing.T) {
	e := newEnv(t, agent.NewEchoFactory(0))
	a := e.connect()
	a.initialize(t)
	sid := a.newSession(t, "/work/p")
	for _, p := range []string{"one two", "three"} {
		if _, err := a.prompt(t, sid, p); err != nil {
			t.Fatal(err)
		}
	}
	b := e.connect()
	b.initialize(t)
	if _, err := b.cs.LoadSession(ctx(t), acp.LoadSessionRequest{SessionId: acp.SessionId(sid), Cwd: "/elsewhere", McpServers: []acp.McpServer{}}); err != nil {
		t.Fatalf("session/load: %v", err)
	}
	replay := b.received()
	var flat []string
	for _, u := range replay {
		flat = append(flat, u.kind+":"+u.text)
	}
	want := []string{"user:one two", "agent:one ", "agent:two", "user:three", "agent:three"}
	if strings.Join(flat, "|") != strings.Join(want, "|") {
		t.Fatalf("replay before the load's response = %q, want %q", flat, want)
	}
	for i := 1; i < len(replay); i++ {
		if replay[i].seq <= replay[i-1].seq {
			t.Fatalf("replay seqs not increasing: %+v", replay)
		}
	}
	if _, err := a.prompt(t, sid, "four"); err != nil {
		t.Fatal(err)
	}
	// b is told of a's run live; its last update is the answer's text.
	b.waitUpdates(t, func(us []update) bool { return agentText(us) == "one twothreefour" })
	live := b.received()[len(replay):]
	if len(live) < 2 || live[0].kind != "user" || live[0].text != "four" {
		t.Fatalf("live updates at the second client = %+v, want the other client's prompt first", live)
	}
	// The session keeps the cwd it was made with.
	list, err := b.cs.ListSessions(ctx(t), acp.ListSessionsRequest{})
	if err != nil || len(list.Sessions) != 1 || list.Sessions[0].Cwd != "/work/p" {
		t.Fatalf("session/list = %+v, %v; want the session with cwd /work/p", list, err)
	}
}

// TestResumeAfterSendsExactlyTheRest: session/resume with tether/after N
// sends exactly the updates with seq > N, none twice; without it, none.
func TestResumeAfterSendsExactlyTheRest(t *testing.T) {
	e := newEnv(t, agent.NewEchoFactory(0))
	a := e.connect()
	a.initialize(t)
	sid := a.newSession(t, "/w")
	if _, err := a.prompt(t, sid, "a b c d"); err != nil {
		t.Fatal(err)
	}
	first := a.received()
	cut := first[1].seq // seen up to the second update
	a.close()

	b := e.connect()
	b.initialize(t)
	if _, err := b.cs.ResumeSession(ctx(t), acp.ResumeSessionRequest{SessionId: acp.SessionId(sid), Cwd: "/w", Meta: map[string]any{MetaAfter: cut}}); err != nil {
		t.Fatalf("session/resume: %v", err)
	}
	got := b.received()
	var want []uint64
	for _, u := range first {
		if u.seq > cut {
			want = append(want, u.seq)
		}
	}
	var seqs []uint64
	for _, u := range got {
		seqs = append(seqs, u.seq)
	}
	if len(seqs) == 0 || !equalSeqs(seqs, want) {
		t.Fatalf("resume after %d sent seqs %v, want %v", cut, seqs, want)
	}

	c := e.connect()
	c.initialize(t)
	if _, err := c.cs.ResumeSession(ctx(t), acp.ResumeSessionRequest{SessionId: acp.SessionId(sid), Cwd: "/w"}); err != nil {
		t.Fatalf("session/resume: %v", err)
	}
	if got := c.received(); len(got) != 0 {
		t.Fatalf("resume without tether/after sent %+v, want nothing", got)
	}
	if _, err := c.prompt(t, sid, "x"); err != nil {
		t.Fatalf("prompt after resume: %v", err)
	}
}

func equalSeqs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCancelAndErrors: session/cancel answers the prompt with cancelled;
// a prompt to a session the connection has not bound gets 4001, to a
// busy session 4009, and a session/load of an unknown key 4007.
func TestCancelAndErrors(t *testing.T) {
	e := newEnv(t, agent.NewEchoFactory(time.Hour))
	cl := e.connect()
	cl.initialize(t)
	sid := cl.newSession(t, "/w")
	watcher := e.connect()
	watcher.initialize(t)
	if _, err := watcher.cs.ResumeSession(ctx(t), acp.ResumeSessionRequest{SessionId: acp.SessionId(sid), Cwd: "/w"}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var resp acp.PromptResponse
	go func() {
		var err error
		resp, err = cl.cs.Prompt(context.Background(), acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: []acp.ContentBlock{acp.TextBlock("slow words")}})
		done <- err
	}()
	// The run has started once another client is told of its prompt.
	watcher.waitUpdates(t, func(us []update) bool { return len(us) > 0 && us[0].kind == "user" })
	if _, err := cl.prompt(t, sid, "again"); requestCode(err) != 4009 {
		t.Errorf("prompt while a run is in flight: %v, want 4009", err)
	}
	if err := cl.cs.Cancel(ctx(t), acp.CancelNotification{SessionId: acp.SessionId(sid)}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || resp.StopReason != acp.StopReasonCancelled {
		t.Fatalf("cancelled prompt = %+v, %v; want stopReason cancelled", resp, err)
	}
	other := e.connect()
	other.initialize(t)
	if _, err := other.prompt(t, sid, "hi"); requestCode(err) != 4001 {
		t.Errorf("prompt to a session not bound here: %v, want 4001", err)
	}
	if _, err := other.cs.LoadSession(ctx(t), acp.LoadSessionRequest{SessionId: "20990101_000000_abcdef", Cwd: "/", McpServers: []acp.McpServer{}}); requestCode(err) != 4007 {
		t.Errorf("load of an unknown key: %v, want 4007", err)
	}
	if _, err := other.cs.NewSession(ctx(t), acp.NewSessionRequest{Cwd: "relative", McpServers: []acp.McpServer{}}); requestCode(err) != -32602 {
		t.Errorf("session/new with a relative cwd: %v, want -32602", err)
	}
}

// failing is an agent whose every run fails.
type failing struct{}

func (failing) Run(context.Context, []agent.Message, string, func(string)) error {
	return errors.New("model unavailable")
}
func (failing) Close() error { return nil }

// TestFailedTurnIs5001: a failed turn answers its prompt with 5001 turn
// failed, data.reason saying why.
func TestFailedTurnIs5001(t *testing.T) {
	e := newEnv(t, agent.FactoryFunc(func(context.Context, string, json.RawMessage) (agent.Agent, error) { return failing{}, nil }))
	cl := e.connect()
	cl.initialize(t)
	sid := cl.newSession(t, "/w")
	_, err := cl.prompt(t, sid, "hi")
	var re *acp.RequestError
	if !errors.As(err, &re) || re.Code != 5001 {
		t.Fatalf("failed turn: %v, want 5001", err)
	}
	if data, _ := json.Marshal(re.Data); !strings.Contains(string(data), "model unavailable") {
		t.Fatalf("5001 data = %s, want the reason", data)
	}
}

// TestBadFrames: frames that are not JSON-RPC get the JSON-RPC errors and
// the connection goes on serving.
func TestBadFrames(t *testing.T) {
	e := newEnv(t, agent.NewEchoFactory(0))
	cl := e.connect()
	for _, tc := range []struct {
		frame  string
		binary bool
		code   int
	}{
		{"not json", false, -32700},
		{`[1,2]`, false, -32600},
		{`{"jsonrpc":"2.0","id":7}`, false, -32600},
		{`{"jsonrpc":"2.0","id":8,"method":3}`, false, -32600},
		{`{}`, true, -32600},
		// Messages the library would drop without an answer.
		{`{"jsonrpc":2,"id":9,"method":"session/list","params":{}}`, false, -32600},
		{`{"jsonrpc":"2.0","id":10,"method":"session/list","params":{},"error":"x"}`, false, -32600},
		{`{"jsonrpc":"2.0","id":11,"error":{"code":"x"}}`, false, -32600},
		// tether's own end-of-input marker is not the client's to send.
		{`{"jsonrpc":"2.0","id":12,"method":"_tether/closed"}`, false, -32601},
	} {
		n := len(cl.out.sent())
		cl.conn.OnFrame([]byte(tc.frame), tc.binary)
		frames := cl.out.sent()
		if len(frames) != n+1 {
			t.Fatalf("%q: %d frames answered, want 1", tc.frame, len(frames)-n)
		}
		var r struct {
			Error struct{ Code int } `json:"error"`
		}
		if err := json.Unmarshal(frames[n], &r); err != nil || r.Error.Code != tc.code {
			t.Errorf("%q: answered %s, want code %d", tc.frame, frames[n], tc.code)
		}
	}
	cl.initialize(t)
	if sid := cl.newSession(t, "/w"); sid == "" {
		t.Fatal("no session after bad frames")
	}
}

func (w *wireSender) sent() [][]byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([][]byte(nil), w.frames...)
}

// asker asks for permission once per turn and says what was chosen.
type asker struct{}

var _ agent.Turner = asker{}

func (asker) Run(context.Context, []agent.Message, string, func(string)) error {
	return errors.New("a Turner's Run is never called")
}

func (asker) Turn(ctx context.Context, _ []agent.Message, _ agent.Message, ev agent.Events) (string, error) {
	opt, ok, err := ev.Permission(ctx, agent.PermissionRequest{
		ToolCall: json.RawMessage(`{"toolCallId":"t1","title":"write file"}`),
		Options:  json.RawMessage(`[{"optionId":"allow","name":"Allow","kind":"allow_once"},{"optionId":"deny","name":"Deny","kind":"reject_once"}]`),
	})
	if err != nil {
		return "", err
	}
	if !ok {
		opt = "none"
	}
	ev.Update(json.RawMessage(`{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"chose ` + opt + `"}}`))
	ev.Delta("chose " + opt)
	return "end_turn", nil
}

func (asker) Close() error { return nil }

// TestPermissionFirstClientWins: a permission request reaches every bound
// client; the first answer is the agent's, the request is withdrawn from
// the other client, whose late answer never reaches the agent.
func TestPermissionFirstClientWins(t *testing.T) {
	e := newEnv(t, agent.FactoryFunc(func(context.Context, string, json.RawMessage) (agent.Agent, error) { return asker{}, nil }))
	a := e.connect()
	a.initialize(t)
	sid := a.newSession(t, "/w")
	b := e.connect()
	b.initialize(t)
	if _, err := b.cs.ResumeSession(ctx(t), acp.ResumeSessionRequest{SessionId: acp.SessionId(sid), Cwd: "/w"}); err != nil {
		t.Fatal(err)
	}
	withdrawn := make(chan struct{})
	b.answer = func(ctx context.Context, r acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
		<-ctx.Done() // tether's $/cancel_request
		close(withdrawn)
		return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeSelected("deny")}, nil
	}
	a.answer = func(ctx context.Context, r acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
		<-b.asked // both were asked before a answers
		return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeSelected("allow")}, nil
	}
	resp, err := a.prompt(t, sid, "go")
	if err != nil || resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt = %+v, %v", resp, err)
	}
	select {
	case <-withdrawn:
	case <-time.After(10 * time.Second):
		t.Fatal("the losing client's request was not withdrawn")
	}
	if got := agentText(a.received()); got != "chose allow" {
		t.Fatalf("agent text = %q, want the first answer's option", got)
	}
	msgs, err := e.st.Messages(context.Background(), sid)
	if err != nil || len(msgs) != 2 || msgs[1].Text != "chose allow" {
		t.Fatalf("stored = %+v, %v", msgs, err)
	}
}

// TestPendingPermissionAskedOnLoad: a client that loads the session while
// a request is open is asked it too, and can answer it.
func TestPendingPermissionAskedOnLoad(t *testing.T) {
	e := newEnv(t, agent.FactoryFunc(func(context.Context, string, json.RawMessage) (agent.Agent, error) { return asker{}, nil }))
	a := e.connect()
	a.initialize(t)
	sid := a.newSession(t, "/w")
	done := make(chan error, 1)
	go func() {
		_, err := a.cs.Prompt(context.Background(), acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: []acp.ContentBlock{acp.TextBlock("go")}})
		done <- err
	}()
	<-a.asked
	a.close() // a leaves without answering; the run waits
	if err := <-done; err == nil {
		t.Fatal("a closed connection's prompt answered")
	}
	b := e.connect()
	b.answer = func(context.Context, acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
		return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeSelected("deny")}, nil
	}
	b.initialize(t)
	if _, err := b.cs.LoadSession(ctx(t), acp.LoadSessionRequest{SessionId: acp.SessionId(sid), Cwd: "/w", McpServers: []acp.McpServer{}}); err != nil {
		t.Fatal(err)
	}
	b.waitUpdates(t, func(us []update) bool { return strings.Contains(agentText(us), "chose deny") })
}

// waitUpdates waits until cond holds of the updates cl received.
func (cl *client) waitUpdates(t *testing.T, cond func([]update) bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for !cond(cl.received()) {
		select {
		case <-cl.changed:
		case <-timeout:
			t.Fatalf("updates %+v: condition not reached in 10s", cl.received())
		}
	}
}

// TestRefusedSessionIDsAndPrompts: a title is not a sessionId (load and
// resume want the stored key every later message names), and a prompt
// with a block the agent does not take is refused, never passed on
// without it; echo takes text and resource links only.
func TestRefusedSessionIDsAndPrompts(t *testing.T) {
	e := newEnv(t, agent.NewEchoFactory(0))
	cl := e.connect()
	init := cl.initialize(t)
	if pc := init.AgentCapabilities.PromptCapabilities; pc.Image || pc.Audio || pc.EmbeddedContext {
		t.Errorf("promptCapabilities = %+v, want text only", pc)
	}
	sid := cl.newSession(t, "/w")
	if err := e.st.SetTitle(context.Background(), sid, "my title"); err != nil {
		t.Fatal(err)
	}
	other := e.connect()
	other.initialize(t)
	if _, err := other.cs.LoadSession(ctx(t), acp.LoadSessionRequest{SessionId: "my title", Cwd: "/", McpServers: []acp.McpServer{}}); requestCode(err) != 4007 {
		t.Errorf("load by title: %v, want 4007", err)
	}
	if _, err := other.cs.ResumeSession(ctx(t), acp.ResumeSessionRequest{SessionId: "my title", Cwd: "/"}); requestCode(err) != 4007 {
		t.Errorf("resume by title: %v, want 4007", err)
	}
	image := acp.ContentBlock{Image: &acp.ContentBlockImage{Data: "AAAA", MimeType: "image/png"}}
	if _, err := cl.cs.Prompt(ctx(t), acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: []acp.ContentBlock{acp.TextBlock("what is this"), image}}); requestCode(err) != -32602 {
		t.Errorf("prompt with an image: %v, want -32602", err)
	}
	if resp, err := cl.prompt(t, sid, "still here"); err != nil || resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt after the refusals = %+v, %v", resp, err)
	}
}

// TestTruncatedReplaySaysSo: a load whose replay cannot hold every update
// (the journal kept only the newest events, the ring too) answers with
// _meta["tether/truncated"]; a whole replay has no such key.
func TestTruncatedReplaySaysSo(t *testing.T) {
	e := newEnvWith(t, agent.NewEchoFactory(0), func(c *session.Config) {
		c.RingSize = 4
		c.Retention = store.Retention{PerSession: 5}
	})
	a := e.connect()
	a.initialize(t)
	sid := a.newSession(t, "/w")
	if _, err := a.prompt(t, sid, "one two three four five six seven eight"); err != nil {
		t.Fatal(err)
	}
	a.close() // parked, then its events are served from the journal
	b := e.connect()
	b.initialize(t)
	resp, err := b.cs.LoadSession(ctx(t), acp.LoadSessionRequest{SessionId: acp.SessionId(sid), Cwd: "/", McpServers: []acp.McpServer{}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Meta[MetaTruncated] != true {
		t.Fatalf("load of a pruned session: _meta %v, want %s true", resp.Meta, MetaTruncated)
	}
	c := e.connect()
	c.initialize(t)
	latest := b.received()[len(b.received())-1].seq
	r2, err := c.cs.ResumeSession(ctx(t), acp.ResumeSessionRequest{SessionId: acp.SessionId(sid), Cwd: "/", Meta: map[string]any{MetaAfter: latest - 1}})
	if err != nil || r2.Meta[MetaTruncated] != nil {
		t.Fatalf("resume within what is kept: %+v, %v; want no truncation", r2, err)
	}
	d := e.connect()
	d.initialize(t)
	r3, err := d.cs.ResumeSession(ctx(t), acp.ResumeSessionRequest{SessionId: acp.SessionId(sid), Cwd: "/", Meta: map[string]any{MetaAfter: latest + 100}})
	if err != nil || r3.Meta[MetaTruncated] != true {
		t.Fatalf("resume after a seq the session never had: %+v, %v; want truncated", r3, err)
	}
}

// TestEventQueueBoundedByBytes: a connection's event queue takes a burst
// of thousands of events (an agent streaming unpaced, committed in big
// batches, faster than the worker encodes them) without closing the
// connection — it was closed with 1013 past 4,096 queued events — and
// closes it with 1013 only once the queued events pass 16 MiB, once.
func TestEventQueueBoundedByBytes(t *testing.T) {
	out := &wireSender{queue: make(chan []byte, 1)}
	c := &conn{out: out, log: zerolog.Nop(), events: make(chan struct{}, 1)}
	frame := bytes.Repeat([]byte("x"), 200)
	for range 20000 {
		c.Send(frame)
	}
	if out.closed {
		t.Fatalf("closed with %d after 20,000 events of 200 bytes (4 MB queued), want open", out.code)
	}
	if got := len(c.takeEvents()); got != 20000 {
		t.Fatalf("queued %d events, want 20000 in order", got)
	}
	big := bytes.Repeat([]byte("y"), 1<<20)
	for range 17 {
		c.Send(big)
	}
	if !out.closed || out.code != 1013 {
		t.Fatalf("after 17 MiB queued: closed %v with %d, want closed with 1013", out.closed, out.code)
	}
	if got := len(c.takeEvents()); got != 0 {
		t.Fatalf("%d events left queued after the cut, want none", got)
	}
	c.Send(frame) // after the cut: dropped, no second close
	if got := len(c.takeEvents()); got != 0 {
		t.Fatalf("an event queued after the cut")
	}
}

// adminWho is the identity of the tests' connections: the access token's.
var adminWho = access.Identity{Name: access.AdminName, Scopes: []string{access.ScopeAdmin}, Credential: access.AdminName}
