package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// rpcLoad runs every client's call in a loop for warm+dur and returns the
// round trips of the measured part.
func rpcLoad(clients []*rpcClient, params []string, warm, dur time.Duration) ([]time.Duration, error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		all   []time.Duration
		first error
	)
	start := time.Now()
	from, until := start.Add(warm), start.Add(warm+dur)
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 4096)
			for {
				t0 := time.Now()
				if !t0.Before(until) {
					break
				}
				if _, err := c.call(wire.MethodEventsSince, params[i]); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				if t0.After(from) {
					lat = append(lat, time.Since(t0))
				}
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all, first
}

// rowRPC measures session.events.since round trips through tether
// against an echo server (the baseline) and a bare relay (the floor),
// for each -rpc-clients count.
func rowRPC(cfg config, rep *report) error {
	ts, err := startTether(cfg.bin, tetherOpts{admin: true})
	if err != nil {
		return err
	}
	defer ts.stop()
	echo, err := startHelper("echo")
	if err != nil {
		return err
	}
	defer echo.stop()
	relay, err := startHelper("relay")
	if err != nil {
		return err
	}
	defer relay.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The sessions are made on a socket of their own; the measured
	// sockets only call session.events.since, tether's and the
	// baselines' alike.
	ctl, err := client.Dial(ctx, ts.baseURL(), client.Options{Token: ts.token})
	if err != nil {
		return fmt.Errorf("dial tether: %w", err)
	}
	defer ctl.Close()

	for _, k := range cfg.rpcClients {
		socks := &rpcSockets{}
		defer socks.drop() // every count's sockets stay open to the end
		if err := socks.dial(ctx, ctl, ts, echo, relay, k); err != nil {
			return err
		}
		if err := rpcCount(cfg, rep, ts, relay, socks, k); err != nil {
			return err
		}
	}
	return nil
}

// rpcSockets are the measured sockets of one client count: to tether,
// to the echo baseline and to the relay floor, and what each sends.
type rpcSockets struct {
	tc, ec, rc       []*rpcClient
	tparams, eparams []string
}

// dial opens k sockets of each kind, each tether socket with a session
// of its own made on ctl.
func (s *rpcSockets) dial(ctx context.Context, ctl *client.Conn, ts, echo, relay *server, k int) error {
	for i := 0; i < k; i++ {
		c, err := dialRPC(ctx, ts.wsURL("/api/ws", ""), true)
		if err != nil {
			return fmt.Errorf("dial tether: %w", err)
		}
		s.tc = append(s.tc, c)
		snap, err := ctl.Create(ctx, wire.CreateParams{Title: "bench"})
		if err != nil {
			return err
		}
		p, err := json.Marshal(wire.EventsSinceParams{SessionID: snap.SessionID, LastSeen: snap.LatestSeq})
		if err != nil {
			return err
		}
		s.tparams = append(s.tparams, string(p))
		e, err := dialRPC(ctx, "ws://"+echo.addr+"/", true)
		if err != nil {
			return fmt.Errorf("dial echo: %w", err)
		}
		s.ec = append(s.ec, e)
		rl, err := dialRPC(ctx, "ws://"+relay.addr+"/", true)
		if err != nil {
			return fmt.Errorf("dial relay: %w", err)
		}
		s.rc = append(s.rc, rl)
		// The same frame, byte for byte, so both carry as much.
		s.eparams = append(s.eparams, s.tparams[i])
	}
	return nil
}

// drop closes every socket.
func (s *rpcSockets) drop() {
	for _, cs := range [][]*rpcClient{s.tc, s.ec, s.rc} {
		for _, c := range cs {
			c.drop()
		}
	}
}

// rpcCount measures and reports one client count: cfg.n repetitions of
// the three loads back to back, alternating their order.
func rpcCount(cfg config, rep *report, ts, relay *server, s *rpcSockets, k int) error {
	warm := min(cfg.rpcDur/4, 250*time.Millisecond)
	var t50, t99, e50, e99, r50, r99, l50, l99, rl50 sample
	cs := tetherCPUSet(ts)
	cpuT := map[string]cpuTime{}
	cpuCalls := 0
	calls := 0
	for r := 0; r < cfg.n; r++ {
		var tl, el, ll []time.Duration
		runT := func() error {
			before := cs.read()
			var err error
			tl, err = rpcLoad(s.tc, s.tparams, warm, cfg.rpcDur)
			after := cs.read()
			for k, v := range after {
				d := v.sub(before[k])
				t := cpuT[k]
				t.self += d.self
				t.children += d.children
				cpuT[k] = t
			}
			return err
		}
		runE := func() error { var err error; el, err = rpcLoad(s.ec, s.eparams, warm, cfg.rpcDur); return err }
		runL := func() error { var err error; ll, err = rpcLoad(s.rc, s.eparams, warm, cfg.rpcDur); return err }
		order := []func() error{runT, runE, runL}
		if r%2 == 1 {
			order = []func() error{runL, runE, runT}
		}
		for _, f := range order {
			if err := f(); err != nil {
				return fmt.Errorf("%d clients: %w", k, err)
			}
		}
		tms, ems, lms := durationsMS(tl), durationsMS(el), durationsMS(ll)
		l50.add(percentile(lms, 0.50))
		l99.add(percentile(lms, 0.99))
		rl50.add(percentile(tms, 0.50) / percentile(lms, 0.50))
		t50.add(percentile(tms, 0.50))
		t99.add(percentile(tms, 0.99))
		e50.add(percentile(ems, 0.50))
		e99.add(percentile(ems, 0.99))
		r50.add(percentile(tms, 0.50) / percentile(ems, 0.50))
		r99.add(percentile(tms, 0.99) / percentile(ems, 0.99))
		calls += len(tl)
		cpuCalls += int(float64(len(tl)) * float64(cfg.rpcDur+warm) / float64(cfg.rpcDur))
		logf(cfg, "rpc %d clients rep %d: tether p50 %.3fms p99 %.3fms (%d calls), echo p50 %.3fms p99 %.3fms (%d calls)",
			k, r, percentile(tms, .5), percentile(tms, .99), len(tl), percentile(ems, .5), percentile(ems, .99), len(el))
	}
	row := fmt.Sprintf("rpc events.since ×%d", k)
	if cfg.perfDir != "" {
		if err := rpcProfile(cfg, rep, row, cs, relay, s, warm); err != nil {
			return fmt.Errorf("%d clients, profiled: %w", k, err)
		}
	}
	rep.add(result{row: row, metric: "p50", tether: t50.cell("ms"), baseline: e50.cell("ms"), ratio: r50.cell("×"),
		target: "ratio ≤ 1.30", met: yesNo(median(r50.xs) <= 1.3), n: cfg.n})
	rep.add(result{row: row, metric: "p99", tether: t99.cell("ms"), baseline: e99.cell("ms"), ratio: r99.cell("×"), n: cfg.n})
	rep.add(result{row: row, metric: "p50 vs relay floor", tether: t50.cell("ms"), baseline: "relay " + l50.cell("ms"), ratio: rl50.cell("×"),
		target: "ratio ≤ 1.20", met: yesNo(median(rl50.xs) <= 1.2), n: cfg.n})
	rep.add(result{row: row, metric: "p99 vs relay floor", tether: t99.cell("ms"), baseline: "relay " + l99.cell("ms"), n: cfg.n})
	rep.note("%s: %d tether calls per repetition on average, %v measured each; CPU per call: %s", row, calls/cfg.n, cfg.rpcDur,
		cpuPer(map[string]cpuTime{}, cpuT, max(cpuCalls, 1)))
	return nil
}

// rpcProfile runs one more load of tether and of the relay, each under
// perf record and not counted (-perf).
func rpcProfile(cfg config, rep *report, row string, cs cpuSet, relay *server, s *rpcSockets, warm time.Duration) error {
	pp := startPerf(cfg, row+" tether", cs)
	pp.on()
	_, errT := rpcLoad(s.tc, s.tparams, warm, cfg.rpcDur)
	pp.off()
	stopPerf(cfg, rep, pp)
	pp = startPerf(cfg, row+" relay", map[string]int{"relay": relay.pid()})
	pp.on()
	_, errL := rpcLoad(s.rc, s.eparams, warm, cfg.rpcDur)
	pp.off()
	stopPerf(cfg, rep, pp)
	return errors.Join(errT, errL)
}
