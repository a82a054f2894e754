package main

// The fan-out row (issue 17, goal 4): one session, N viewers, one run of
// W message.delta events. Each viewer stamps every delta on its reader
// goroutine; a delta's offset at a viewer is its arrival there minus its
// earliest arrival at any viewer. The baseline is a direct gobwas/ws
// fan-out (`tetherbench helper fanout`) read by the same client code.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// fanoutOpts are the row's flags.
type fanoutOpts struct {
	viewers []int
	words   int
	delay   time.Duration
}

// fanViewer is what one viewer saw during one run.
type fanViewer struct {
	mu       sync.Mutex
	deltas   map[uint64]time.Time // delta seq -> arrival
	complete bool
	events   int // every event with a seq (delivered events)
}

func (v *fanViewer) reset() {
	v.mu.Lock()
	v.deltas, v.complete, v.events = map[uint64]time.Time{}, false, 0
	v.mu.Unlock()
}

func (v *fanViewer) onEvent(e client.Event) {
	now := time.Now()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.deltas == nil || e.Seq == 0 {
		return
	}
	v.events++
	switch e.Type {
	case wire.EventMessageDelta:
		if _, ok := v.deltas[e.Seq]; !ok {
			v.deltas[e.Seq] = now
		}
	case wire.EventMessageComplete:
		v.complete = true
	}
}

func (v *fanViewer) done(words int) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.complete && len(v.deltas) >= words
}

// fanResult is one run's offsets and completeness.
type fanResult struct {
	offsets  []float64 // ms, one per (viewer, delta)
	complete int       // viewers with every delta and the message.complete
	events   int       // events delivered to all viewers
}

// fanTally computes the offsets of a run from what the viewers saw.
func fanTally(vs []*fanViewer, words int) fanResult {
	first := map[uint64]time.Time{}
	var r fanResult
	for _, v := range vs {
		v.mu.Lock()
		for seq, t := range v.deltas {
			if f, ok := first[seq]; !ok || t.Before(f) {
				first[seq] = t
			}
		}
		if v.complete && len(v.deltas) == words {
			r.complete++
		}
		r.events += v.events
		v.mu.Unlock()
	}
	for _, v := range vs {
		v.mu.Lock()
		for seq, t := range v.deltas {
			r.offsets = append(r.offsets, ms(t.Sub(first[seq])))
		}
		v.mu.Unlock()
	}
	return r
}

// waitFan waits until every viewer has its run whole, or until d.
func waitFan(vs []*fanViewer, words int, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		all := true
		for _, v := range vs {
			if !v.done(words) {
				all = false
				break
			}
		}
		if all {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dialViewers opens n JSON-RPC sockets to url, 32 at a time, each with
// its own viewer.
func dialViewers(ctx context.Context, base, token string, n int) ([]*client.Conn, []*fanViewer, error) {
	conns := make([]*client.Conn, n)
	vs := make([]*fanViewer, n)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, 32)
	)
	for i := range conns {
		vs[i] = &fanViewer{}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := client.Dial(ctx, base, client.Options{Token: token, OnEvent: vs[i].onEvent})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = err
				}
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	if first != nil {
		abortConns(conns)
		return nil, nil, first
	}
	return conns, vs, nil
}

func abortConns(cs []*client.Conn) {
	for _, c := range cs {
		if c != nil {
			c.Abort()
		}
	}
}

// fanPrompt is a prompt of w words (the echo agent streams one delta
// per word).
func fanPrompt(rep, w int) string {
	words := make([]string, w)
	for i := range words {
		words[i] = fmt.Sprintf("r%dw%d", rep, i)
	}
	return strings.Join(words, " ")
}

func rowFanout(cfg config, rep *report) error {
	for _, n := range cfg.fanout.viewers {
		if err := fanout(cfg, cfg.fanout, n, rep); err != nil {
			return fmt.Errorf("×%d: %w", n, err)
		}
	}
	rep.note("fan-out: one session (tether --echo-delay %v), N sockets session.resume its key, one more submits a %d-word prompt; offset = a delta's arrival at a viewer minus its earliest arrival at any viewer, over every (viewer, delta) pair of a run; one warm-up run first, not measured; baseline: a direct gobwas/ws fan-out process writing the same %d event frames to every socket in turn, read by the same client; CPU per event delivered to a viewer (every event with a seq)",
		cfg.fanout.delay, cfg.fanout.words, cfg.fanout.words)
	return nil
}

func fanout(cfg config, o fanoutOpts, n int, rep *report) error {
	ts, err := startTether(cfg.bin, tetherOpts{extra: []string{"--echo-delay", o.delay.String()}})
	if err != nil {
		return err
	}
	defer ts.stop()
	base, err := startHelper("fanout")
	if err != nil {
		return err
	}
	defer base.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	fr := &fanRun{ctx: ctx, o: o, n: n, ts: ts, base: base, wait: time.Duration(o.words)*o.delay + 30*time.Second}
	defer fr.close()
	if err := fr.setUp(); err != nil {
		return err
	}

	// One warm-up run of each, not measured.
	if _, _, err := fr.runT(-1); err != nil {
		return err
	}
	if _, _, err := fr.runB(); err != nil {
		return err
	}
	var t50, t99, tmax, b50, b99, bmax, r50, r99 sample
	var tCPU, bCPU = map[string]cpuTime{}, map[string]cpuTime{}
	tEvents, bEvents := 0, 0
	completeAll, worstP99 := true, 0.0
	var completes, bcompletes []string
	for r := 0; r < cfg.n; r++ {
		tr, tc, err := fr.runT(r)
		if err != nil {
			return err
		}
		br, bc, err := fr.runB()
		if err != nil {
			return err
		}
		addCPU(tCPU, tc)
		addCPU(bCPU, bc)
		tEvents += tr.events
		bEvents += br.events
		if len(tr.offsets) == 0 || len(br.offsets) == 0 {
			return fmt.Errorf("rep %d: no deltas arrived (tether %d, baseline %d offsets)", r, len(tr.offsets), len(br.offsets))
		}
		t50.add(percentile(tr.offsets, .5))
		t99.add(percentile(tr.offsets, .99))
		tmax.add(percentile(tr.offsets, 1))
		b50.add(percentile(br.offsets, .5))
		b99.add(percentile(br.offsets, .99))
		bmax.add(percentile(br.offsets, 1))
		r50.add(percentile(tr.offsets, .5) / percentile(br.offsets, .5))
		r99.add(percentile(tr.offsets, .99) / percentile(br.offsets, .99))
		worstP99 = max(worstP99, percentile(tr.offsets, .99))
		completeAll = completeAll && tr.complete == n
		completes = append(completes, strconv.Itoa(tr.complete))
		bcompletes = append(bcompletes, strconv.Itoa(br.complete))
		logf(cfg, "fanout ×%d rep %d: tether p50 %.2fms p99 %.2fms max %.2fms complete %d/%d; baseline p50 %.2fms p99 %.2fms max %.2fms complete %d/%d",
			n, r, percentile(tr.offsets, .5), percentile(tr.offsets, .99), percentile(tr.offsets, 1), tr.complete, n,
			percentile(br.offsets, .5), percentile(br.offsets, .99), percentile(br.offsets, 1), br.complete, n)
	}
	row := fmt.Sprintf("fan-out ×%d", n)
	if cfg.perfDir != "" {
		if err := fr.profile(cfg, rep, row); err != nil {
			return fmt.Errorf("profiled run: %w", err)
		}
	}
	rep.add(result{row: row, metric: "offset p50", tether: t50.cell("ms"), baseline: b50.cell("ms"), ratio: r50.cell("×"), n: cfg.n})
	rep.add(result{row: row, metric: "offset p99", tether: t99.cell("ms"), baseline: b99.cell("ms"), ratio: r99.cell("×"),
		target: "≤ 50 ms every run", met: yesNo(worstP99 <= 50), n: cfg.n})
	rep.add(result{row: row, metric: "offset max", tether: tmax.cell("ms"), baseline: bmax.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "viewers complete per run", tether: strings.Join(completes, ", ") + fmt.Sprintf(" of %d", n),
		baseline: strings.Join(bcompletes, ", "), target: "every viewer", met: yesNo(completeAll), n: cfg.n})
	rep.add(result{row: row, metric: "CPU per delivered event", tether: cpuPerProc(tCPU, tEvents, "host", "ws-plugin"),
		baseline: cpuPerProc(bCPU, bEvents, "baseline"), n: cfg.n})
	rep.note("%s: %d events delivered to viewers per run (tether), %d (baseline); harness client CPU per tether event %s",
		row, tEvents/cfg.n, bEvents/cfg.n, cpuPerProc(tCPU, tEvents, "client"))
	return nil
}

// fanRun is one measurement of the fanout row: n viewers of one tether
// session, and n viewers of the baseline helper.
type fanRun struct {
	ctx      context.Context
	o        fanoutOpts
	n        int
	ts, base *server
	wait     time.Duration // for a run's last delta

	ctl           *client.Conn // makes the session and submits the prompts
	snap          wire.Snapshot
	conns, bconns []*client.Conn
	vs, bvs       []*fanViewer
	cs, bcs       cpuSet
}

// setUp makes the session, has n viewers resume it, and dials n
// baseline viewers.
func (fr *fanRun) setUp() error {
	ctx, ts, n := fr.ctx, fr.ts, fr.n
	var err error
	if fr.ctl, err = client.Dial(ctx, ts.baseURL(), client.Options{Token: ts.token}); err != nil {
		return err
	}
	if fr.snap, err = fr.ctl.Create(ctx, wire.CreateParams{Title: "fanout"}); err != nil {
		return err
	}
	if fr.conns, fr.vs, err = dialViewers(ctx, ts.baseURL(), ts.token, n); err != nil {
		return fmt.Errorf("dialing %d viewers: %w", n, err)
	}
	for i, c := range fr.conns {
		s, err := c.Resume(ctx, wire.ResumeParams{SessionID: fr.snap.SessionKey})
		if err != nil {
			return fmt.Errorf("viewer %d resume: %w", i, err)
		}
		if s.SessionID != fr.snap.SessionID {
			return fmt.Errorf("viewer %d resumed session %s, not the live %s", i, s.SessionID, fr.snap.SessionID)
		}
	}
	if fr.bconns, fr.bvs, err = dialViewers(ctx, "http://"+fr.base.addr, "", n); err != nil {
		return fmt.Errorf("dialing %d baseline viewers: %w", n, err)
	}
	fr.cs = tetherCPUSet(ts)
	if _, ok := fr.cs["ws-plugin"]; !ok {
		return fmt.Errorf("no WS plugin under tether (pid %d)", ts.pid())
	}
	fr.bcs = cpuSet{"baseline": fr.base.cmd.Process.Pid}
	return nil
}

// close closes every socket.
func (fr *fanRun) close() {
	abortConns(fr.bconns)
	abortConns(fr.conns)
	if fr.ctl != nil {
		fr.ctl.Abort()
	}
}

// runT is run r through tether: one prompt, its deltas to every viewer.
func (fr *fanRun) runT(r int) (fanResult, map[string]cpuTime, error) {
	ts, cs := fr.ts, fr.cs
	for _, v := range fr.vs {
		v.reset()
	}
	before := cs.read()
	if _, err := fr.ctl.Submit(fr.ctx, fr.snap.SessionID, fanPrompt(r, fr.o.words)); err != nil {
		return fanResult{}, nil, err
	}
	waitFan(fr.vs, fr.o.words, fr.wait)
	after := cs.read()
	// A host that died or a WS plugin that was restarted makes the
	// run (and its CPU figures) meaningless: the row fails.
	select {
	case <-ts.exited:
		return fanResult{}, nil, fmt.Errorf("run %d: tether exited (%v); stderr:\n%s", r, ts.waitErr, ts.stderr)
	default:
	}
	if pid, err := pluginPID(ts.pid(), "ws"); err != nil || pid != cs["ws-plugin"] {
		return fanResult{}, nil, fmt.Errorf("run %d: the WS plugin (pid %d) is gone (now %d, %v); tether stderr:\n%s", r, cs["ws-plugin"], pid, err, ts.stderr)
	}
	return fanTally(fr.vs, fr.o.words), cpuDelta(before, after), nil
}

// runB is a run of the baseline helper to its viewers.
func (fr *fanRun) runB() (fanResult, map[string]cpuTime, error) {
	for _, v := range fr.bvs {
		v.reset()
	}
	before := fr.bcs.read()
	q := url.Values{"words": {strconv.Itoa(fr.o.words)}, "delay": {fr.o.delay.String()}}
	c, err := dial(fr.ctx, "ws://"+fr.base.addr+"/go?"+q.Encode(), 0)
	if err != nil {
		return fanResult{}, nil, err
	}
	// The helper closes the control socket when it has written the
	// whole run to every viewer.
	for {
		if _, _, err := c.readMessage(); err != nil {
			break
		}
	}
	c.drop()
	waitFan(fr.bvs, fr.o.words, fr.wait)
	after := fr.bcs.read()
	return fanTally(fr.bvs, fr.o.words), cpuDelta(before, after), nil
}

// profile is one more run of each, under perf record and not counted
// (-perf).
func (fr *fanRun) profile(cfg config, rep *report, row string) error {
	pp := startPerf(cfg, row+" tether", fr.cs)
	pp.on()
	_, _, errT := fr.runT(cfg.n)
	pp.off()
	stopPerf(cfg, rep, pp)
	pp = startPerf(cfg, row+" baseline", fr.bcs)
	pp.on()
	_, _, errB := fr.runB()
	pp.off()
	stopPerf(cfg, rep, pp)
	return errors.Join(errT, errB)
}

func cpuDelta(before, after map[string]cpuTime) map[string]cpuTime {
	out := map[string]cpuTime{}
	for k, v := range after {
		out[k] = v.sub(before[k])
	}
	return out
}

func addCPU(acc, d map[string]cpuTime) {
	for k, v := range d {
		t := acc[k]
		t.self += v.self
		t.children += v.children
		acc[k] = t
	}
}

// serveFanout is the baseline fan-out server: every socket but /go is a
// viewer (sent the ready frame, then registered); a socket on
// /go?words=W&delay=D makes the server write W message.delta events and
// a message.complete, each encoded once and written to every viewer in
// turn, D before each delta, then close that socket.
func serveFanout(ln net.Listener) {
	var (
		mu      sync.Mutex
		viewers = map[net.Conn]struct{}{}
		seq     uint64
	)
	serveGobwas(ln, func(c net.Conn, path string) {
		if q, ok := strings.CutPrefix(path, "/go?"); ok {
			defer c.Close()
			vals, _ := url.ParseQuery(q)
			words, _ := strconv.Atoi(vals.Get("words"))
			delay, _ := time.ParseDuration(vals.Get("delay"))
			send := func(typ string, payload any) {
				p, _ := json.Marshal(payload)
				mu.Lock()
				defer mu.Unlock()
				seq++
				msg, _ := wire.NewEvent(wire.Event{Type: typ, SessionID: "baseline", Seq: seq, Payload: p})
				frame := ws.MustCompileFrame(ws.NewTextFrame(msg))
				for v := range viewers {
					if _, err := v.Write(frame); err != nil {
						delete(viewers, v)
						v.Close()
					}
				}
			}
			for w := 0; w < words; w++ {
				time.Sleep(delay)
				send(wire.EventMessageDelta, map[string]string{"text": fmt.Sprintf("w%d ", w)})
			}
			send(wire.EventMessageComplete, map[string]string{"text": "done"})
			_ = ws.WriteFrame(c, ws.NewCloseFrame(ws.NewCloseFrameBody(ws.StatusNormalClosure, "")))
			return
		}
		if err := wsutil.WriteServerText(c, readyFrame); err != nil {
			c.Close()
			return
		}
		mu.Lock()
		viewers[c] = struct{}{}
		mu.Unlock()
		// Read (and drop) until the viewer goes.
		for {
			if _, _, err := wsutil.ReadClientData(c); err != nil {
				break
			}
		}
		mu.Lock()
		delete(viewers, c)
		mu.Unlock()
		c.Close()
	})
}
