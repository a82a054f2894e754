package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/gobwas/ws"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// clusterPTYScript is the cluster-pty row's PTY: echo off, a ready mark,
// then a line. "PATH" writes that file and exits (a stream, closed with
// 4410 after its last byte); "hold PATH" writes it and then sleeps, so
// that the ring stays full for the reattaches.
const clusterPTYScript = `stty -echo; printf R; read f g; if [ -n "$g" ]; then cat "$g"; exec sleep 3600; fi; exec cat "$f"`

// clusterPTYRing is the cluster-pty row's --pty-buffer.
const clusterPTYRing = 1 << 20

// clusterPTY is the cluster-pty row's cluster: its PTYs live on h1.
type clusterPTY struct {
	ctx    context.Context
	cl     *cluster
	h1, h2 *server
}

// rowClusterPTY: a PTY on h1 reached through h2 (relayed over NATS)
// against the same PTY reached on h1. Throughput: each stream's PTY is
// started by an attach on h1 (so it lives there), which reads the ready
// mark and leaves; the stream then attaches through h1 or h2 with
// offset 0 and the epoch, so that the replay is exactly the mark, and
// asks for the payload. Reattach: a PTY on h1 that printed 2 × the 1 MiB
// ring and sleeps; dial → last replay byte of a resume at its end offset
// (nothing to replay) and of a resume from the ring's first byte (the
// whole ring), through h1 and through h2 alternately.
func rowClusterPTY(cfg config, rep *report) error {
	o := cfg.cluster
	big, err := makePayload(o.ptySize, 21)
	if err != nil {
		return err
	}
	fill, err := makePayload(2*clusterPTYRing, 22)
	if err != nil {
		return err
	}
	cl, err := startCluster(cfg.bin, tetherOpts{ptyCommand: fmt.Sprintf("sh -c '%s'", clusterPTYScript), extra: []string{"--pty-buffer", sizeName(clusterPTYRing)}})
	if err != nil {
		return err
	}
	defer cl.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cp := &clusterPTY{ctx: ctx, cl: cl, h1: cl.hosts[0], h2: cl.hosts[1]}

	completeSame, completeCross := cp.streams(cfg, rep, big)
	if err := cp.reattaches(cfg, rep, fill); err != nil {
		return err
	}
	if completeCross != cfg.n || completeSame != cfg.n {
		return fmt.Errorf("%d of %d streams through h2 and %d of %d on h1 were complete", completeCross, cfg.n, completeSame, cfg.n)
	}
	return nil
}

// startPTY starts a PTY on h1 with a fresh token, waits for its ready
// mark, types line when not empty, and leaves it running.
func (cp *clusterPTY) startPTY(line string) (string, string, error) {
	tok := randToken()
	p, err := client.AttachPTY(cp.ctx, cp.h1.baseURL(), tok, client.PTYOptions{Options: client.Options{Token: cp.h1.token}, ReadTimeout: 10 * time.Second})
	if err != nil {
		return "", "", err
	}
	defer p.Close()
	var seen []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(seen, []byte("R")) {
		n, err := p.Read(buf)
		if err != nil {
			return "", "", fmt.Errorf("waiting for the PTY's ready mark: %w", err)
		}
		seen = append(seen, buf[:n]...)
	}
	if line != "" {
		if _, err := p.Write([]byte(line)); err != nil {
			return "", "", err
		}
		// Stay until output comes: input sent right before a close
		// may be dropped.
		if _, err := p.Read(buf); err != nil {
			return "", "", err
		}
	}
	return tok, p.Epoch(), nil
}

// stream streams big from a fresh PTY on h1 through via; the string says
// why the stream failed, "" when it was complete.
func (cp *clusterPTY) stream(via *server, big *payload) (streamResult, string) {
	tok, epoch, err := cp.startPTY("")
	if err != nil {
		return streamResult{}, err.Error()
	}
	r, err := ptyStream(via.wsURL("/api/pty", fmt.Sprintf("attach=%s&offset=0&epoch=%s", tok, epoch)), big)
	switch {
	case err != nil:
		return r, err.Error()
	case !r.ok:
		return r, fmt.Sprintf("got %d of %d bytes, closed %d %q", r.got, big.size, r.code, r.reason)
	}
	return r, ""
}

// streams is the throughput phase: cfg.n streams on h1 and through h2,
// alternating which side goes first. It reports them and returns how
// many were complete on h1 and through h2.
func (cp *clusterPTY) streams(cfg config, rep *report, big *payload) (completeSame, completeCross int) {
	h1, h2 := cp.h1, cp.h2
	var same, cross, ratio sample
	var fails []string
	for i := 0; i < cfg.n; i++ {
		waitQuiet(3 * time.Second)
		order := []*server{h1, h2}
		if i%2 == 1 {
			order = []*server{h2, h1}
		}
		var rs, rc streamResult
		var fs, fc string
		for _, via := range order {
			if via == h1 {
				rs, fs = cp.stream(h1, big)
			} else {
				rc, fc = cp.stream(h2, big)
			}
		}
		if fs == "" {
			completeSame++
			same.add(rs.mibps(big.size))
		} else {
			fails = append(fails, fmt.Sprintf("same-host run %d: %s", i, fs))
		}
		if fc == "" {
			completeCross++
			cross.add(rc.mibps(big.size))
		} else {
			fails = append(fails, fmt.Sprintf("cross-host run %d: %s", i, fc))
		}
		if fs == "" && fc == "" {
			ratio.add(rc.mibps(big.size) / rs.mibps(big.size))
		}
		logf(cfg, "cluster-pty stream %d: on h1 %.1f MiB/s %s, through h2 %.1f MiB/s %s", i, rs.mibps(big.size), fs, rc.mibps(big.size), fc)
	}
	row := "cluster-pty stream " + sizeName(big.size)
	rep.add(result{row: row, metric: "throughput through h2 (baseline: on h1)", tether: cross.cell("MiB/s"), baseline: same.cell("MiB/s"), ratio: ratio.cell("×"), n: len(ratio.xs)})
	rep.add(result{row: row, metric: "complete streams through h2 / on h1", tether: fmt.Sprintf("%d/%d", completeCross, cfg.n), baseline: fmt.Sprintf("%d/%d", completeSame, cfg.n),
		target: "all", met: yesNo(completeCross == cfg.n && completeSame == cfg.n), n: cfg.n})
	for _, f := range fails {
		rep.note("%s: %s", row, f)
	}
	return completeSame, completeCross
}

// fullRing starts a PTY on h1 that prints fill and sleeps, waits until
// all of it is in the ring, and returns its token, end offset and epoch.
func (cp *clusterPTY) fullRing(fill *payload) (tok string, end int64, epoch string, err error) {
	tok, _, err = cp.startPTY("hold " + fill.path + "\n")
	if err != nil {
		return "", 0, "", err
	}
	var rf wire.Replay
	for deadline := time.Now().Add(60 * time.Second); ; {
		p, err := client.AttachPTY(cp.ctx, cp.h1.baseURL(), tok, client.PTYOptions{Options: client.Options{Token: cp.h1.token}})
		if err == nil {
			rf = p.Replay()
			p.Abort()
		}
		if err == nil && rf.ReplayEndOffset >= 1+fill.size {
			break
		}
		if time.Now().After(deadline) {
			return "", 0, "", fmt.Errorf("the PTY has not printed %d bytes after 60s: %+v %v", fill.size, rf, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the PTY's output
	}
	return tok, rf.ReplayEndOffset, rf.Epoch, nil
}

// reattachRep is one repetition of the reattach phase: n attaches per
// host and kind to the PTY tok, at its end offset (tl) and from the
// ring's first byte (rl); [0] on h1, [1] through h2.
func (cp *clusterPTY) reattachRep(n int, tok string, end int64, epoch string) (tl, rl [2][]time.Duration, err error) {
	first := end - clusterPTYRing
	for i := 0; i < n; i++ {
		for j := range 2 {
			side := (i + j) % 2 // alternate which host goes first
			via := cp.cl.hosts[side]
			d, got, err := readResume(cp.ctx, via.wsURL("/api/pty", fmt.Sprintf("attach=%s&offset=%d&epoch=%s", tok, end, epoch)), end)
			if err != nil {
				return tl, rl, fmt.Errorf("resume at the end through h%d: %w", side+1, err)
			}
			if got.Reset || got.ReplayEndOffset != end {
				return tl, rl, fmt.Errorf("resume at the end through h%d: %+v, want nothing to replay at %d", side+1, got, end)
			}
			tl[side] = append(tl[side], d)
			d, got, err = readResume(cp.ctx, via.wsURL("/api/pty", fmt.Sprintf("attach=%s&offset=%d&epoch=%s", tok, first, epoch)), first)
			if err != nil {
				return tl, rl, fmt.Errorf("resume of the ring through h%d: %w", side+1, err)
			}
			if got.Reset || got.StartOffset != first || got.ReplayEndOffset-first != clusterPTYRing {
				return tl, rl, fmt.Errorf("resume of the ring through h%d: %+v, want the whole %d-byte ring from %d", side+1, got, clusterPTYRing, first)
			}
			rl[side] = append(rl[side], d)
		}
	}
	return tl, rl, nil
}

// reattaches is the reattach phase: cfg.n repetitions of reattachRep to
// a PTY whose ring is full, reported.
func (cp *clusterPTY) reattaches(cfg config, rep *report, fill *payload) error {
	o := cfg.cluster
	tok, end, epoch, err := cp.fullRing(fill)
	if err != nil {
		return err
	}
	var tail50, tail99, ring50, ring99 [2]sample // [0] on h1, [1] through h2
	var tailRatio, ringRatio sample
	for r := 0; r < cfg.n; r++ {
		waitQuiet(2 * time.Second)
		tl, rl, err := cp.reattachRep(o.reattach, tok, end, epoch)
		if err != nil {
			return err
		}
		for side := range 2 {
			t, g := durationsMS(tl[side]), durationsMS(rl[side])
			tail50[side].add(percentile(t, .5))
			tail99[side].add(percentile(t, .99))
			ring50[side].add(percentile(g, .5))
			ring99[side].add(percentile(g, .99))
		}
		tailRatio.add(percentile(durationsMS(tl[1]), .5) / percentile(durationsMS(tl[0]), .5))
		ringRatio.add(percentile(durationsMS(rl[1]), .5) / percentile(durationsMS(rl[0]), .5))
		logf(cfg, "cluster-pty reattach rep %d: at end p50 h1 %.2fms h2 %.2fms; whole ring p50 h1 %.2fms h2 %.2fms", r,
			percentile(durationsMS(tl[0]), .5), percentile(durationsMS(tl[1]), .5), percentile(durationsMS(rl[0]), .5), percentile(durationsMS(rl[1]), .5))
	}
	row := "cluster-pty reattach, PTY on h1"
	rep.add(result{row: row, metric: "resume at end (0 B), p50 through h2 (baseline: on h1)", tether: tail50[1].cell("ms"), baseline: tail50[0].cell("ms"), ratio: tailRatio.cell("×"), n: cfg.n})
	rep.add(result{row: row, metric: "resume at end (0 B), p99 through h2 (baseline: on h1)", tether: tail99[1].cell("ms"), baseline: tail99[0].cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "resume of the 1MiB ring, p50 through h2 (baseline: on h1)", tether: ring50[1].cell("ms"), baseline: ring50[0].cell("ms"), ratio: ringRatio.cell("×"), n: cfg.n})
	rep.add(result{row: row, metric: "resume of the 1MiB ring, p99 through h2 (baseline: on h1)", tether: ring99[1].cell("ms"), baseline: ring99[0].cell("ms"), n: cfg.n})
	rep.note("%s: %d attaches per host and kind per repetition with offset and epoch, dial → last replay byte (at end: → the pty.replay frame); the PTY printed %s and sleeps (--pty-buffer %s)", row, o.reattach, sizeName(fill.size), sizeName(clusterPTYRing))
	return nil
}

// readResume dials url, a resume from offset from, and reads its replay
// to the last byte: replay_end_offset − from bytes (the header's
// start_offset is the ring's oldest byte, not the cursor).
func readResume(ctx context.Context, url string, from int64) (time.Duration, wire.Replay, error) {
	t0 := time.Now()
	c, err := dial(ctx, url, 256<<10)
	if err != nil {
		return 0, wire.Replay{}, err
	}
	defer c.close()
	_ = c.nc.SetDeadline(time.Now().Add(10 * time.Second))
	var rf wire.Replay
	want, got := int64(-1), int64(0)
	for want < 0 || got < want {
		h, err := c.next()
		if err != nil {
			return 0, rf, fmt.Errorf("after %d replay bytes: %w", got, err)
		}
		if h.OpCode == ws.OpText {
			p, err := io.ReadAll(&c.rd)
			if err != nil {
				return 0, rf, err
			}
			if rf, err = wire.DecodeReplay(p); err != nil {
				return 0, rf, fmt.Errorf("unexpected text frame %q: %w", p, err)
			}
			if rf.Reset || rf.Snapshot {
				return 0, rf, fmt.Errorf("a resume from %d was answered with %+v", from, rf)
			}
			want = rf.ReplayEndOffset - from
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
