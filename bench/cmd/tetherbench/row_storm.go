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
		// A stored key: create a session and close it (persisted, not live).
		snap := kept
		if cfg.stormHistory == 0 {
			if snap, err = ctl.Create(ctx, wire.CreateParams{Title: fmt.Sprintf("storm-%d", r)}); err != nil {
				return err
			}
			if _, err := ctl.CloseSession(ctx, snap.SessionID); err != nil {
				return err
			}
		}
		// -storm-dial: the sockets are dialed in the storm itself (connect,
		// upgrade, gateway.ready, then resume, all timed), as a client
		// that opens its socket to resume does; else they are open first.
		socks := make([]*client.Conn, cfg.storm)
		if !cfg.stormDial {
			if socks, err = dialMany(ctx, ts, cfg.storm); err != nil {
				return fmt.Errorf("dialing %d sockets: %w", cfg.storm, err)
			}
		}
		lat := make([]time.Duration, len(socks))
		ids := make([]string, len(socks))
		errs := make([]error, len(socks))
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for i := range socks {
			wg.Add(1)
			go func() {
				defer wg.Done()
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
				s, err := c.Resume(ctx, wire.ResumeParams{SessionID: snap.SessionKey})
				errs[i] = err
				lat[i] = time.Since(t0)
				ids[i] = s.SessionID
			}()
		}
		time.Sleep(20 * time.Millisecond) // every goroutine parked at the gate
		if profiling {
			if pp == nil {
				pp = startPerf(cfg, fmt.Sprintf("resume storm ×%d", cfg.storm), tetherCPUSet(ts))
			}
			pp.on()
		}
		close(gate)
		wg.Wait()
		if profiling {
			pp.off()
		}
		distinct := map[string]bool{}
		for i := range socks {
			if errs[i] != nil {
				return fmt.Errorf("resume %d: %w", i, errs[i])
			}
			distinct[ids[i]] = true
		}
		active, err := ctl.ActiveList(ctx)
		if err != nil {
			return err
		}
		live, liveID := 0, ""
		for _, s := range active {
			if s.SessionKey == snap.SessionKey {
				live++
				liveID = s.ID
			}
		}
		switch {
		case profiling:
		case live == 1 && len(distinct) == 1 && distinct[liveID] && len(active) == 1:
			exact++
		default:
			bad = append(bad, fmt.Sprintf("rep %d: %d live sessions for the key, %d in all, %d distinct ids answered", r, live, len(active), len(distinct)))
		}
		lms := durationsMS(lat)
		if profiling {
			logf(cfg, "storm profiled round: p99 %.2fms", percentile(lms, .99))
		} else {
			p50.add(percentile(lms, .5))
			p99.add(percentile(lms, .99))
			pmax.add(percentile(lms, 1))
		}
		logf(cfg, "storm rep %d: p50 %.2fms p99 %.2fms max %.2fms; live for key %d", r, percentile(lms, .5), percentile(lms, .99), percentile(lms, 1), live)
		// Clean up: close it (so the next repetition starts from none).
		if liveID != "" {
			if _, err := ctl.CloseSession(ctx, liveID); err != nil {
				return err
			}
		}
		for _, c := range socks {
			if c != nil {
				c.Abort()
			}
		}
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
