package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// checks are Run's subtests, in order.
var checks = []check{
	{"Opened", checkOpened},
	{"ConnIDs", checkConnIDs},
	{"EventOrder", checkEventOrder},
	{"NoFrameBeforeAdmit", checkNoFrameBeforeAdmit},
	{"RefuseBeforeAdmit", checkRefuseBeforeAdmit},
	{"Send", checkSend},
	{"CloseAfterSend", checkCloseAfterSend},
	{"ClientClose", checkClientClose},
	{"Drop", checkDrop},
	{"Backpressure", checkBackpressure},
	{"HalfOpen", checkHalfOpen},
	{"Stop", checkStop},
	{"Restart", checkRestart},
	{"LinkTwice", checkLinkTwice},
	{"Stats", checkStats},
}

func text(s string) Message { return Message{Data: []byte(s)} }
func bin(p []byte) Message  { return Message{Binary: true, Data: p} }
func sameMessage(a, b Message) bool {
	return a.Binary == b.Binary && bytes.Equal(a.Data, b.Data)
}

func checkOpened(t *testing.T, k *kit) {
	h := k.start(t, contract.StartRequest{})
	c, ev := h.dialOpened(t)
	if ev.Path != Path {
		t.Errorf("Opened: got Path %q, want %q", ev.Path, Path)
	}
	if ev.Query != c.query {
		t.Errorf("Opened: got Query %q, want %q (the client's)", ev.Query, c.query)
	}
	if ev.Host != h.addr {
		t.Errorf("Opened: got Host %q, want %q, the address Start returned (the host's Host check compares them)", ev.Host, h.addr)
	}
	if ev.Remote == "" {
		t.Error("Opened: got an empty Remote")
	}
	if k, ok := canonicalHeader(ev.Header); !ok {
		t.Errorf("Opened: header key %q is not canonical", k)
	}
	if len(ev.Data) != 0 || ev.Code != 0 {
		t.Errorf("Opened: got Data %q and Code %d, want none", ev.Data, ev.Code)
	}
}

func checkConnIDs(t *testing.T, k *kit) {
	const n = 30
	h := k.start(t, contract.StartRequest{})
	seen := make(map[uint64]string)
	note := func(c *client, how string) {
		t.Helper()
		if prev, ok := seen[c.id]; ok {
			t.Fatalf("connection id %d given to a %s connection and again to a %s one", c.id, prev, how)
		}
		seen[c.id] = how
	}
	// One after another, each gone before the next: an allocator that
	// hands out the lowest free id fails here.
	for range n {
		c := h.dial(t)
		note(c, "sequential")
		h.admit(t, c)
		_ = c.Drop()
		h.rec.waitClosed(t, c.id)
	}
	// Many at once.
	clients := make([]*client, 0, n)
	for range n {
		c := h.dial(t)
		note(c, "concurrent")
		clients = append(clients, c)
	}
	for _, c := range clients {
		_ = c.Drop()
	}
}

func checkEventOrder(t *testing.T, k *kit) {
	const (
		conns = 8
		msgs  = 25
	)
	h := k.start(t, contract.StartRequest{})
	clients := make([]*client, conns)
	for i := range clients {
		clients[i] = h.dial(t)
		h.admit(t, clients[i])
	}
	want := func(i, j int) Message {
		m := text(fmt.Sprintf("client %d message %d", i, j))
		if k.has(Binary) && j%3 == 1 {
			m.Binary = true
		}
		return m
	}
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for i, c := range clients {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			defer cancel()
			for j := range msgs {
				if err := c.Send(ctx, want(i, j)); err != nil {
					errs[i] = fmt.Errorf("Send %d: %w", j, err)
					return
				}
			}
			if err := c.Close(ctx, wire.CloseNormal, "done"); err != nil {
				errs[i] = fmt.Errorf("Close: %w", err)
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	for i, c := range clients {
		closed := h.rec.waitClosed(t, c.id)
		frames := h.rec.frames(c.id)
		if len(frames) != msgs {
			t.Errorf("connection %d: got %d Frames before its Closed, want %d", c.id, len(frames), msgs)
			continue
		}
		for j, f := range frames {
			if got := (Message{Binary: f.Binary, Data: f.Data}); !sameMessage(got, want(i, j)) {
				t.Errorf("connection %d: Frame %d is %v, want %v", c.id, j, got, want(i, j))
			}
		}
		if k.has(CloseCodes) && (closed.Code != wire.CloseNormal || closed.Reason != "done") {
			t.Errorf("connection %d: Closed with %d %q, want 1000 %q", c.id, closed.Code, closed.Reason, "done")
		}
	}
}

func checkNoFrameBeforeAdmit(t *testing.T, k *kit) {
	h := k.start(t, contract.StartRequest{})
	early := h.dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for _, s := range []string{"early 1", "early 2"} {
		if err := early.Send(ctx, text(s)); err != nil {
			t.Fatalf("client: Send before admission: %v", err)
		}
	}
	// Round trips on another connection give a transport that reads too
	// soon the time to show it: each one needs the transport's own
	// goroutines to run, so a reader started too early has run too by
	// the last of them, however loaded the machine.
	other := h.dial(t)
	h.admit(t, other)
	const syncs = 20
	for i := range syncs {
		if err := other.Send(ctx, text(fmt.Sprint("sync ", i))); err != nil {
			t.Fatalf("client: Send: %v", err)
		}
		h.rec.waitFrames(t, other.id, i+1)
		if got := h.rec.frames(early.id); len(got) > 0 {
			t.Fatalf("got %d Frames of a connection never admitted, want none before CommandAdmit", len(got))
		}
	}

	h.admit(t, early)
	frames := h.rec.waitFrames(t, early.id, 2)
	for i, want := range []string{"early 1", "early 2"} {
		if string(frames[i].Data) != want || frames[i].Binary {
			t.Errorf("after admission: Frame %d is %q (binary %v), want text %q", i, frames[i].Data, frames[i].Binary, want)
		}
	}
}

func checkRefuseBeforeAdmit(t *testing.T, k *kit) {
	h := k.start(t, contract.StartRequest{})
	for _, code := range []int{wire.CloseUnauthorized, wire.CloseForbidden, wire.CloseNotFound, wire.CloseNotLoopback} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			c := h.dial(t)
			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			defer cancel()
			if err := c.Send(ctx, text("sent before the refusal")); err != nil {
				t.Fatalf("client: Send: %v", err)
			}
			reason := fmt.Sprintf("refused %d", code)
			h.exec(t, closeCmd(c.id, code, reason))
			msgs, ce := receiveClose(t, c)
			if len(msgs) > 0 {
				t.Errorf("client: got %d messages before the close, want none", len(msgs))
			}
			if k.has(CloseCodes) && (ce.Code != code || ce.Reason != reason) {
				t.Errorf("client: got close %d %q, want %d %q", ce.Code, ce.Reason, code, reason)
			}
			if e := h.rec.waitClosed(t, c.id); e.Code != code || e.Reason != reason {
				t.Errorf("Closed: got %d %q, want %d %q", e.Code, e.Reason, code, reason)
			}
			if n := len(h.rec.frames(c.id)); n > 0 {
				t.Errorf("got %d Frames of a refused connection, want none", n)
			}
		})
	}
}

// messages returns the messages Send and CloseAfterSend use, as far as
// the transport can carry them.
func (k *kit) messages() []Message {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	ms := []Message{
		text("hello"),
		text(""),
		text("héllo, wörld ✓"),
		text(strings.Repeat("0123456789", 10_000)),
		text(strings.Repeat("x", 1<<20)),
	}
	if k.has(MultilineText) {
		ms = append(ms, text("two\nlines\r\n"))
	}
	if k.has(Binary) {
		ms = append(ms, bin(all), bin(nil), bin(bytes.Repeat([]byte{0, 0xff}, 50_000)), bin([]byte("\n")))
	}
	// Interleave the kinds.
	var out []Message
	for i := range ms {
		if i%2 == 0 {
			out = append(out, ms[i/2])
		} else {
			out = append(out, ms[len(ms)-1-i/2])
		}
	}
	return out
}

func checkSend(t *testing.T, k *kit) {
	h := k.start(t, contract.StartRequest{})
	c := h.dial(t)
	h.admit(t, c)
	ms := k.messages()
	expect := func(how string) {
		t.Helper()
		for i, want := range ms {
			if got := receive(t, c); !sameMessage(got, want) {
				t.Fatalf("%s: message %d: got %v, want %v", how, i, got, want)
			}
		}
	}
	for _, m := range ms {
		h.exec(t, send(c.id, m))
	}
	expect("one Exec per message")
	batch := make([]contract.Command, 0, len(ms))
	for _, m := range ms {
		batch = append(batch, send(c.id, m))
	}
	h.exec(t, batch...)
	expect("one Exec for all")
}

func checkCloseAfterSend(t *testing.T, k *kit) {
	h := k.start(t, contract.StartRequest{})
	codes := []int{wire.CloseNormal, wire.CloseServiceRestart, wire.CloseSuperseded, wire.CloseProcessExited}
	for i, code := range codes {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			c := h.dial(t)
			h.admit(t, c)
			ms := []Message{text("first"), text(strings.Repeat("y", 200_000)), text("last")}
			if k.has(Binary) {
				ms[1] = bin(bytes.Repeat([]byte{7}, 200_000))
			}
			reason := fmt.Sprintf("closing with %d", code)
			cmds := []contract.Command{send(c.id, ms[0]), send(c.id, ms[1]), send(c.id, ms[2]), closeCmd(c.id, code, reason)}
			if i%2 == 0 {
				h.exec(t, cmds...)
			} else {
				for _, cmd := range cmds {
					h.exec(t, cmd)
				}
			}
			got, ce := receiveClose(t, c)
			if len(got) != len(ms) {
				t.Fatalf("client: got %d messages before the close, want the %d queued before it", len(got), len(ms))
			}
			for j := range ms {
				if !sameMessage(got[j], ms[j]) {
					t.Errorf("client: message %d is %v, want %v", j, got[j], ms[j])
				}
			}
			if k.has(CloseCodes) && (ce.Code != code || ce.Reason != reason) {
				t.Errorf("client: got close %d %q, want %d %q", ce.Code, ce.Reason, code, reason)
			}
			if e := h.rec.waitClosed(t, c.id); e.Code != code || e.Reason != reason {
				t.Errorf("Closed: got %d %q, want %d %q", e.Code, e.Reason, code, reason)
			}
			// Commands for a connection that is gone are ignored.
			h.exec(t, send(c.id, text("too late")), contract.Command{Kind: contract.CommandAdmit, Conn: c.id}, closeCmd(c.id, wire.CloseNormal, ""))
		})
	}
}

func checkClientClose(t *testing.T, k *kit) {
	h := k.start(t, contract.StartRequest{})
	for _, code := range []int{wire.CloseNormal, 4000} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			c := h.dial(t)
			h.admit(t, c)
			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			defer cancel()
			if err := c.Send(ctx, text("before closing")); err != nil {
				t.Fatalf("client: Send: %v", err)
			}
			if err := c.Close(ctx, code, "bye"); err != nil {
				t.Fatalf("client: Close: %v", err)
			}
			e := h.rec.waitClosed(t, c.id)
			if frames := h.rec.frames(c.id); len(frames) != 1 || string(frames[0].Data) != "before closing" {
				t.Errorf("got Frames %d, want the one message sent before the close", len(frames))
			}
			if k.has(CloseCodes) && (e.Code != code || e.Reason != "bye") {
				t.Errorf("Closed: got %d %q, want the client's %d %q", e.Code, e.Reason, code, "bye")
			}
		})
	}
}

func checkDrop(t *testing.T, k *kit) {
	h := k.start(t, contract.StartRequest{})
	t.Run("admitted", func(t *testing.T) {
		c := h.dial(t)
		h.admit(t, c)
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := c.Send(ctx, text("x")); err != nil {
			t.Fatalf("client: Send: %v", err)
		}
		h.rec.waitFrames(t, c.id, 1)
		_ = c.Drop()
		if e := h.rec.waitClosed(t, c.id); e.Code != wire.CloseAbnormal {
			t.Errorf("Closed: got %d %q, want 1006", e.Code, e.Reason)
		}
		h.exec(t, send(c.id, text("to nobody")), closeCmd(c.id, wire.CloseNormal, ""))
	})
	t.Run("pending", func(t *testing.T) {
		// A transport need not notice before admission; it must once
		// admitted.
		c := h.dial(t)
		_ = c.Drop()
		h.admit(t, c)
		if e := h.rec.waitClosed(t, c.id); e.Code != wire.CloseAbnormal {
			t.Errorf("Closed: got %d %q, want 1006", e.Code, e.Reason)
		}
	})
	t.Run("unknown connection", func(t *testing.T) {
		const never = 1 << 62
		h.exec(t, contract.Command{Kind: contract.CommandAdmit, Conn: never}, send(never, text("x")), closeCmd(never, wire.CloseNormal, ""))
	})
}

func checkBackpressure(t *testing.T, k *kit) {
	const (
		queue = 256 << 10
		size  = 16 << 10
		limit = 64 << 20 // bytes sent to the stalled client at most
	)
	h := k.start(t, contract.StartRequest{SendQueue: queue})
	msg := bytes.Repeat([]byte("z"), size)

	t.Run("reading client", func(t *testing.T) {
		c := h.dial(t)
		h.admit(t, c)
		for i := range 4 * queue / size {
			h.exec(t, send(c.id, text(string(msg))))
			if got := receive(t, c); len(got.Data) != size {
				t.Fatalf("message %d: got %d bytes, want %d", i, len(got.Data), size)
			}
		}
		if h.rec.closed(c.id) {
			t.Errorf("a client that keeps up was closed")
		}
	})

	t.Run("stalled client", func(t *testing.T) {
		c := h.dial(t) // never reads
		h.admit(t, c)
		// Bursts smaller than the queue, so that only a client that stops
		// reading can trip it.
		burst := make([]contract.Command, 0, queue/size/2)
		for range cap(burst) {
			burst = append(burst, send(c.id, text(string(msg))))
		}
		var slowest time.Duration
		sent := 0
		for sent < limit && !h.rec.closed(c.id) {
			start := time.Now()
			h.exec(t, burst...)
			slowest = max(slowest, time.Since(start))
			sent += len(burst) * size
		}
		e := h.rec.waitClosed(t, c.id)
		if e.Code != wire.CloseTryAgainLater {
			t.Errorf("Closed: got %d %q after %d bytes to a client that never reads, want 1013", e.Code, e.Reason, sent)
		}
		if slowest > time.Second {
			t.Errorf("the slowest Exec took %v, want Exec never to block on a peer", slowest)
		}
		t.Logf("closed with %d after %d bytes; slowest Exec %v", e.Code, sent, slowest)
	})
}

func checkHalfOpen(t *testing.T, k *kit) {
	k.require(t, HalfOpen)
	// Generous for a loaded machine: the answering peer must be scheduled
	// between pings and the peer timeout.
	const (
		ping    = 100 * time.Millisecond
		timeout = 750 * time.Millisecond
		watch   = 2 * timeout
	)
	h := k.start(t, contract.StartRequest{PingInterval: ping, PeerTimeout: timeout})
	start := time.Now()
	dead := h.dial(t) // never reads, so never answers a ping
	live := h.dial(t)
	h.admit(t, dead)
	h.admit(t, live)

	// The live client answers pings for two peer timeouts.
	ctx, cancel := context.WithTimeout(context.Background(), watch)
	defer cancel()
	type result struct {
		m   Message
		err error
	}
	got := make(chan result, 1)
	go func() {
		m, err := live.Receive(ctx)
		got <- result{m, err}
	}()

	e := h.rec.waitClosed(t, dead.id)
	if e.Code != wire.CloseAbnormal {
		t.Errorf("silent peer: Closed with %d %q, want 1006", e.Code, e.Reason)
	}
	if d := time.Since(start); d < timeout {
		t.Errorf("silent peer: closed after %v, want no sooner than PeerTimeout %v", d, timeout)
	}

	r := <-got
	if !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("answering peer: Receive got %v %v, want nothing for %v", r.m, r.err, watch)
	}
	if h.rec.closed(live.id) {
		t.Fatalf("a peer answering pings was closed")
	}
	sctx, scancel := context.WithTimeout(context.Background(), waitTimeout)
	defer scancel()
	if err := live.Send(sctx, text("still here")); err != nil {
		t.Fatalf("answering peer: Send: %v", err)
	}
	if f := h.rec.waitFrames(t, live.id, 1); string(f[0].Data) != "still here" {
		t.Errorf("answering peer: got Frame %q, want %q", f[0].Data, "still here")
	}
}

func checkStop(t *testing.T, k *kit) {
	h := k.start(t, contract.StartRequest{})
	a, b, pending := h.dial(t), h.dial(t), h.dial(t)
	h.admit(t, a)
	h.admit(t, b)
	h.exec(t, send(a.id, text("last words")))
	// Stop is not ordered with the commands of Exec (over gRPC they
	// travel on the link stream, Stop on a call of its own): once b has
	// the message sent after a's, a's message was applied.
	h.exec(t, send(b.id, text("barrier")))
	if m := receive(t, b); string(m.Data) != "barrier" {
		t.Fatalf("client %d: got %v, want the barrier message", b.id, m)
	}

	clients := []*client{a, b, pending}
	results := make([]<-chan readResult, len(clients))
	for i, c := range clients {
		results[i] = readAll(c)
	}

	const reason = "transport swapped"
	h.stop(t, contract.StopRequest{Code: wire.CloseServiceRestart, Reason: reason})
	// Link has returned: every Closed must be there.
	for _, c := range clients {
		if !h.rec.closed(c.id) {
			t.Errorf("connection %d: no Closed delivered before Link returned after Stop", c.id)
			continue
		}
		if e := h.rec.waitClosed(t, c.id); e.Code != wire.CloseServiceRestart {
			t.Errorf("connection %d: Closed with %d %q, want 1012 %q", c.id, e.Code, e.Reason, reason)
		}
	}
	for i, c := range clients {
		r := <-results[i]
		var ce *CloseError
		if !errors.As(r.err, &ce) {
			t.Errorf("client %d: Receive got %v, want the connection closed", c.id, r.err)
			continue
		}
		if k.has(CloseCodes) && ce.Code != wire.CloseServiceRestart {
			t.Errorf("client %d: got close %d %q, want 1012", c.id, ce.Code, ce.Reason)
		}
		if c == a && (len(r.msgs) != 1 || string(r.msgs[0].Data) != "last words") {
			t.Errorf("client %d: got %v before the close, want the message queued before Stop", c.id, r.msgs)
		}
	}

	// The listener is gone.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	cc, err := k.cfg.dial.Dial(ctx, h.addr, Path, "after=stop")
	if err == nil {
		defer cc.Drop()
		if m, err := cc.Receive(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("dial after Stop: connected and got %v %v, want the listener closed", m, err)
		}
	}
}

// readResult is what readAll read.
type readResult struct {
	msgs []Message
	err  error // the error that ended it: a *CloseError, or a failure
}

// readAll reads c in a goroutine of its own until Receive fails, so that
// c answers pings and close handshakes meanwhile.
func readAll(c *client) <-chan readResult {
	done := make(chan readResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		var r readResult
		for {
			m, err := c.Receive(ctx)
			if err != nil {
				r.err = err
				break
			}
			r.msgs = append(r.msgs, m)
		}
		done <- r
	}()
	return done
}

func checkRestart(t *testing.T, k *kit) {
	first := k.start(t, contract.StartRequest{})
	c := first.dial(t)
	first.admit(t, c)
	read := readAll(c)
	first.stop(t, contract.StopRequest{Code: wire.CloseServiceRestart, Reason: "restart"})
	if r := <-read; !errors.As(r.err, new(*CloseError)) {
		t.Errorf("client: Receive got %v, want the connection closed by Stop", r.err)
	}
	if e := first.rec.waitClosed(t, c.id); e.Code != wire.CloseServiceRestart {
		t.Errorf("Closed: got %d, want 1012", e.Code)
	}

	second := k.start(t, contract.StartRequest{Listen: first.addr})
	if second.addr != first.addr {
		t.Errorf("Start(Listen %q) on the stopped transport's address: bound %q", first.addr, second.addr)
	}
	ids := make(map[uint64]bool)
	for range 3 {
		c := second.dial(t)
		if ids[c.id] {
			t.Fatalf("connection id %d given twice", c.id)
		}
		ids[c.id] = true
		second.admit(t, c)
		second.exec(t, send(c.id, text("on the new transport")))
		if m := receive(t, c); string(m.Data) != "on the new transport" {
			t.Errorf("client: got %v, want the message", m)
		}
	}
}

func checkLinkTwice(t *testing.T, k *kit) {
	h := k.start(t, contract.StartRequest{})
	h.dial(t) // the first link is up
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	err := h.tr.Link(ctx, func(context.Context, []contract.Event) error {
		return errors.New("the second link's sink must not be called")
	})
	if !errors.Is(err, contract.ErrAlreadyLinked) {
		t.Errorf("second Link: got %v, want contract.ErrAlreadyLinked", err)
	}
	c := h.dial(t)
	h.admit(t, c)
	h.exec(t, send(c.id, text("first link still works")))
	if m := receive(t, c); string(m.Data) != "first link still works" {
		t.Errorf("client: got %v, want the message", m)
	}
}

func checkStats(t *testing.T, k *kit) {
	const n = 5
	h := k.start(t, contract.StartRequest{})
	sr, ok := h.tr.(contract.StatsReporter)
	if !ok {
		t.Skip("the transport reports no counters: it is not a contract.StatsReporter")
	}
	stats := func(when string) contract.TransportStats {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		st, err := sr.Stats(ctx)
		if errors.Is(err, errors.ErrUnsupported) {
			t.Skipf("the transport reports no counters: %v", err)
		}
		if err != nil {
			t.Fatalf("Stats %s: got error %v, want nil", when, err)
		}
		return st
	}
	if st := stats("before any connection"); st.Connections != 0 || st.Refused503 != 0 {
		t.Errorf("Stats before any connection: got %+v, want zero", st)
	}
	clients := make([]*client, 0, n)
	for range n {
		c := h.dial(t)
		h.admit(t, c)
		clients = append(clients, c)
	}
	if st := stats("with 5 open"); st.Connections != n {
		t.Errorf("Stats after %d Opened: got %d connections, want %d", n, st.Connections, n)
	}
	for _, c := range clients {
		_ = c.Drop()
		h.rec.waitClosed(t, c.id)
	}
	if st := stats("after every Closed"); st.Connections != 0 || st.Refused503 != 0 {
		t.Errorf("Stats after every Closed: got %+v, want zero (nothing refused under the bound)", st)
	}
}
