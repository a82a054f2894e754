package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gobwas/ws"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// readReplay dials url with the wsc instrument and reads the replay to
// its last byte. want is the replay length to expect when there is no
// pty.replay frame (baseline).
func readReplay(ctx context.Context, url string, want int64) (time.Duration, wire.Replay, error) {
	d, _, rf, err := readReplayTimed(ctx, url, want)
	return d, rf, err
}

// readReplayTimed is readReplay that also returns when the pty.replay
// frame (or, without one, the first byte) arrived.
func readReplayTimed(ctx context.Context, url string, want int64) (time.Duration, time.Duration, wire.Replay, error) {
	var first time.Duration
	d, rf, err := readReplayHook(ctx, url, want, func(t time.Duration) {
		if first == 0 {
			first = t
		}
	})
	return d, first, rf, err
}

func readReplayHook(ctx context.Context, url string, want int64, mark func(time.Duration)) (time.Duration, wire.Replay, error) {
	t0 := time.Now()
	c, err := dial(ctx, url, 256<<10)
	if err != nil {
		return 0, wire.Replay{}, err
	}
	defer c.close()
	_ = c.nc.SetDeadline(time.Now().Add(10 * time.Second))
	var rf wire.Replay
	got := int64(0)
	for want < 0 || got < want {
		h, err := c.next()
		var ce *closeError
		if errors.As(err, &ce) && want >= 0 && got >= want {
			break
		}
		if err != nil {
			return 0, rf, fmt.Errorf("after %d replay bytes: %w", got, err)
		}
		mark(time.Since(t0))
		if h.OpCode == ws.OpText {
			p, err := io.ReadAll(&c.rd)
			if err != nil {
				return 0, rf, err
			}
			if rf, err = wire.DecodeReplay(p); err != nil {
				return 0, rf, fmt.Errorf("unexpected text frame %q: %w", p, err)
			}
			want = rf.ReplayEndOffset - rf.StartOffset // a fresh attach: the whole ring
			if rf.Snapshot {
				want = rf.SnapshotBytes
			}
			continue
		}
		n, err := io.Copy(io.Discard, &c.rd)
		if err != nil {
			return 0, rf, err
		}
		got += n
	}
	return time.Since(t0), rf, nil
}

func rowReattach(cfg config, rep *report) error {
	ring := cfg.reattachRing
	fill, err := makePayload(2*ring, 3)
	if err != nil {
		return err
	}
	// The child prints 2 MiB (no newlines) and then sleeps: the 1 MiB
	// ring is full and stays so.
	cmdline := fmt.Sprintf(`sh -c 'cat %s; exec sleep 3600'`, fill.path)
	ts, err := startTether(cfg.bin, tetherOpts{ptyCommand: cmdline, extra: []string{"--pty-buffer", sizeName(ring)}})
	if err != nil {
		return err
	}
	defer ts.stop()
	direct, err := startHelper("ptydirect", "true")
	if err != nil {
		return err
	}
	defer direct.stop()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	token := randToken()
	url := ts.wsURL("/api/pty", "attach="+token)
	// Fill: wait until the whole 2 MiB went through the ring.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var rf wire.Replay
		p, err := client.AttachPTY(ctx, ts.baseURL(), token, client.PTYOptions{Options: client.Options{Token: ts.token}})
		if err == nil {
			rf = p.Replay()
			p.Abort()
		}
		if err == nil && rf.ReplayEndOffset >= 2*ring {
			if rf.ReplayEndOffset-rf.StartOffset != ring {
				return fmt.Errorf("ring holds %d bytes, want %d", rf.ReplayEndOffset-rf.StartOffset, ring)
			}
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ring not full after 30s: %+v %v; tether stderr:\n%s", rf, err, ts.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}

	var p50, p99, b50, b99, h50, h99 sample
	var reasons = map[string]int{}
	cs := tetherCPUSet(ts)
	var cpuBefore, cpuAfter map[string]cpuTime
	attaches := 0
	for r := 0; r < cfg.n; r++ {
		waitQuiet(2 * time.Second)
		var tl, bl, hl []time.Duration
		for i := 0; i < cfg.reattachN; i++ {
			if r == 0 && i == 0 {
				cpuBefore = cs.read()
			}
			d, hd, rf, err := readReplayTimed(ctx, url, -1)
			if r == cfg.n-1 && i == cfg.reattachN-1 {
				cpuAfter = cs.read()
			}
			attaches++
			if err != nil {
				return fmt.Errorf("attach %d: %w", i, err)
			}
			if rf.ReplayEndOffset-rf.StartOffset != ring {
				return fmt.Errorf("attach %d: replay of %d bytes, want %d", i, rf.ReplayEndOffset-rf.StartOffset, ring)
			}
			reasons[rf.Reason]++
			tl = append(tl, d)
			hl = append(hl, hd)
			d, _, err = readReplay(ctx, "ws://"+direct.addr+fmt.Sprintf("/replay?n=%d", ring), int64(ring))
			if err != nil {
				return fmt.Errorf("baseline %d: %w", i, err)
			}
			bl = append(bl, d)
		}
		tms, bms, hms := durationsMS(tl), durationsMS(bl), durationsMS(hl)
		h50.add(percentile(hms, .5))
		h99.add(percentile(hms, .99))
		p50.add(percentile(tms, .5))
		p99.add(percentile(tms, .99))
		b50.add(percentile(bms, .5))
		b99.add(percentile(bms, .99))
		logf(cfg, "reattach rep %d: p50 %.2fms p99 %.2fms (1 MiB over a bare socket: p50 %.2fms p99 %.2fms)",
			r, percentile(tms, .5), percentile(tms, .99), percentile(bms, .5), percentile(bms, .99))
	}
	row := "reattach " + sizeName(ring) + " ring"
	rep.add(result{row: row, metric: "p50 to pty.replay frame", tether: h50.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "p99 to pty.replay frame", tether: h99.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "p50", tether: p50.cell("ms"), baseline: b50.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "p99", tether: p99.cell("ms"), baseline: b99.cell("ms"), target: "≤ 5 ms",
		met: yesNo(median(p99.xs) <= 5), n: cfg.n})
	rep.note("%s: CPU per attach (host, plugins and client; the client also ran the baseline between attaches, the plugins did not): %s", row, cpuPer(cpuBefore, cpuAfter, attaches))
	rep.note("%s: %d attaches per repetition, dial to last replay byte; baseline = a gobwas/ws server writing 1 MiB on upgrade (the floor); reasons %v", row, cfg.reattachN, reasons)
	return nil
}
