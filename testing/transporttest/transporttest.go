package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// waitTimeout bounds every wait of the kit. Reaching it is a failure,
// never a way to synchronise.
const waitTimeout = 10 * time.Second

// Path is the path the kit's clients ask for; the transport must report it
// in Opened.Path.
const Path = "/api/ws"

// Capability is a feature of a transport that not every transport has.
// Run checks all of them unless told otherwise with Without; the checks of
// a missing capability are left out (a check that needs nothing else is
// skipped as a whole, so it shows as SKIP in go test -v).
type Capability uint

// Capabilities.
const (
	// Binary: binary messages travel both ways besides text messages.
	Binary Capability = 1 << iota
	// MultilineText: text messages may contain line breaks.
	MultilineText
	// CloseCodes: close codes travel over the wire both ways: a client
	// receives the code the host closes with, and the transport reports
	// the code a client closes with. (The Closed event of a host close
	// reports the host's code either way.)
	CloseCodes
	// HalfOpen: the transport pings idle peers every
	// StartRequest.PingInterval and closes a peer silent for
	// StartRequest.PeerTimeout, reporting 1006.
	HalfOpen
)

func (c Capability) String() string {
	names := []string{"Binary", "MultilineText", "CloseCodes", "HalfOpen"}
	var out []byte
	for i, n := range names {
		if c&(1<<i) != 0 {
			if len(out) > 0 {
				out = append(out, '|')
			}
			out = append(out, n...)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return string(out)
}

// An Option changes how Run drives the transport.
type Option func(*config)

// WithDialer makes the kit's clients connect with d instead of
// WebSocketDialer.
func WithDialer(d Dialer) Option {
	return func(c *config) { c.dial = d }
}

// WithListen makes the kit start each transport with
// StartRequest.Listen = listen(t) instead of "127.0.0.1:0". It is called
// once per transport the kit starts (a check may start a second one on
// the first one's address).
func WithListen(listen func(t *testing.T) string) Option {
	return func(c *config) { c.listen = listen }
}

// Without tells the kit that the transport lacks the capabilities in c
// (several may be or-ed together).
func Without(c Capability) Option {
	return func(cfg *config) { cfg.lacks |= c }
}

type config struct {
	dial   Dialer
	listen func(t *testing.T) string
	lacks  Capability
}

// kit is one Run.
type kit struct {
	cfg          config
	newTransport func(t *testing.T) contract.Transport
	queries      atomic.Uint64 // numbers the clients' queries
}

func (k *kit) has(c Capability) bool { return k.cfg.lacks&c == 0 }

// require skips t unless the transport has c.
func (k *kit) require(t *testing.T, c Capability) {
	t.Helper()
	if !k.has(c) {
		t.Skipf("the transport lacks %v", c)
	}
}

// Run checks that the transports newTransport returns implement
// contract.Transport, from the outside, through real clients made by the
// Dialer. Every check is a subtest of t with a fresh transport: Run calls
// newTransport (once or twice per check) and must get a new, unstarted
// transport each time; it starts it on "127.0.0.1:0" (see WithListen),
// links it, and stops it when the check ends. Whatever newTransport
// registers with t.Cleanup runs after the kit has stopped the transport.
//
// The checks:
//
//   - Opened: a connection is reported with Path "/api/ws", the query the
//     client sent, Host equal to the address Start returned (the host
//     compares the two), a Remote, and canonical header keys.
//   - ConnIDs: connection ids are never reused, with connections one after
//     another and many at once.
//   - EventOrder: per connection, Opened, then the client's messages as
//     Frames in order, then exactly one Closed, last.
//   - NoFrameBeforeAdmit: messages a client sends before the host admits
//     it are not reported before, and are reported after, the admission.
//   - RefuseBeforeAdmit: a host Close of a connection never admitted
//     reaches the client with its code and is reported Closed with it.
//   - Send: text and binary messages, empty to 1 MiB, arrive in order,
//     sent one per Exec or many in one.
//   - CloseAfterSend: a host Close (1000, 1012, 4409, 4410) reaches the
//     client after every message queued before it; Closed reports the
//     code and reason; later commands for the connection are ignored.
//   - ClientClose: a client's close is reported with its code and reason.
//   - Drop: a client that vanishes is reported Closed with 1006.
//   - Backpressure: Exec never blocks on a client that stops reading; the
//     connection is closed with 1013 instead; a client that keeps up is
//     never closed.
//   - HalfOpen: with PingInterval 100ms and PeerTimeout 750ms, a client
//     that stops answering is reported Closed with 1006, no sooner than
//     PeerTimeout; one that keeps answering stays.
//   - Stop: Stop closes every connection, admitted or not, with its code
//     after what was queued, and Link returns after every Closed; then the
//     listener is gone.
//   - Restart: a new transport starts on the address a stopped one had.
//   - LinkTwice: a second Link while one runs fails with
//     contract.ErrAlreadyLinked and leaves the first one working.
//   - Stats: a transport that reports counters (a contract.StatsReporter
//     whose Stats does not fail with errors.ErrUnsupported; skipped
//     otherwise) counts 0 connections at first, n with n open, 0 again
//     once each was reported Closed, and refuses none under the default
//     bound.
//
// The StartRequest fields for HTTP (MaxConnections, HeaderTimeout, TLS,
// PageAuth) are left zero: what they do is HTTP's, not the
// contract's, so a transport that serves HTTP tests them itself (plugins/ws
// does).
//
// Across every check, the kit's event sink also fails the check on any
// event out of order: a second Opened with an id already used, a Frame
// before the host admitted the connection or after its Closed, a second
// Closed, and a connection with no Closed by the time Link returns after
// Stop.
func Run(t *testing.T, newTransport func(t *testing.T) contract.Transport, opts ...Option) {
	t.Helper()
	k := &kit{
		cfg: config{
			dial:   WebSocketDialer,
			listen: func(*testing.T) string { return "127.0.0.1:0" },
		},
		newTransport: newTransport,
	}
	for _, o := range opts {
		o(&k.cfg)
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) { c.run(t, k) })
	}
}

// check is one named subtest of Run.
type check struct {
	name string
	run  func(t *testing.T, k *kit)
}

// harness is one started and linked transport.
type harness struct {
	k       *kit
	tr      contract.Transport
	addr    string
	rec     *recorder
	cancel  context.CancelFunc
	linked  chan struct{} // closed when Link has returned
	linkErr error         // what Link returned; read after linked is closed
	stopped bool          // Stop was called; test goroutine only
}

// start starts a new transport with req (Listen defaults to the kit's) and
// links it. Cleanup stops it, waits for Link to return and checks the
// events.
func (k *kit) start(t *testing.T, req contract.StartRequest) *harness {
	t.Helper()
	tr := k.newTransport(t)
	if tr == nil {
		t.Fatal("newTransport returned nil")
	}
	if req.Listen == "" {
		req.Listen = k.cfg.listen(t)
	}
	req.Instance = "transporttest"
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	resp, err := tr.Start(ctx, req)
	if err != nil {
		t.Fatalf("Start(Listen %q): got error %v, want nil", req.Listen, err)
	}
	if resp.Addr == "" {
		t.Fatalf("Start(Listen %q): got an empty Addr", req.Listen)
	}
	h := &harness{k: k, tr: tr, addr: resp.Addr, rec: newRecorder(), linked: make(chan struct{})}
	lctx, lcancel := context.WithCancel(context.Background())
	h.cancel = lcancel
	go func() {
		defer close(h.linked)
		h.linkErr = tr.Link(lctx, h.rec.sink)
	}()
	t.Cleanup(func() {
		if !h.stopped {
			h.stop(t, contract.StopRequest{Code: wire.CloseGoingAway, Reason: "transporttest cleanup"})
		}
		h.cancel()
		<-h.linked
		h.rec.report(t)
	})
	return h
}

// stop stops the transport and waits for Link to return after Stop.
func (h *harness) stop(t *testing.T, req contract.StopRequest) {
	t.Helper()
	h.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := h.tr.Stop(ctx, req); err != nil {
		t.Errorf("Stop: got error %v, want nil", err)
	}
	select {
	case <-h.linked:
		if h.linkErr != nil && !errors.Is(h.linkErr, contract.ErrStopped) {
			t.Errorf("Link: returned %v after Stop, want nil", h.linkErr)
		}
	case <-time.After(waitTimeout):
		t.Errorf("Link: still running %v after Stop returned, want it to return once every Closed is delivered", waitTimeout)
		h.cancel()
		<-h.linked
	}
}

// client is a connection the kit dialed, with its connection id.
type client struct {
	ClientConn
	id    uint64
	query string
}

// dial connects a client and waits for its Opened event.
func (h *harness) dial(t *testing.T) *client {
	t.Helper()
	c, _ := h.dialOpened(t)
	return c
}

// dialOpened connects a client and returns it with its Opened event.
func (h *harness) dialOpened(t *testing.T) (*client, contract.Event) {
	t.Helper()
	query := fmt.Sprintf("transporttest=%d", h.k.queries.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	cc, err := h.k.cfg.dial.Dial(ctx, h.addr, Path, query)
	if err != nil {
		t.Fatalf("Dial(%s, %s?%s): %v", h.addr, Path, query, err)
	}
	t.Cleanup(func() { _ = cc.Drop() })
	ev := h.rec.waitOpened(t, query)
	return &client{ClientConn: cc, id: ev.Conn, query: query}, ev
}

// exec runs cmds and fails the test on an error.
func (h *harness) exec(t *testing.T, cmds ...contract.Command) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := h.tr.Exec(ctx, cmds); err != nil {
		t.Fatalf("Exec(%v): got error %v, want nil", kinds(cmds), err)
	}
}

// admit admits c; the recorder knows it before the transport does.
func (h *harness) admit(t *testing.T, c *client) {
	t.Helper()
	h.rec.markAdmitted(c.id)
	h.exec(t, contract.Command{Kind: contract.CommandAdmit, Conn: c.id})
}

func send(id uint64, m Message) contract.Command {
	return contract.Command{Kind: contract.CommandSend, Conn: id, Binary: m.Binary, Data: m.Data}
}

func closeCmd(id uint64, code int, reason string) contract.Command {
	return contract.Command{Kind: contract.CommandClose, Conn: id, Code: code, Reason: reason}
}

func kinds(cmds []contract.Command) []string {
	out := make([]string, 0, len(cmds))
	for _, c := range cmds {
		out = append(out, fmt.Sprintf("%v(%d)", c.Kind, c.Conn))
	}
	return out
}

// receive returns the next message of c, failing the test on an error.
func receive(t *testing.T, c *client) Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	m, err := c.Receive(ctx)
	if err != nil {
		t.Fatalf("client %d: Receive: got %v, want a message", c.id, err)
	}
	return m
}

// receiveClose reads c until the transport closes it and returns the
// close; messages before it are returned too.
func receiveClose(t *testing.T, c *client) ([]Message, *CloseError) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var msgs []Message
	for {
		m, err := c.Receive(ctx)
		if err == nil {
			msgs = append(msgs, m)
			continue
		}
		var ce *CloseError
		if !errors.As(err, &ce) {
			t.Fatalf("client %d: Receive: got %v, want the transport to close the connection", c.id, err)
		}
		return msgs, ce
	}
}

// recorder is the kit's EventSink: it keeps every event and checks the
// per-connection order as events arrive.
type recorder struct {
	mu       sync.Mutex // guards the fields below
	conns    map[uint64]*connLog
	order    []uint64 // connection ids in the order they were opened
	admitted map[uint64]bool
	problems []string
	changed  chan struct{} // closed and replaced after every batch
}

// connLog is what was reported about one connection.
type connLog struct {
	opened contract.Event
	frames []contract.Event
	closed *contract.Event
}

func newRecorder() *recorder {
	return &recorder{
		conns:    make(map[uint64]*connLog),
		admitted: make(map[uint64]bool),
		changed:  make(chan struct{}),
	}
}

func (r *recorder) sink(_ context.Context, evs []contract.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range evs {
		e.Data = bytes.Clone(e.Data)
		if e.Header != nil {
			e.Header = maps.Clone(e.Header)
		}
		c := r.conns[e.Conn]
		switch e.Kind {
		case contract.EventOpened:
			if c != nil {
				r.problemf("connection id %d reported Opened twice: ids must never be reused", e.Conn)
			}
			r.conns[e.Conn] = &connLog{opened: e}
			r.order = append(r.order, e.Conn)
		case contract.EventFrame:
			switch {
			case c == nil:
				r.problemf("connection %d: Frame before its Opened", e.Conn)
			case c.closed != nil:
				r.problemf("connection %d: Frame after its Closed", e.Conn)
			case !r.admitted[e.Conn]:
				r.problemf("connection %d: Frame %q before the host admitted the connection", e.Conn, clip(e.Data))
			}
			if c != nil {
				c.frames = append(c.frames, e)
			}
		case contract.EventClosed:
			switch {
			case c == nil:
				r.problemf("connection %d: Closed without an Opened", e.Conn)
			case c.closed != nil:
				r.problemf("connection %d: a second Closed (code %d, after %d)", e.Conn, e.Code, c.closed.Code)
			default:
				c.closed = &e
			}
		default:
			r.problemf("connection %d: event of unknown kind %v", e.Conn, e.Kind)
		}
	}
	close(r.changed)
	r.changed = make(chan struct{})
	return nil
}

func (r *recorder) problemf(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

func clip(p []byte) []byte {
	if len(p) > 40 {
		return p[:40]
	}
	return p
}

func (r *recorder) markAdmitted(id uint64) {
	r.mu.Lock()
	r.admitted[id] = true
	r.mu.Unlock()
}

// report fails t for every problem seen and every connection left without
// a Closed; it is called once Link has returned after Stop.
func (r *recorder) report(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.problems {
		t.Error(p)
	}
	for _, id := range r.order {
		if r.conns[id].closed == nil {
			t.Errorf("connection %d: no Closed event by the time Link returned after Stop", id)
		}
	}
}

// wait waits until cond, called with r.mu held, returns true.
func (r *recorder) wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	for {
		r.mu.Lock()
		ok, ch := cond(), r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("waiting for %s: nothing after %v", what, waitTimeout)
		}
	}
}

// waitOpened waits for the Opened event of the client that sent query.
func (r *recorder) waitOpened(t *testing.T, query string) contract.Event {
	t.Helper()
	var ev contract.Event
	r.wait(t, "the Opened event of the client with query "+query, func() bool {
		for _, id := range r.order {
			if c := r.conns[id]; c.opened.Query == query {
				ev = c.opened
				return true
			}
		}
		return false
	})
	return ev
}

// waitClosed waits for the Closed event of connection id.
func (r *recorder) waitClosed(t *testing.T, id uint64) contract.Event {
	t.Helper()
	var ev contract.Event
	r.wait(t, fmt.Sprintf("the Closed event of connection %d", id), func() bool {
		if c := r.conns[id]; c != nil && c.closed != nil {
			ev = *c.closed
			return true
		}
		return false
	})
	return ev
}

// waitFrames waits for n Frames of connection id and returns them.
func (r *recorder) waitFrames(t *testing.T, id uint64, n int) []contract.Event {
	t.Helper()
	var out []contract.Event
	r.wait(t, fmt.Sprintf("%d Frames of connection %d", n, id), func() bool {
		c := r.conns[id]
		if c == nil || len(c.frames) < n {
			return false
		}
		out = slices.Clone(c.frames)
		return true
	})
	return out
}

// closed reports whether connection id has been reported Closed.
func (r *recorder) closed(id uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.conns[id]
	return c != nil && c.closed != nil
}

// frames returns the Frames of connection id so far.
func (r *recorder) frames(id uint64) []contract.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.conns[id]; c != nil {
		return slices.Clone(c.frames)
	}
	return nil
}

// canonicalHeader reports the first header key that is not canonical.
func canonicalHeader(h map[string][]string) (string, bool) {
	for k := range h {
		if http.CanonicalHeaderKey(k) != k {
			return k, false
		}
	}
	return "", true
}
