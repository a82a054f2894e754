package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// dialMany opens n JSON-RPC sockets, 32 at a time, each past gateway.ready.
func dialMany(ctx context.Context, ts *server, n int) ([]*client.Conn, error) {
	out := make([]*client.Conn, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	sem := make(chan struct{}, 32)
	for i := range out {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := client.Dial(ctx, ts.baseURL(), client.Options{Token: ts.token})
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				return
			}
			out[i] = c
		}()
	}
	wg.Wait()
	if first != nil {
		for _, c := range out {
			if c != nil {
				c.Abort()
			}
		}
		return nil, first
	}
	return out, nil
}

// rowStorm: the resume storm on one host. Per repetition cfg.storm
// sockets resume one stored key at once; latency per socket from the
// release to its answer. Exactly one session must result.
func rowStorm(cfg config, rep *report) error {
	ts, err := startTether(cfg.bin, tetherOpts{})
	if err != nil {
		return err
	}
	defer ts.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ctl, err := client.Dial(ctx, ts.baseURL(), client.Options{Token: ts.token})
	if err != nil {
		return err
	}
	defer ctl.Abort()

	var p50, p99, pmax sample
	exact := 0
	var bad []string
	var kept wire.Snapshot // -storm-history: the one key every storm resumes
	if cfg.stormHistory > 0 {
		if kept, err = stormHistory(ctx, ctl, cfg.stormHistory); err != nil {
			return err
		}
	}
	// -perf: 10 more rounds, sampled while they resume, not counted;
	// perf is attached only after the measured rounds (attached, even
	// paused, it slowed the first rounds of a fresh host 3×).
	var pp *perfRecs
	defer func() { stopPerf(cfg, rep, pp) }()
	for r := 0; r < cfg.n+10*profiled(cfg); r++ {
		profiling := r >= cfg.n
		onRelease, onDone := func() {}, func() {}
		if profiling {
			onRelease = func() {
				if pp == nil {
					pp = startPerf(cfg, fmt.Sprintf("resume storm ×%d", cfg.storm), tetherCPUSet(ts))
				}
				pp.on()
			}
			onDone = func() { pp.off() }
		}
		res, err := stormRound(ctx, cfg, ts, ctl, kept, r, onRelease, onDone)
		if err != nil {
			return err
		}
		switch {
		case profiling:
		case res.live == 1 && len(res.distinct) == 1 && res.distinct[res.liveID] && res.active == 1:
			exact++
		default:
			bad = append(bad, fmt.Sprintf("rep %d: %d live sessions for the key, %d in all, %d distinct ids answered", r, res.live, res.active, len(res.distinct)))
		}
		lms := durationsMS(res.lat)
		if profiling {
			logf(cfg, "storm profiled round: p99 %.2fms", percentile(lms, .99))
		} else {
			p50.add(percentile(lms, .5))
			p99.add(percentile(lms, .99))
			pmax.add(percentile(lms, 1))
		}
		logf(cfg, "storm rep %d: p50 %.2fms p99 %.2fms max %.2fms; live for key %d", r, percentile(lms, .5), percentile(lms, .99), percentile(lms, 1), res.live)
		// -storm-pause lets the host finish tearing down 256 viewers
		// before the next storm; 0 (the default) starts the next storm
		// while it does, as an outside client would.
		if cfg.stormPause > 0 {
			time.Sleep(cfg.stormPause)
			waitQuiet(2 * time.Second)
		}
	}
	row := fmt.Sprintf("resume storm ×%d", cfg.storm)
	rep.add(result{row: row, metric: "p50", tether: p50.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "p99", tether: p99.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "max", tether: pmax.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "one live session", tether: fmt.Sprintf("%d/%d", exact, cfg.n),
		target: "every repetition", met: yesNo(exact == cfg.n), n: cfg.n})
	for _, b := range bad {
		rep.note("%s: %s", row, b)
	}
	return nil
}

// stormResult is one storm of the storm row.
type stormResult struct {
	lat      []time.Duration // per socket, release → answer
	distinct map[string]bool // session ids answered
	live     int             // live sessions for the key afterwards
	liveID   string          // the (last) one of them
	active   int             // live sessions in all
}

// stormRound is repetition r of the storm row: the key (kept's, or that
// of a session created and closed now, stored and not live), cfg.storm
// sockets resuming it at once, and what the host then has live. onRelease
// runs right before the release, onDone once every socket is answered.
// The live session and the sockets are closed before it returns.
func stormRound(ctx context.Context, cfg config, ts *server, ctl *client.Conn, kept wire.Snapshot, r int, onRelease, onDone func()) (stormResult, error) {
	snap := kept
	if cfg.stormHistory == 0 {
		var err error
		if snap, err = ctl.Create(ctx, wire.CreateParams{Title: fmt.Sprintf("storm-%d", r)}); err != nil {
			return stormResult{}, err
		}
		if _, err := ctl.CloseSession(ctx, snap.SessionID); err != nil {
			return stormResult{}, err
		}
	}
	// -storm-dial: the sockets are dialed in the storm itself (connect,
	// upgrade, gateway.ready, then resume, all timed), as a client
	// that opens its socket to resume does; else they are open first.
	socks := make([]*client.Conn, cfg.storm)
	if !cfg.stormDial {
		var err error
		if socks, err = dialMany(ctx, ts, cfg.storm); err != nil {
			return stormResult{}, fmt.Errorf("dialing %d sockets: %w", cfg.storm, err)
		}
	}
	defer func() {
		for _, c := range socks {
			if c != nil {
				c.Abort()
			}
		}
	}()
	lat, ids, errs := resumeAtGate(ctx, ts, socks, snap.SessionKey, onRelease, onDone)
	res := stormResult{lat: lat, distinct: map[string]bool{}}
	for i := range socks {
		if errs[i] != nil {
			return stormResult{}, fmt.Errorf("resume %d: %w", i, errs[i])
		}
		res.distinct[ids[i]] = true
	}
	active, err := ctl.ActiveList(ctx)
	if err != nil {
		return stormResult{}, err
	}
	res.active = len(active)
	for _, s := range active {
		if s.SessionKey == snap.SessionKey {
			res.live++
			res.liveID = s.ID
		}
	}
	// Clean up: close it (so the next repetition starts from none).
	if res.liveID != "" {
		if _, err := ctl.CloseSession(ctx, res.liveID); err != nil {
			return stormResult{}, err
		}
	}
	return res, nil
}

// resumeAtGate has every socket resume key at the same moment (a nil
// socket is dialed first, in the timed part, and stored in socks). Per
// socket: release → answer, the session id answered, the error.
func resumeAtGate(ctx context.Context, ts *server, socks []*client.Conn, key string, onRelease, onDone func()) (lat []time.Duration, ids []string, errs []error) {
	lat = make([]time.Duration, len(socks))
	ids = make([]string, len(socks))
	errs = make([]error, len(socks))
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range socks {
		wg.Go(func() {
			<-gate
			t0 := time.Now()
			c := socks[i]
			if c == nil {
				var err error
				if c, err = client.Dial(ctx, ts.baseURL(), client.Options{Token: ts.token}); err != nil {
					errs[i] = err
					return
				}
				socks[i] = c
			}
			s, err := c.Resume(ctx, wire.ResumeParams{SessionID: key})
			errs[i] = err
			lat[i] = time.Since(t0)
			ids[i] = s.SessionID
		})
	}
	time.Sleep(20 * time.Millisecond) // every goroutine parked at the gate
	onRelease()
	close(gate)
	wg.Wait()
	onDone()
	return lat, ids, errs
}

// stormHistory creates the session the storms of -storm-history resume:
// a prompt of words words run to its message.complete, then closed, so
// that every resume rebuilds it from the store with that history.
func stormHistory(ctx context.Context, ctl *client.Conn, words int) (wire.Snapshot, error) {
	snap, err := ctl.Create(ctx, wire.CreateParams{Title: "storm-history"})
	if err != nil {
		return snap, err
	}
	if _, err := ctl.Submit(ctx, snap.SessionID, fanPrompt(0, words)); err != nil {
		return snap, err
	}
	for {
		select {
		case e := <-ctl.Events():
			if e.Type == wire.EventMessageComplete && e.SessionID == snap.SessionID {
				_, err := ctl.CloseSession(ctx, snap.SessionID)
				return snap, err
			}
		case <-ctl.Done():
			return snap, ctl.Err()
		case <-ctx.Done():
			return snap, ctx.Err()
		}
	}
}
