package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// rcStorm is one storm of the reconnect-storm row: its host and clients.
type rcStorm struct {
	cfg   config
	o     reconnectOpts
	ts    *server
	cs    []*rcClient
	conns []*client.Conn // each client's first socket
	sids  []string
	// submitted counts the answers to the submits released at once:
	// "served", or the error code.
	submitted map[string]int
}

// rcTimes are the storm's phases, for its report.
type rcTimes struct {
	created, setup time.Duration // from the start of the set-up: all created, all submitted
	killAt         time.Time
	total          time.Duration // kill → every client done
	health         time.Duration // kill → the new plugin's /healthz 200; 0: never
	overflows      int64         // listen queue overflows during the recovery
	inFlight       int           // runs whose end the old socket did not push
}

// reconnectStorm runs one storm of n clients on a fresh host and reports
// it.
func reconnectStorm(cfg config, o reconnectOpts, n int, rep *report) error {
	ts, err := startTether(cfg.bin, tetherOpts{extra: []string{"--echo-delay", o.delay.String()}})
	if err != nil {
		return err
	}
	defer ts.stop()
	if f := os.Getenv("TETHERBENCH_STDERR"); f != "" {
		defer func() { _ = os.WriteFile(f, []byte(ts.stderr.all()), 0o644) }()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	st := &rcStorm{cfg: cfg, o: o, ts: ts, cs: make([]*rcClient, n), conns: make([]*client.Conn, n), sids: make([]string, n)}
	for i := range st.cs {
		st.cs[i] = newRCClient(i, o.words)
	}
	var t rcTimes
	t.created, t.setup, err = st.setUp(ctx)
	if err == nil {
		err = st.waitStreaming(time.Now().Add(-t.setup))
	}
	if err != nil {
		st.abortAll()
		return err
	}
	time.Sleep(o.killAfter)
	if err := st.killAndRecover(ctx, &t); err != nil {
		st.abortAll()
		return err
	}
	st.report(rep, t)
	return nil
}

// abortAll closes every client's first socket.
func (st *rcStorm) abortAll() {
	for _, c := range st.conns {
		if c != nil {
			c.Abort()
		}
	}
}

// phase runs fn for every client, 64 at a time, and returns the first
// error.
func (st *rcStorm) phase(what string, fn func(i int, c *rcClient) error) error {
	var (
		wg      sync.WaitGroup
		errMu   sync.Mutex
		firstEr error
		sem     = make(chan struct{}, 64)
	)
	for i := range st.cs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(i, st.cs[i]); err != nil {
				errMu.Lock()
				if firstEr == nil {
					firstEr = fmt.Errorf("client %d %s: %w", i, what, err)
				}
				errMu.Unlock()
			}
		}()
	}
	wg.Wait()
	return firstEr
}

// setUp has every client dial and create its session, then (in a second
// phase, so that every run starts within it) submit its prompt. It
// returns when the creates and the submits were done.
func (st *rcStorm) setUp(ctx context.Context) (created, setup time.Duration, err error) {
	t0 := time.Now()
	err = st.phase("create", func(i int, c *rcClient) error {
		conn, err := client.Dial(ctx, st.ts.baseURL(), client.Options{Token: st.ts.token, OnEvent: c.onLive})
		if err != nil {
			return err
		}
		st.conns[i] = conn
		snap, err := conn.Create(ctx, wire.CreateParams{Title: fmt.Sprintf("storm-%d", i)})
		c.key, st.sids[i] = snap.SessionKey, snap.SessionID
		return err
	})
	created = time.Since(t0)
	if err == nil {
		err = st.submitAtOnce(ctx)
	}
	return created, time.Since(t0), err
}

// submitAtOnce has every client submit its prompt at the same instant
// (as an outside harness does; the client library retries a 5003 after
// its retry_after_ms) and fails, with the count of each answer, unless
// every one was served.
func (st *rcStorm) submitAtOnce(ctx context.Context) error {
	var (
		wg      sync.WaitGroup
		release = make(chan struct{})
		mu      sync.Mutex
		answers = map[string]int{}
		first   error
	)
	for i, c := range st.cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			_, err := st.conns[i].Submit(ctx, st.sids[i], c.prompt)
			what := "served"
			if err != nil {
				what = "error"
				var re *client.Error
				if errors.As(err, &re) {
					what = fmt.Sprint(re.Code)
				}
			}
			mu.Lock()
			answers[what]++
			if err != nil && first == nil {
				first = fmt.Errorf("client %d submit: %w", i, err)
			}
			mu.Unlock()
		}()
	}
	t0 := time.Now()
	close(release)
	wg.Wait()
	st.submitted = answers
	logf(st.cfg, "reconnect storm ×%d: %d submits released at once, answered in %v: %v", len(st.cs), len(st.cs), time.Since(t0).Round(time.Millisecond), answers)
	if first != nil {
		return fmt.Errorf("%w (answers: %v)", first, answers)
	}
	return nil
}

// waitStreaming waits until every run streams (its start and one delta
// received), for up to 2 minutes after t0.
func (st *rcStorm) waitStreaming(t0 time.Time) error {
	for {
		streaming := 0
		for _, c := range st.cs {
			c.mu.Lock()
			if len(c.ev) >= 2 {
				streaming++
			}
			c.mu.Unlock()
		}
		if streaming == len(st.cs) {
			return nil
		}
		if time.Since(t0) > 2*time.Minute {
			return fmt.Errorf("only %d of %d runs streaming 2 min after the set-up began", streaming, len(st.cs))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killAndRecover kills the WS plugin and has every client recover within
// the deadline; it fills in t from the kill on.
func (st *rcStorm) killAndRecover(ctx context.Context, t *rcTimes) error {
	cfg, o, ts := st.cfg, st.o, st.ts
	pid, err := pluginPID(ts.pid(), "ws")
	if err != nil {
		return err
	}
	for _, c := range st.cs {
		c.mu.Lock()
		c.completeAtK = c.complete > 0
		c.mu.Unlock()
	}
	rctx, rcancel := context.WithTimeout(ctx, o.deadline)
	defer rcancel()
	// TETHERBENCH_RECONNECT_PERF=FILE: perf record -a -g of the 8 s from
	// the kill, for where the time goes.
	if f := os.Getenv("TETHERBENCH_RECONNECT_PERF"); f != "" {
		perf := exec.Command("perf", "record", "-a", "-g", "-q", "-o", f, "--", "sleep", "8")
		if err := perf.Start(); err != nil {
			logf(cfg, "perf: %v", err)
		} else {
			defer func() { _ = perf.Wait() }()
		}
	}
	overflowsBefore := listenOverflows()
	killAt := time.Now()
	logf(cfg, "killing the WS plugin (pid %d) at %s", pid, killAt.UTC().Format("15:04:05.000"))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	// The transport's own way back: /healthz polled every pollEvery.
	var healthAt atomic.Int64
	go func() {
		hc := &http.Client{Timeout: 200 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
		for rctx.Err() == nil {
			if _, err := pluginPID(ts.pid(), "ws"); err == nil && healthy(hc, ts.addr) {
				if p, _ := pluginPID(ts.pid(), "ws"); p != pid {
					healthAt.Store(int64(time.Since(killAt)))
					return
				}
			}
			time.Sleep(pollEvery)
		}
	}()
	var wg sync.WaitGroup
	for i, c := range st.cs {
		wg.Go(func() { c.recover(rctx, ts, o, st.conns[i]) })
	}
	wg.Wait()
	t.killAt = killAt
	t.total = time.Since(killAt)
	t.overflows = listenOverflows() - overflowsBefore
	t.health = time.Duration(healthAt.Load())
	for _, c := range st.cs {
		c.mu.Lock()
		if !c.completeAtK {
			t.inFlight++
		}
		c.mu.Unlock()
	}
	return nil
}

// rcTally is what the storm's clients saw, added up.
type rcTally struct {
	recovered int
	classes   map[string]int // failures by verdict
	examples  []string       // up to 10 failed clients, described
	dropCodes map[string]int

	resumed, closedLat, dialLat, resumeLat, sinceLat, completeLat, firstLiveLat []float64 // ms from the kill

	stale, overlap, dialFails, extraResumes, early, earlyClients, earlyComplete, completeSince int
}

// tally adds up the clients' verdicts and times after the kill at killAt.
func (st *rcStorm) tally(killAt time.Time) rcTally {
	y := rcTally{classes: map[string]int{}, dropCodes: map[string]int{}}
	for _, c := range st.cs {
		v := c.verdict()
		c.mu.Lock()
		switch v {
		case "":
			y.recovered++
		case "run ended before the old socket died":
			y.classes[v]++
		default:
			y.classes[v]++
			if len(y.examples) < 10 {
				have := c.contiguousLocked()
				y.examples = append(y.examples, fmt.Sprintf("client %d key %s: %s; contiguous to %d, highest %d, complete seq %d, resumes %d, snapshot latest_seq %d, drops %v, resume errors %v, since errors %v, other %v",
					c.idx, c.key, v, have, maxSeq(c.ev), c.complete, c.resumes, c.snapLatest, c.drops, c.resumeErrs, c.sinceErrs, c.otherErrs))
			}
		}
		y.stale += c.stale
		y.early += c.early
		if c.early > 0 {
			y.earlyClients++
		}
		if c.completeSince {
			y.completeSince++
		}
		if c.earlyComplete {
			y.earlyComplete++
		}
		y.overlap += c.overlap
		y.dialFails += c.dialFails
		y.extraResumes += max(c.resumes-1, 0)
		for _, d := range c.drops {
			y.dropCodes[d]++
		}
		since := func(t time.Time, into *[]float64) {
			if !t.IsZero() {
				*into = append(*into, ms(t.Sub(killAt)))
			}
		}
		since(c.oldClosedAt, &y.closedLat)
		since(c.dialedAt, &y.dialLat)
		since(c.resumedAt, &y.resumeLat)
		since(c.caughtUpAt, &y.sinceLat)
		since(c.firstLive, &y.firstLiveLat)
		if !c.completeAtK {
			since(c.completeAt, &y.completeLat)
		}
		if !c.resumedAt.IsZero() {
			y.resumed = append(y.resumed, ms(c.resumedAt.Sub(killAt)))
		}
		c.mu.Unlock()
	}
	return y
}

// report adds the storm's rows and notes to rep.
func (st *rcStorm) report(rep *report, t rcTimes) {
	o, n := st.o, len(st.cs)
	y := st.tally(t.killAt)
	runFor := time.Duration(o.words) * o.delay
	row := fmt.Sprintf("reconnect storm ×%d", n)
	pct := func(xs []float64) string {
		if len(xs) == 0 {
			return "—"
		}
		return fmt.Sprintf("p50 %s, p99 %s, max %s ms (%d)", num(percentile(xs, .5)), num(percentile(xs, .99)), num(percentile(xs, 1)), len(xs))
	}
	rep.add(result{row: row, metric: "recovered (every seq once, echo text) / runs in flight", tether: fmt.Sprintf("%d/%d", y.recovered, t.inFlight), target: "100 %", met: yesNo(y.recovered == t.inFlight), n: 1})
	p99 := percentile(y.resumed, .99)
	rep.add(result{row: row, metric: "kill → resumed p99", tether: fmt.Sprintf("%s ms", num(p99)), target: "≤ 2000 ms", met: yesNo(len(y.resumed) == t.inFlight && p99 <= 2000), n: 1})
	rep.add(result{row: row, metric: "kill → resumed", tether: pct(y.resumeLat), n: 1})
	rep.add(result{row: row, metric: "kill → events.since answered", tether: pct(y.sinceLat), n: 1})
	rep.add(result{row: row, metric: "kill → message.complete", tether: pct(y.completeLat), n: 1})
	rep.add(result{row: row, metric: "kill → old socket ended", tether: pct(y.closedLat), n: 1})
	rep.add(result{row: row, metric: "kill → first socket open", tether: pct(y.dialLat), n: 1})
	rep.add(result{row: row, metric: "kill → first live event after resume", tether: pct(y.firstLiveLat), n: 1})
	h := "never"
	if t.health > 0 {
		h = fmt.Sprintf("%s ms", num(ms(t.health)))
	}
	rep.add(result{row: row, metric: "kill → new plugin's /healthz 200", tether: h, n: 1})
	rep.add(result{row: row, metric: "listen queue overflows (TcpExt ListenOverflows)", tether: fmt.Sprint(t.overflows), n: 1})
	var cl []string
	for k, v := range y.classes {
		cl = append(cl, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(cl)
	var dc []string
	for k, v := range y.dropCodes {
		dc = append(dc, fmt.Sprintf("%q ×%d", k, v))
	}
	sort.Strings(dc)
	rep.note("%s: set-up: dial and create %v, then every submit released at once, all answered in %v; %d words × %v per run (%v); %d runs in flight (their end not pushed on the old socket); deadline %v after the kill, all done after %v",
		row, t.created.Round(time.Millisecond), (t.setup - t.created).Round(time.Millisecond), o.words, o.delay, runFor, t.inFlight, o.deadline, t.total.Round(time.Millisecond))
	rep.note("%s: failures by class: %s", row, orNone(strings.Join(cl, ", ")))
	var sub []string
	for k, v := range st.submitted {
		sub = append(sub, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(sub)
	rep.add(result{row: row, metric: "submits released at once: answers (5003s retried by the client)", tether: strings.Join(sub, ", "), target: "every one served, 0 × 5000", met: yesNo(st.submitted["served"] == n), n: 1})
	if t.inFlight < n {
		rep.note("%s: only %d of %d runs were in flight: the set-up took longer than a run (lengthen -reconnect-words or -reconnect-delay to test them all)", row, t.inFlight, n)
	}
	rep.note("%s: failed dials %d; sockets dropped after a resume %d (%s); resumes beyond the first %d; stale live events (seq ≤ latest_seq, dropped) %d; events both in events.since and pushed (dropped by seq) %d",
		row, y.dialFails, len(dc), orNone(strings.Join(dc, ", ")), y.extraResumes, y.stale, y.overlap)
	rep.note("%s: events pushed on a resumed socket before its events.since answer with seq past that answer's latest_seq: %d, at %d clients; message.complete among them at %d clients (a client that drops what arrives before the answer, or resets to the answer's latest_seq, loses exactly these)",
		row, y.early, y.earlyClients, y.earlyComplete)
	rep.note("%s: runs that ended while their client was away (message.complete only in the events.since answer, seq ≤ the resume's latest_seq; a client that waits for it to be pushed waits forever): %d", row, y.completeSince)
	for _, e := range y.examples {
		rep.note("%s: %s", row, e)
	}
}
