package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// holdIdle opens n sockets to url, 64 at a time, each past its first
// frame, and leaves them idle; no client goroutine stays per socket.
func holdIdle(ctx context.Context, url string, n int) ([]*wsc, error) {
	out := make([]*wsc, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	sem := make(chan struct{}, 64)
	for i := range out {
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := dialRPC(ctx, url, true)
			if err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("socket %d: %w", i, err)
				}
				mu.Unlock()
				return
			}
			out[i] = c.wsc
		}()
		mu.Lock()
		stop := first != nil
		mu.Unlock()
		if stop {
			break
		}
	}
	wg.Wait()
	if first != nil {
		dropAll(out)
		return nil, first
	}
	return out, nil
}

func dropAll(cs []*wsc) {
	for _, c := range cs {
		if c != nil {
			c.drop()
		}
	}
}

// idleRun is one measurement: RSS in KiB before and after, per process.
type idleRun struct {
	before, after map[string]int64
	// For the in-process probe: Go's own view after a forced GC.
	probeBefore, probeAfter probeStats
	scavenged               int64 // the probe's RSS after GC and debug.FreeOSMemory
}

func (r idleRun) perSocket(proc string, n int) float64 {
	return float64(r.after[proc]-r.before[proc]) / float64(n)
}

// idleKinds are the servers of the idle row; "tether" counts the WS plugin
// and the host separately.
var idleKinds = []string{"tether", "wsprobe", "gorilla", "coder", "gobwas", "gobwas-http"}

func idleOnce(cfg config, kind string) (idleRun, error) {
	var (
		url        string
		procs      = map[string]int{}
		stop       func()
		probeAdmin string
	)
	switch kind {
	case "tether":
		ts, err := startTether(cfg.bin, tetherOpts{})
		if err != nil {
			return idleRun{}, err
		}
		stop = ts.stop
		wsPID, err := pluginPID(ts.pid(), "ws")
		if err != nil {
			ts.stop()
			return idleRun{}, err
		}
		procs["ws-plugin"], procs["host"] = wsPID, ts.pid()
		url = ts.wsURL("/api/ws", "")
	default:
		var args []string
		statsFile := ""
		if kind == "wsprobe" {
			statsFile = filepath.Join(tmpRoot, fmt.Sprintf("wsprobe-%d", time.Now().UnixNano()))
			args = append(args, statsFile)
		}
		h, err := startHelper(kind, args...)
		if err != nil {
			return idleRun{}, err
		}
		stop = h.stop
		procs[kind] = h.pid()
		url = "ws://" + h.addr + "/api/ws"
		if statsFile != "" {
			for i := 0; i < 200; i++ {
				if b, err := os.ReadFile(statsFile); err == nil && len(b) > 0 {
					probeAdmin = string(b)
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Warm up: one socket in and out, so the first-use costs (TLS-free
	// HTTP server, gRPC buffers) are in the before figure.
	warm, err := holdIdle(ctx, url, 16)
	if err != nil {
		return idleRun{}, fmt.Errorf("%s warm-up: %w", kind, err)
	}
	dropAll(warm)
	time.Sleep(cfg.idleSettle)
	run := idleRun{before: map[string]int64{}, after: map[string]int64{}}
	if probeAdmin != "" {
		if run.probeBefore, err = fetchProbeStats(probeAdmin); err != nil {
			return run, err
		}
	}
	for name, pid := range procs {
		if run.before[name], err = rssKiB(pid); err != nil {
			return run, err
		}
	}
	socks, err := holdIdle(ctx, url, cfg.idle)
	if err != nil {
		return run, fmt.Errorf("%s: %w", kind, err)
	}
	defer dropAll(socks)
	time.Sleep(cfg.idleSettle)
	for name, pid := range procs {
		if run.after[name], err = rssKiB(pid); err != nil {
			return run, err
		}
	}
	if probeAdmin != "" {
		if run.probeAfter, err = fetchProbeStats(probeAdmin); err != nil {
			return run, err
		}
		if run.scavenged, err = rssKiB(procs["wsprobe"]); err != nil {
			return run, err
		}
		if cfg.idleProfile != "" {
			if err := fetchHeapProfile(probeAdmin, cfg.idleProfile); err != nil {
				return run, err
			}
		}
	}
	return run, nil
}

func rowIdle(cfg config, rep *report) error {
	per := map[string]*sample{}
	var heap, stack, gor, scav sample
	for _, p := range []string{"ws-plugin", "host", "wsprobe", "gorilla", "coder", "gobwas", "gobwas-http"} {
		per[p] = &sample{}
	}
	ratioG, ratioC := &sample{}, &sample{}
	for r := 0; r < cfg.n; r++ {
		got := map[string]float64{}
		for _, kind := range idleKinds {
			run, err := idleOnce(cfg, kind)
			if err != nil {
				return err
			}
			for name := range run.after {
				v := run.perSocket(name, cfg.idle)
				per[name].add(v)
				got[name] = v
				logf(cfg, "idle rep %d: %s %d -> %d KiB: %.2f KiB/socket", r, name, run.before[name], run.after[name], v)
			}
			if kind == "wsprobe" {
				n := float64(cfg.idle)
				heap.add((float64(run.probeAfter.HeapInuse) - float64(run.probeBefore.HeapInuse)) / 1024 / n)
				stack.add((float64(run.probeAfter.StackInuse) - float64(run.probeBefore.StackInuse)) / 1024 / n)
				gor.add(float64(run.probeAfter.Goroutines-run.probeBefore.Goroutines) / n)
				scav.add(float64(run.scavenged-run.before["wsprobe"]) / n)
			}
		}
		ratioG.add(got["ws-plugin"] / got["gorilla"])
		ratioC.add(got["ws-plugin"] / got["coder"])
	}
	row := fmt.Sprintf("idle sockets ×%d", cfg.idle)
	rep.add(result{row: row, metric: "RSS/socket ws plugin", tether: per["ws-plugin"].cell("KiB"), baseline: "gorilla " + per["gorilla"].cell("KiB"),
		ratio: ratioG.cell("×"), target: "≤ 8 KiB", met: yesNo(median(per["ws-plugin"].xs) <= 8), n: cfg.n})
	rep.add(result{row: row, metric: "RSS/socket ws plugin", tether: per["ws-plugin"].cell("KiB"), baseline: "coder " + per["coder"].cell("KiB"),
		ratio: ratioC.cell("×"), n: cfg.n})
	rep.add(result{row: row, metric: "RSS/socket ws plugin", tether: per["ws-plugin"].cell("KiB"), baseline: "gobwas goroutine/conn " + per["gobwas"].cell("KiB"), n: cfg.n})
	rep.add(result{row: row, metric: "RSS/socket ws plugin", tether: per["ws-plugin"].cell("KiB"), baseline: "gobwas via net/http " + per["gobwas-http"].cell("KiB"), n: cfg.n})
	rep.add(result{row: row, metric: "RSS/socket host", tether: per["host"].cell("KiB"), n: cfg.n})
	rep.add(result{row: row, metric: "plugins/ws in-process: RSS/socket", tether: per["wsprobe"].cell("KiB"), n: cfg.n})
	rep.add(result{row: row, metric: "plugins/ws in-process: RSS/socket after GC+FreeOSMemory", tether: scav.cell("KiB"), n: cfg.n})
	rep.add(result{row: row, metric: "plugins/ws in-process: live heap/socket", tether: heap.cell("KiB"), n: cfg.n})
	rep.add(result{row: row, metric: "plugins/ws in-process: stacks/socket", tether: stack.cell("KiB"), n: cfg.n})
	rep.add(result{row: row, metric: "plugins/ws in-process: goroutines/socket", tether: gor.cell(""), n: cfg.n})
	rep.note("%s: VmRSS delta after %v idle, divided by the sockets; each socket authenticated and past gateway.ready (baselines send the same first frame)", row, cfg.idleSettle)
	return nil
}
