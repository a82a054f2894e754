package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// reconnectOpts configure the reconnect-storm row (issue 17, goal 4).
type reconnectOpts struct {
	clients    []int         // clients per storm, one fresh host each
	words      int           // words per prompt (one message.delta each)
	delay      time.Duration // tether --echo-delay: the pause before each word
	killAfter  time.Duration // after every run is streaming, before the kill
	backoff    time.Duration // first backoff bound (full jitter)
	backoffMax time.Duration // backoff bound cap
	deadline   time.Duration // after the kill: every run's message.complete by then
	dialWait   time.Duration // client.Options.DialTimeout of a reconnect
}

// rcClient is one client of the storm: its stored key, its prompt, and
// every event it received, by where it came from.
type rcClient struct {
	idx    int
	key    string
	prompt string
	notify chan struct{} // poked on every live event

	mu sync.Mutex
	// ev is the first copy received of each seq; live counts the copies
	// of a seq pushed on any socket, since those in events.since replies.
	ev    map[uint64]wire.Event
	live  map[uint64]int
	since map[uint64]int
	// snapLatest is the latest_seq of the current socket's resume (0
	// before the kill); stale counts live events at or below it on that
	// socket (the protocol lets them come; they are dropped by seq).
	snapLatest  uint64
	stale       int
	overlap     int // in a since reply and pushed live too (expected)
	dupLive     int // one seq pushed live twice
	dupSince    int // a since reply held a seq ≤ last_seen, or twice
	complete    uint64
	completeAt  time.Time
	firstLive   time.Time // first live event on a resumed socket
	truncated   bool
	sinceErrs   []string
	resumeErrs  map[int]int
	otherErrs   []string
	dialFails   int
	drops       []string // sockets that ended after a successful resume
	resumes     int
	oldClosedAt time.Time // the pre-kill socket ended
	dialedAt    time.Time // first socket opened after the kill
	resumedAt   time.Time // first resume answered
	caughtUpAt  time.Time // first events.since answered
	completeAtK bool      // message.complete arrived before the kill
	// pushed counts the events pushed on the current socket; early the
	// events pushed on a resumed socket before its events.since answer
	// and past that answer's latest_seq (a client that rebuilds its
	// state from the answer and ignores what came before it loses
	// them); earlyComplete: message.complete was one of them.
	pushed        []uint64
	early         int
	earlyComplete bool
	// completeSince: message.complete came in an events.since answer
	// and at or below the resume's latest_seq: the run ended while the
	// client was away, so no socket will ever push it.
	completeSince bool
	sinceN        int              // events.since requests sent
	sinceAns      chan sinceAnswer // their answers, from the reader goroutine
}

// sinceAnswer is the answer to an events.since request sent raw, taken
// on the connection's reader goroutine in order with the events.
type sinceAnswer struct {
	id  string
	res wire.EventsSince
	err error
}

// onUnmatched takes the answer of a raw events.since request. It runs on
// the reader goroutine, so c.pushed holds exactly what the socket pushed
// before the answer.
func (c *rcClient) onUnmatched(frame []byte, _ bool) {
	m, err := wire.DecodeEnvelope(frame)
	if err != nil || !m.IsResponse() {
		return
	}
	var id string
	if json.Unmarshal(m.ID, &id) != nil || !strings.HasPrefix(id, "since-") {
		return
	}
	a := sinceAnswer{id: id}
	switch {
	case m.Error != nil:
		a.err = fmt.Errorf("events.since: rpc error %d: %s", m.Error.Code, m.Error.Message)
	default:
		a.err = json.Unmarshal(m.Result, &a.res)
	}
	if a.err == nil {
		c.mu.Lock()
		for _, p := range c.pushed {
			if p > a.res.LatestSeq {
				c.early++
				if p == c.complete {
					c.earlyComplete = true
				}
			}
		}
		c.mu.Unlock()
	}
	select {
	case c.sinceAns <- a:
	default:
	}
}

func newRCClient(i int, words int) *rcClient {
	var b strings.Builder
	for w := 0; w < words; w++ {
		if w > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "c%dw%d", i, w)
	}
	return &rcClient{idx: i, prompt: b.String(), notify: make(chan struct{}, 1), sinceAns: make(chan sinceAnswer, 1),
		ev: map[uint64]wire.Event{}, live: map[uint64]int{}, since: map[uint64]int{}, resumeErrs: map[int]int{}}
}

// onLive records an event pushed on a socket.
func (c *rcClient) onLive(e client.Event) {
	if e.Seq == 0 {
		return
	}
	c.mu.Lock()
	if c.live[e.Seq] > 0 {
		c.dupLive++
	}
	c.live[e.Seq]++
	c.pushed = append(c.pushed, e.Seq)
	if c.snapLatest > 0 && e.Seq <= c.snapLatest {
		c.stale++
	}
	if c.firstLive.IsZero() && c.snapLatest > 0 {
		c.firstLive = time.Now()
	}
	c.recordLocked(e.Event)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *rcClient) recordLocked(e wire.Event) {
	if _, ok := c.ev[e.Seq]; ok {
		return
	}
	c.ev[e.Seq] = e
	if e.Type == wire.EventMessageComplete && c.complete == 0 {
		c.complete = e.Seq
		c.completeAt = time.Now()
	}
}

// contiguousLocked is the highest seq n such that every seq 1..n was
// received: what a client sends as last_seen.
func (c *rcClient) contiguousLocked() uint64 {
	n := uint64(0)
	for {
		if _, ok := c.ev[n+1]; !ok {
			return n
		}
		n++
	}
}

// doneLocked: message.complete and everything before it received.
func (c *rcClient) doneLocked() bool {
	return c.complete > 0 && c.contiguousLocked() >= c.complete
}

// jitter is full-jitter exponential backoff: uniform in [0, min(max,
// base·2^attempt)).
func jitter(base, maxB time.Duration, attempt int) time.Duration {
	b := base << min(attempt, 20)
	if b > maxB || b <= 0 {
		b = maxB
	}
	return time.Duration(rand.Int64N(int64(b)) + 1)
}

// recover reconnects c after the kill until its run's message.complete
// and every event before it have arrived, or the deadline.
func (c *rcClient) recover(ctx context.Context, ts *server, o reconnectOpts, old *client.Conn) {
	select {
	case <-old.Done():
	case <-ctx.Done():
		return
	}
	c.mu.Lock()
	c.oldClosedAt = time.Now()
	done := c.doneLocked()
	if done {
		// The old socket pushed the run's end before it died: nothing
		// to recover.
		c.completeAtK = true
	}
	c.mu.Unlock()
	if done {
		return
	}
	attempt := 0
	for ctx.Err() == nil {
		t := time.NewTimer(jitter(o.backoff, o.backoffMax, attempt))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		attempt++
		conn, err := client.Dial(ctx, ts.baseURL(), client.Options{Token: ts.token, OnEvent: c.onLive, OnUnmatched: c.onUnmatched, DialTimeout: o.dialWait})
		if err != nil {
			c.mu.Lock()
			c.dialFails++
			c.mu.Unlock()
			continue
		}
		c.mu.Lock()
		if c.dialedAt.IsZero() {
			c.dialedAt = time.Now()
		}
		c.mu.Unlock()
		ok := c.resumeOn(ctx, conn)
		if !ok {
			conn.Abort()
			continue
		}
		// Resumed and caught up: read live events until the end.
		for {
			c.mu.Lock()
			done := c.doneLocked()
			c.mu.Unlock()
			if done {
				conn.Abort()
				return
			}
			select {
			case <-c.notify:
				continue
			case <-conn.Done():
			case <-ctx.Done():
				conn.Abort()
				return
			}
			break
		}
		c.mu.Lock()
		c.drops = append(c.drops, fmt.Sprint(conn.Err()))
		c.mu.Unlock()
		attempt = 0 // dropped after a resume: start the backoff again
	}
}

// resumeOn resumes c's key on conn and asks for the events since what c
// has; it reports whether both answered.
func (c *rcClient) resumeOn(ctx context.Context, conn *client.Conn) bool {
	c.mu.Lock()
	c.pushed = c.pushed[:0] // from now on: what this socket pushed
	c.mu.Unlock()
	snap, err := conn.Resume(ctx, wire.ResumeParams{SessionID: c.key})
	if err != nil {
		c.mu.Lock()
		if code := client.ErrorCode(err); code != 0 {
			c.resumeErrs[code]++
		} else {
			c.otherErrs = append(c.otherErrs, "resume: "+err.Error())
		}
		c.mu.Unlock()
		return false
	}
	c.mu.Lock()
	c.resumes++
	if c.resumedAt.IsZero() {
		c.resumedAt = time.Now()
	}
	// Events pushed on this socket from now on are compared with it; one
	// pushed before this line (between the resume's answer and here)
	// has seq > latest_seq anyway.
	c.snapLatest = max(snap.LatestSeq, 1)
	last := c.contiguousLocked()
	c.mu.Unlock()
	// Sent raw with a string id, so that its answer comes to onUnmatched
	// on the reader goroutine, in order with the events.
	c.mu.Lock()
	c.sinceN++
	id := fmt.Sprintf("since-%d", c.sinceN)
	c.mu.Unlock()
	req := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%q,"method":%q,"params":{"session_id":%q,"last_seen":%d}}`, id, wire.MethodEventsSince, snap.SessionID, last)
	var a sinceAnswer
	if err := conn.WriteRaw(ctx, req, false); err != nil {
		a.err = err
	} else {
		for a.id != id && a.err == nil {
			select {
			case a = <-c.sinceAns:
			case <-conn.Done():
				a.err = fmt.Errorf("events.since: %w", conn.Err())
			case <-ctx.Done():
				a.err = fmt.Errorf("events.since: %w", ctx.Err())
			}
		}
	}
	if a.err != nil {
		c.mu.Lock()
		c.sinceErrs = append(c.sinceErrs, a.err.Error())
		c.mu.Unlock()
		return false
	}
	r := a.res
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.Truncated {
		c.truncated = true
	}
	seen := map[uint64]bool{}
	for _, e := range r.Events {
		if e.Seq <= last || seen[e.Seq] {
			c.dupSince++
		}
		seen[e.Seq] = true
		c.since[e.Seq]++
		if e.Type == wire.EventMessageComplete && e.Seq <= c.snapLatest && c.live[e.Seq] == 0 {
			c.completeSince = true
		}
		if c.live[e.Seq] > 0 {
			c.overlap++
		}
		c.recordLocked(e)
	}
	if c.caughtUpAt.IsZero() {
		c.caughtUpAt = time.Now()
	}
	return true
}

// verdict classifies c once the storm is over: "" when it recovered
// with every event exactly once and the echo's text.
func (c *rcClient) verdict() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.completeAtK && c.resumes == 0:
		return "run ended before the old socket died"
	case c.resumes == 0 && len(c.resumeErrs) > 0:
		codes := make([]string, 0, len(c.resumeErrs))
		for code := range c.resumeErrs {
			codes = append(codes, fmt.Sprint(code))
		}
		sort.Strings(codes)
		return "resume error " + strings.Join(codes, "+")
	case c.resumes == 0:
		return "never reconnected"
	case len(c.sinceErrs) > 0 && c.caughtUpAt.IsZero():
		return "events.since error"
	case c.complete == 0:
		if c.contiguousLocked() < maxSeq(c.ev) {
			return "gap (no complete)"
		}
		return "no complete within deadline"
	}
	for s := uint64(1); s <= c.complete; s++ {
		if _, ok := c.ev[s]; !ok {
			return "gap"
		}
	}
	if c.dupLive > 0 || c.dupSince > 0 {
		return "duplicate"
	}
	if c.truncated {
		return "truncated"
	}
	// The run's text: the deltas after its message.start, in seq order,
	// and the complete's own text.
	var text strings.Builder
	started := false
	for s := uint64(1); s <= c.complete; s++ {
		e := c.ev[s]
		switch e.Type {
		case wire.EventMessageStart:
			started = true
			text.Reset()
		case wire.EventMessageDelta:
			var d struct{ Text string }
			_ = e.Decode(&d)
			text.WriteString(d.Text)
		}
	}
	var done struct{ Text, Status string }
	_ = c.ev[c.complete].Decode(&done)
	switch {
	case !started || text.String() != c.prompt:
		return "text of the deltas differs"
	case done.Text != c.prompt:
		return "text of message.complete differs"
	case done.Status != "complete":
		return "status " + done.Status
	}
	return ""
}

func maxSeq(m map[uint64]wire.Event) uint64 {
	var n uint64
	for s := range m {
		n = max(n, s)
	}
	return n
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func rowReconnect(cfg config, rep *report) error {
	var errs []error
	for _, n := range cfg.reconnect.clients {
		logf(cfg, "reconnect storm ×%d ...", n)
		if err := reconnectStorm(cfg, cfg.reconnect, n, rep); err != nil {
			errs = append(errs, fmt.Errorf("×%d: %w", n, err))
		}
		waitQuiet(cfg.waitQuiet)
	}
	rep.note("reconnect storm: each client its own session and run (tether --echo-delay %v), kill -9 of the WS plugin mid-run; each reconnects after full-jitter exponential backoff (%v doubling to %v), session.resume by its key, session.events.since(last contiguous seq), then reads live events; events are merged by seq", cfg.reconnect.delay, cfg.reconnect.backoff, cfg.reconnect.backoffMax)
	return errors.Join(errs...)
}

// listenOverflows is the kernel's count of connections dropped because
// a listen queue was full (TcpExt ListenOverflows in /proc/net/netstat):
// each such client waits for a retransmission, 1 s and then 2 s more.
func listenOverflows() int64 {
	b, err := os.ReadFile("/proc/net/netstat")
	if err != nil {
		return 0
	}
	lines := strings.Split(string(b), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || names[0] != "TcpExt:" || len(vals) != len(names) {
			continue
		}
		for j, n := range names {
			if n == "ListenOverflows" {
				v, _ := strconv.ParseInt(vals[j], 10, 64)
				return v
			}
		}
	}
	return 0
}
