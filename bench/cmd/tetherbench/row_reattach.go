package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
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

// screenSize is a terminal size of the reattach row.
type screenSize struct{ cols, rows int }

func (s screenSize) String() string { return fmt.Sprintf("%dx%d", s.cols, s.rows) }

// rowReattach measures fresh attaches to a PTY whose screen is full after
// 2 × the ring of coloured shell-like lines, for each of cfg's terminal
// sizes: each is a snapshot (reason initial), timed from the dial to its
// last byte and sized. On the first size it also measures the raw replay
// of the whole ring (a resume from the ring's start: what a snapshot
// replaces) and, as the floor, the ring's bytes over a bare socket.
func rowReattach(cfg config, rep *report) error {
	ring := cfg.reattachRing
	fill, err := makeShellLines(max(2*ring, 2<<20), 5)
	if err != nil {
		return err
	}
	// Each PTY's shell waits for a line, so that it prints for the size
	// it was given; then it prints the lines and sleeps: the ring stays
	// full.
	ts, err := startTether(cfg.bin, tetherOpts{
		ptyCommand: fmt.Sprintf(`sh -c 'read x; cat %s; exec sleep 3600'`, fill.path),
		extra:      []string{"--pty-buffer", sizeName(ring), "--pty-scrollback", fmt.Sprint(cfg.reattachScrollback)},
	})
	if err != nil {
		return err
	}
	defer ts.stop()
	direct, err := startHelper("ptydirect", "true")
	if err != nil {
		return err
	}
	defer direct.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for k, size := range cfg.reattachSizes {
		if err := reattachSize(ctx, cfg, rep, ts, direct, fill, size, k == 0); err != nil {
			return fmt.Errorf("%v: %w", size, err)
		}
	}
	return nil
}

// reattachSize is rowReattach for one terminal size; raw adds the raw
// ring replay and the bare socket.
func reattachSize(ctx context.Context, cfg config, rep *report, ts *server, direct *server, fill *payload, size screenSize, raw bool) error {
	rp := &reattachPTY{ctx: ctx, ts: ts, token: randToken(), size: size}
	rp.url = ts.wsURL("/api/pty", "attach="+rp.token)
	starts, err := rp.fill(fill)
	if err != nil {
		return err
	}
	cs := tetherCPUSet(ts)
	st, err := rp.measure(cfg, cs, direct, raw)
	if err != nil {
		return err
	}
	row := fmt.Sprintf("reattach %v, %s ring", size, sizeName(cfg.reattachRing))
	if cfg.perfDir != "" {
		if err := rp.profile(cfg, rep, row, cs); err != nil {
			return err
		}
	}
	st.report(cfg, rep, row, fill, starts, raw)
	return nil
}

// reattachPTY is the reattach row's PTY of one terminal size.
type reattachPTY struct {
	ctx   context.Context
	ts    *server
	token string
	url   string // its /api/pty URL, with the token
	size  screenSize
}

// start sizes the PTY and types the line its shell waits for, and stays
// until output comes: input sent right before a close may be dropped by
// the host.
func (rp *reattachPTY) start() error {
	p, err := client.AttachPTY(rp.ctx, rp.ts.baseURL(), rp.token, client.PTYOptions{Options: client.Options{Token: rp.ts.token}, ReadTimeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.Resize(rp.size.cols, rp.size.rows); err != nil {
		return err
	}
	if _, err = p.Write([]byte("\r")); err != nil {
		return err
	}
	_, err = p.Read(make([]byte, 4096)) // the echo, or the lines
	return err
}

// fill starts the PTY and waits until the whole payload went through
// the ring; it returns how often the starting line was typed.
func (rp *reattachPTY) fill(fill *payload) (starts int, err error) {
	if err := rp.start(); err != nil {
		return 0, err
	}
	started, starts := time.Now(), 1
	deadline := time.Now().Add(60 * time.Second)
	for {
		var rf wire.Replay
		p, err := client.AttachPTY(rp.ctx, rp.ts.baseURL(), rp.token, client.PTYOptions{Options: client.Options{Token: rp.ts.token}})
		if err == nil {
			rf = p.Replay()
			p.Abort()
		}
		if err == nil && rf.ReplayEndOffset >= fill.size {
			return starts, nil
		}
		if err == nil && rf.ReplayEndOffset == 0 && time.Since(started) > 2*time.Second {
			// The line typed did not reach the shell: type it again.
			if err := rp.start(); err != nil {
				return starts, err
			}
			started = time.Now()
			starts++
		}
		if time.Now().After(deadline) {
			return starts, fmt.Errorf("the PTY has not printed %d bytes after 60s: %+v %v; tether stderr:\n%s", fill.size, rf, err, rp.ts.stderr)
		}
		time.Sleep(50 * time.Millisecond) // polling the PTY's output
	}
}

// reattachStats are the reattach row's figures for one size.
type reattachStats struct {
	s50, s99, h50, h99, sb, r50, r99, b50, b99 sample
	reasons                                    map[string]int
	cpuBefore, cpuAfter                        map[string]cpuTime
	attaches                                   int
}

// measure is cfg.n repetitions of cfg.reattachN snapshot attaches (and,
// with raw, as many raw ring replays and bare-socket reads).
func (rp *reattachPTY) measure(cfg config, cs cpuSet, direct *server, raw bool) (*reattachStats, error) {
	ring := cfg.reattachRing
	st := &reattachStats{reasons: map[string]int{}}
	for r := 0; r < cfg.n; r++ {
		waitQuiet(2 * time.Second)
		var sl, hl, rl, bl []time.Duration
		var bytes []float64
		for i := 0; i < cfg.reattachN; i++ {
			if r == 0 && i == 0 {
				st.cpuBefore = cs.read()
			}
			d, hd, rf, err := readReplayTimed(rp.ctx, rp.url, -1)
			if r == cfg.n-1 && i == cfg.reattachN-1 {
				st.cpuAfter = cs.read()
			}
			st.attaches++
			if err != nil {
				return nil, fmt.Errorf("attach %d: %w", i, err)
			}
			if !rf.Snapshot || rf.Reason != wire.ReasonInitial || rf.Cols != rp.size.cols || rf.Rows != rp.size.rows {
				return nil, fmt.Errorf("attach %d: %+v, want a %v snapshot with reason initial", i, rf, rp.size)
			}
			st.reasons[rf.Reason]++
			sl = append(sl, d)
			hl = append(hl, hd)
			bytes = append(bytes, float64(rf.SnapshotBytes))
			if !raw {
				continue
			}
			rd, bd, err := rp.rawAndBare(direct, ring, rf, i)
			if err != nil {
				return nil, err
			}
			rl = append(rl, rd)
			bl = append(bl, bd)
		}
		sms, hms := durationsMS(sl), durationsMS(hl)
		st.s50.add(percentile(sms, .5))
		st.s99.add(percentile(sms, .99))
		st.h50.add(percentile(hms, .5))
		st.h99.add(percentile(hms, .99))
		st.sb.add(median(bytes))
		if raw {
			rms, bms := durationsMS(rl), durationsMS(bl)
			st.r50.add(percentile(rms, .5))
			st.r99.add(percentile(rms, .99))
			st.b50.add(percentile(bms, .5))
			st.b99.add(percentile(bms, .99))
			logf(cfg, "reattach %v rep %d: snapshot p50 %.2fms p99 %.2fms, %.0f bytes (raw %s ring p50 %.2fms p99 %.2fms; bare socket p50 %.2fms p99 %.2fms)",
				rp.size, r, percentile(sms, .5), percentile(sms, .99), median(bytes), sizeName(ring), percentile(rms, .5), percentile(rms, .99), percentile(bms, .5), percentile(bms, .99))
		} else {
			logf(cfg, "reattach %v rep %d: snapshot p50 %.2fms p99 %.2fms, %.0f bytes", rp.size, r, percentile(sms, .5), percentile(sms, .99), median(bytes))
		}
	}
	return st, nil
}

// rawAndBare times, after snapshot attach i (rf), the raw ring (a
// resume from its first byte) and the ring's bytes over a bare socket.
func (rp *reattachPTY) rawAndBare(direct *server, ring int64, rf wire.Replay, i int) (rawD, bareD time.Duration, err error) {
	first, epoch := rf.ReplayEndOffset-ring, rf.Epoch
	rawD, rf, err = readReplay(rp.ctx, rp.url+fmt.Sprintf("&epoch=%s&offset=%d", epoch, first), -1)
	if err != nil {
		return 0, 0, fmt.Errorf("raw replay %d: %w", i, err)
	}
	if rf.Reset || rf.StartOffset != first || rf.ReplayEndOffset-first != ring {
		return 0, 0, fmt.Errorf("raw replay %d: %+v, want a resume of the whole %d-byte ring from %d", i, rf, ring, first)
	}
	bareD, _, err = readReplay(rp.ctx, "ws://"+direct.addr+fmt.Sprintf("/replay?n=%d", ring), ring)
	if err != nil {
		return 0, 0, fmt.Errorf("baseline %d: %w", i, err)
	}
	return rawD, bareD, nil
}

// profile is one more round of snapshot attaches, under perf record and
// not counted (-perf).
func (rp *reattachPTY) profile(cfg config, rep *report, row string, cs cpuSet) error {
	pp := startPerf(cfg, row, cs)
	defer stopPerf(cfg, rep, pp)
	for i := 0; i < cfg.reattachN; i++ {
		pp.on()
		_, _, _, err := readReplayTimed(rp.ctx, rp.url, -1)
		pp.off()
		if err != nil {
			return fmt.Errorf("profiled attach %d: %w", i, err)
		}
	}
	return nil
}

// report adds the size's rows and notes to rep.
func (st *reattachStats) report(cfg config, rep *report, row string, fill *payload, starts int, raw bool) {
	ring := cfg.reattachRing
	rep.add(result{row: row, metric: "snapshot bytes", tether: st.sb.cell("B"), n: cfg.n})
	rep.add(result{row: row, metric: "snapshot p50 to pty.replay frame", tether: st.h50.cell("ms"), n: cfg.n})
	rep.add(result{row: row, metric: "snapshot p99 to pty.replay frame", tether: st.h99.cell("ms"), n: cfg.n})
	if raw {
		rep.add(result{row: row, metric: "snapshot p50 (baseline: raw ring)", tether: st.s50.cell("ms"), baseline: st.r50.cell("ms"), ratio: ratioCell(st.s50, st.r50), n: cfg.n})
		rep.add(result{row: row, metric: "snapshot p99 (baseline: raw ring)", tether: st.s99.cell("ms"), baseline: st.r99.cell("ms"), ratio: ratioCell(st.s99, st.r99), target: "≤ 5 ms",
			met: yesNo(median(st.s99.xs) <= 5), n: cfg.n})
		rep.add(result{row: row, metric: "raw ring p50 (baseline: bare socket)", tether: st.r50.cell("ms"), baseline: st.b50.cell("ms"), ratio: ratioCell(st.r50, st.b50), n: cfg.n})
		rep.add(result{row: row, metric: "raw ring p99 (baseline: bare socket)", tether: st.r99.cell("ms"), baseline: st.b99.cell("ms"), ratio: ratioCell(st.r99, st.b99), n: cfg.n})
	} else {
		rep.add(result{row: row, metric: "snapshot p50", tether: st.s50.cell("ms"), n: cfg.n})
		rep.add(result{row: row, metric: "snapshot p99", tether: st.s99.cell("ms"), target: "≤ 5 ms", met: yesNo(median(st.s99.xs) <= 5), n: cfg.n})
	}
	what := "fresh attaches"
	if raw {
		what = "fresh attaches, raw replays and bare-socket reads (the plugins took no part in the last)"
	}
	rep.note("%s: CPU per attach (host, plugins and client; %s): %s", row, what, cpuPer(st.cpuBefore, st.cpuAfter, st.attaches))
	rep.note("%s: %d attaches per repetition to a PTY that printed %s of coloured shell-like lines (--pty-scrollback %d), dial to last snapshot byte; reasons %v", row, cfg.reattachN, sizeName(fill.size), cfg.reattachScrollback, st.reasons)
	if starts > 1 {
		rep.note("%s: the line that starts the PTY's output was typed %d times: the first was lost", row, starts)
	}
	if raw {
		rep.note("%s: raw ring = the same PTY's whole %s ring as a resume (epoch and offset = its first byte), dial to last byte; bare socket = a gobwas/ws server writing %s on upgrade (the floor)", row, sizeName(ring), sizeName(ring))
	}
}

// ratioCell is the median and spread of a/b per repetition.
func ratioCell(a, b sample) string {
	var r sample
	for i := range min(len(a.xs), len(b.xs)) {
		r.add(a.xs[i] / b.xs[i])
	}
	return r.cell("×")
}

// makeShellLines writes size bytes (a line more at most) of coloured
// shell-like output — ls -l, compiler, test and git log lines, some
// longer than 80 columns — to a file, the same for the same seed, with
// the sha256 of "R" + the file as makePayload.
func makeShellLines(size int64, seed uint64) (*payload, error) {
	return shellLines(size, seed, false)
}

// makeShellLinesONLCR is makeShellLines for a tty that keeps its output
// processing on (ONLCR, as a shell's terminal does): the hash is of what
// the client receives, every \n turned into \r\n.
func makeShellLinesONLCR(size int64, seed uint64) (*payload, error) {
	return shellLines(size, seed, true)
}

func shellLines(size int64, seed uint64, onlcr bool) (*payload, error) {
	p := &payload{path: filepath.Join(tmpRoot, fmt.Sprintf("shell-%d-%d", size, seed))}
	f, err := os.Create(p.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	h.Write([]byte("R"))
	var w *bufio.Writer
	if onlcr {
		w = bufio.NewWriterSize(io.MultiWriter(f, crlfWriter{h}), 1<<20)
	} else {
		w = bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	}
	r := mrand.New(mrand.NewPCG(seed, uint64(size)))
	word := func() string {
		const letters = "abcdefghijklmnopqrstuvwxyz"
		b := make([]byte, 3+r.IntN(9))
		for i := range b {
			b[i] = letters[r.IntN(len(letters))]
		}
		return string(b)
	}
	for n := 0; p.size < size; n++ {
		var line string
		switch r.IntN(5) {
		case 0:
			line = fmt.Sprintf("-rw-r--r-- 1 dev dev %7d Dec  %d 12:%02d \x1b[01;32m%s.go\x1b[0m", r.IntN(1e6), 1+r.IntN(28), r.IntN(60), word())
		case 1:
			line = fmt.Sprintf("drwxr-xr-x 2 dev dev    4096 Nov %2d 09:%02d \x1b[01;34m%s\x1b[0m", 1+r.IntN(30), r.IntN(60), word())
		case 2:
			line = fmt.Sprintf("\x1b[1m%s/%s.go:%d:%d:\x1b[0m \x1b[1;31merror:\x1b[0m undefined: %s (%s %s %s %s)", word(), word(), 1+r.IntN(900), 1+r.IntN(80), word(), word(), word(), word(), word())
		case 3:
			line = fmt.Sprintf("\x1b[32m--- PASS\x1b[0m: Test%s (%d.%02ds)", word(), r.IntN(3), r.IntN(100))
		default:
			line = fmt.Sprintf("\x1b[33m%07x\x1b[m %s %s %s \x1b[2m(%d hours ago)\x1b[m", r.Uint32()>>4, word(), word(), word(), 1+r.IntN(48))
		}
		k, err := fmt.Fprintf(w, "%s\n", line)
		if err != nil {
			return nil, err
		}
		p.size += int64(k)
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	copy(p.sum[:], h.Sum(nil))
	return p, nil
}

// crlfWriter writes to w what a tty with ONLCR makes of its input: every
// \n as \r\n.
type crlfWriter struct{ w io.Writer }

func (c crlfWriter) Write(b []byte) (int, error) {
	out := bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n"))
	if _, err := c.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}
