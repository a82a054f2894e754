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
	for r := 0; r < cfg.n; r++ {
		// A stored key: create a session and close it (persisted, not live).
		snap, err := ctl.Create(ctx, wire.CreateParams{Title: fmt.Sprintf("storm-%d", r)})
		if err != nil {
			return err
		}
		if _, err := ctl.CloseSession(ctx, snap.SessionID); err != nil {
			return err
		}
		socks, err := dialMany(ctx, ts, cfg.storm)
		if err != nil {
			return fmt.Errorf("dialing %d sockets: %w", cfg.storm, err)
		}
		lat := make([]time.Duration, len(socks))
		ids := make([]string, len(socks))
		errs := make([]error, len(socks))
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for i, c := range socks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				t0 := time.Now()
				s, err := c.Resume(ctx, wire.ResumeParams{SessionID: snap.SessionKey})
				errs[i] = err
				lat[i] = time.Since(t0)
				ids[i] = s.SessionID
			}()
		}
		time.Sleep(20 * time.Millisecond) // every goroutine parked at the gate
		close(gate)
		wg.Wait()
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
		if live == 1 && len(distinct) == 1 && distinct[liveID] && len(active) == 1 {
			exact++
		} else {
			bad = append(bad, fmt.Sprintf("rep %d: %d live sessions for the key, %d in all, %d distinct ids answered", r, live, len(active), len(distinct)))
		}
		lms := durationsMS(lat)
		p50.add(percentile(lms, .5))
		p99.add(percentile(lms, .99))
		pmax.add(percentile(lms, 1))
		logf(cfg, "storm rep %d: p50 %.2fms p99 %.2fms max %.2fms; live for key %d", r, percentile(lms, .5), percentile(lms, .99), percentile(lms, 1), live)
		// Clean up: close it (so the next repetition starts from none).
		if liveID != "" {
			if _, err := ctl.CloseSession(ctx, liveID); err != nil {
				return err
			}
		}
		for _, c := range socks {
			c.Abort()
		}
		// Let the host finish tearing down 256 viewers before the next
		// storm, so that it does not race the previous one's cleanup.
		time.Sleep(300 * time.Millisecond)
		waitQuiet(2 * time.Second)
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
