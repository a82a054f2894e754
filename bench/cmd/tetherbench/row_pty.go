package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gobwas/ws"
)

// ptyScript is run in each PTY: echo off, a ready mark, then it reads a
// file name from its input and writes that file to the terminal and exits
// (exec: the PTY's child exits right after its last byte).
const ptyScript = `stty -echo; printf R; read f; exec cat "$f"`

// ptyLinesScript is ptyScript for a payload of lines: the tty's output
// processing is off too (stty -opost), so \n stays \n and the hash holds.
const ptyLinesScript = `stty -echo -opost; printf R; read f; exec cat "$f"`

// ptyRawScript is ptyScript for binary data: the tty in raw mode passes
// every byte through unchanged.
const ptyRawScript = `stty raw -echo; printf R; read f; exec cat "$f"`

// ptyKind is one kind of data the PTY rows' child writes (-pty-data).
type ptyKind struct {
	label  string // in the row's name
	script string
	make   func(size int64, seed uint64) (*payload, error)
}

// ptyKinds are the kinds -pty-data names.
var ptyKinds = map[string]ptyKind{
	"letters": {"", ptyScript, makePayload},
	"lines":   {", shell lines (-opost)", ptyLinesScript, makeShellLines},
	"onlcr":   {", shell lines (ONLCR)", ptyScript, makeShellLinesONLCR},
	"binary":  {", binary (raw tty)", ptyRawScript, makeBinary},
}

// makeBinary is makePayload with every byte value: what a raw tty passes
// through unchanged (an image, a compressed stream).
func makeBinary(size int64, seed uint64) (*payload, error) {
	return randomPayload("binary", size, seed, func(r *mrand.Rand) byte { return byte(r.Uint32()) })
}

// payload is a file the child writes: letters and digits only, so the
// tty's output processing (\n -> \r\n) changes nothing and what arrives
// must equal "R" + the file, byte for byte. It is pseudo-random, so a
// lost, repeated or reordered chunk changes the hash.
type payload struct {
	path string
	size int64
	sum  [32]byte // sha256 of "R" + the file
}

func makePayload(size int64, seed uint64) (*payload, error) {
	const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	return randomPayload("payload", size, seed, func(r *mrand.Rand) byte { return alnum[r.IntN(len(alnum))] })
}

// randomPayload writes size bytes drawn by next from a generator seeded
// with seed, to a file named after kind, with the sha256 of "R" + them.
func randomPayload(kind string, size int64, seed uint64, next func(*mrand.Rand) byte) (*payload, error) {
	p := &payload{path: filepath.Join(tmpRoot, fmt.Sprintf("%s-%d-%d", kind, size, seed)), size: size}
	f, err := os.Create(p.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	h.Write([]byte("R"))
	w := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	r := mrand.New(mrand.NewPCG(seed, uint64(size)))
	buf := make([]byte, 64<<10)
	for left := size; left > 0; {
		k := min(int64(len(buf)), left)
		for i := range buf[:k] {
			buf[i] = next(r)
		}
		if _, err := w.Write(buf[:k]); err != nil {
			return nil, err
		}
		left -= k
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	copy(p.sum[:], h.Sum(nil))
	return p, nil
}

// streamResult is one PTY stream run as the client saw it.
type streamResult struct {
	elapsed time.Duration // from sending the file name to the close frame
	got     int64         // output bytes after the ready mark
	frames  int           // binary frames received
	ok      bool          // sha256 and length as expected, closed with 4410
	code    int
	reason  string
}

func (r streamResult) mibps(size int64) float64 {
	return float64(size) / (1 << 20) / r.elapsed.Seconds()
}

// ptyStream attaches to url, waits for the ready mark, asks the child to
// write p and reads everything to the close frame.
func ptyStream(url string, p *payload) (streamResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := dial(ctx, url, 256<<10)
	if err != nil {
		return streamResult{}, err
	}
	defer c.drop()
	_ = c.nc.SetDeadline(time.Now().Add(10 * time.Minute))
	var (
		res   streamResult
		h     hash.Hash = sha256.New()
		total int64
		t0    time.Time
		buf   = make([]byte, 256<<10)
	)
	for {
		hd, err := c.next()
		var ce *closeError
		if errors.As(err, &ce) {
			res.elapsed = time.Since(t0)
			res.code, res.reason = ce.code, ce.reason
			break
		}
		if err != nil {
			return res, fmt.Errorf("after %d bytes: %w", total, err)
		}
		if hd.OpCode == ws.OpText { // pty.replay (tether only)
			if _, err := io.Copy(io.Discard, &c.rd); err != nil {
				return res, err
			}
			continue
		}
		n, err := io.CopyBuffer(h, &c.rd, buf)
		if err != nil {
			return res, err
		}
		res.frames++
		if total == 0 && n > 0 && t0.IsZero() {
			// The first output byte is the ready mark: echo is off.
			if err := c.write(ws.OpBinary, []byte(p.path+"\n")); err != nil {
				return res, err
			}
			t0 = time.Now()
		}
		total += n
	}
	if t0.IsZero() {
		return res, fmt.Errorf("closed %d %q before the ready mark", res.code, res.reason)
	}
	res.got = total - 1
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	res.ok = sum == p.sum && res.code == 4410
	return res, nil
}

func randToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "bench" + hex.EncodeToString(b[:])
}

// cpuSet snapshots the CPU time of the processes of one side of the row.
type cpuSet map[string]int // name -> pid

func (cs cpuSet) read() map[string]cpuTime {
	out := map[string]cpuTime{"client": {self: selfCPU()}}
	for name, pid := range cs {
		out[name] = procCPU(pid)
	}
	return out
}

// tetherCPUSet is tether's processes: the host and its plugins.
func tetherCPUSet(ts *server) cpuSet {
	cs := cpuSet{"host": ts.pid()}
	if pid, err := pluginPID(ts.pid(), "ws"); err == nil {
		cs["ws-plugin"] = pid
	}
	if pid, err := pluginPID(ts.pid(), "pty"); err == nil {
		cs["pty-plugin"] = pid
	}
	return cs
}

// cpuPer formats the CPU deltas between before and after divided by n
// operations, in µs per operation.
func cpuPer(before, after map[string]cpuTime, n int) string {
	var parts []string
	total := 0.0
	for _, k := range []string{"host", "ws-plugin", "pty-plugin", "client"} {
		a, ok := after[k]
		if !ok {
			continue
		}
		d := a.sub(before[k])
		us := (d.self + d.children) / float64(n) * 1e6
		total += us
		parts = append(parts, fmt.Sprintf("%s %.0f", k, us))
	}
	return fmt.Sprintf("%s; total %.0f µs CPU per operation", strings.Join(parts, ", "), total)
}

// cpuAcc adds up CPU deltas per process over runs.
type cpuAcc struct {
	sum   map[string]cpuTime
	bytes int64
}

func (a *cpuAcc) add(before, after map[string]cpuTime, n int64) {
	if a.sum == nil {
		a.sum = map[string]cpuTime{}
	}
	for k, v := range after {
		d := v.sub(before[k])
		t := a.sum[k]
		t.self += d.self
		t.children += d.children
		a.sum[k] = t
	}
	a.bytes += n
}

// total is the CPU seconds per GiB of every process, children and the
// client included.
func (a *cpuAcc) total() float64 {
	if a.bytes == 0 {
		return 0
	}
	t := 0.0
	for _, c := range a.sum {
		t += c.self + c.children
	}
	return t / (float64(a.bytes) / (1 << 30))
}

func (a *cpuAcc) String() string {
	if a.bytes == 0 {
		return "—"
	}
	gib := float64(a.bytes) / (1 << 30)
	var parts []string
	total := 0.0
	for _, k := range []string{"host", "ws-plugin", "pty-plugin", "direct", "client"} {
		t, ok := a.sum[k]
		if !ok {
			continue
		}
		p := fmt.Sprintf("%s %.2f", k, t.self/gib)
		if t.children > 0 {
			p += fmt.Sprintf(" (+child sh/cat %.2f)", t.children/gib)
		}
		total += t.self + t.children
		parts = append(parts, p)
	}
	return fmt.Sprintf("%s; total %.2f CPU-s/GiB", strings.Join(parts, ", "), total/gib)
}

func rowPTY(cfg config, rep *report) error {
	for _, k := range cfg.ptyData {
		if err := rowPTYKind(cfg, rep, ptyKinds[k]); err != nil {
			return fmt.Errorf("pty %s: %w", k, err)
		}
	}
	return nil
}

func rowPTYKind(cfg config, rep *report, pk ptyKind) error {
	logf(cfg, "pty%s: writing payloads (%s, %s)", pk.label, sizeName(cfg.ptySize), sizeName(cfg.checkSize))
	script, kind, newPayload := pk.script, pk.label, pk.make
	big, err := newPayload(cfg.ptySize, 1)
	if err != nil {
		return err
	}
	check, err := newPayload(cfg.checkSize, 2)
	if err != nil {
		return err
	}
	direct, err := startHelper("ptydirect", script)
	if err != nil {
		return err
	}
	defer direct.stop()
	for k, model := range cfg.ptyModels {
		label := kind
		if len(cfg.ptyModels) > 1 || !model {
			label += ", screen model " + map[bool]string{true: "on", false: "off"}[model]
		}
		if k > 0 {
			check = nil // one completeness row is enough
		}
		if err := ptyRows(cfg, rep, direct, big, check, cfg.ptyBuffer, script, label, model); err != nil {
			return err
		}
	}
	if cfg.ptyBigRing {
		// The same stream with a ring that cannot be overrun: what the data
		// path itself delivers when no byte is dropped for want of flow
		// control.
		return ptyRows(cfg, rep, direct, big, nil, "1024MiB", script, kind, true)
	}
	return nil
}

// ptyRows runs the throughput row (and the completeness row when check is
// not nil) against a tether started with --pty-buffer ring ("" = default)
// running script in its PTYs, with the PTY plugin's screen models on or
// off (TETHER_PTY_SCREEN_MODEL=off); label goes into the row's name.
func ptyRows(cfg config, rep *report, direct *server, big, check *payload, ring, script, label string, model bool) error {
	cmdline := fmt.Sprintf("sh -c '%s'", script)
	var extra, env []string
	if ring != "" {
		extra = []string{"--pty-buffer", ring}
		label += ", ring " + ring
	}
	if !model {
		env = []string{"TETHER_PTY_SCREEN_MODEL=off"}
	}
	ts, err := startTether(cfg.bin, tetherOpts{ptyCommand: cmdline, admin: true, extra: extra, env: env})
	if err != nil {
		return err
	}
	defer ts.stop()
	if f := os.Getenv("TETHERBENCH_STDERR"); f != "" {
		defer func() { _ = os.WriteFile(f, []byte(ts.stderr.all()), 0o644) }()
	}
	pb := &ptyBench{cfg: cfg, ts: ts, direct: direct}
	name := "pty-stream " + sizeName(cfg.ptySize) + label
	if cfg.ptyStreams > 1 {
		name = fmt.Sprintf("pty-stream %d×%s%s", cfg.ptyStreams, sizeName(cfg.ptySize), label)
	}
	pb.throughput(rep, name, big)
	if cfg.perfDir != "" {
		pb.profile(rep, name, big)
	}
	if check == nil || cfg.checkRuns == 0 {
		return nil
	}
	pb.completeness(rep, label, check)
	return nil
}

// ptyBench is a pty row's tether and its direct baseline.
type ptyBench struct {
	cfg    config
	ts     *server
	direct *server
}

// url is the URL of a stream through tether (a fresh PTY) or of the
// direct baseline.
func (pb *ptyBench) url(isTether bool) string {
	if isTether {
		return pb.ts.wsURL("/api/pty", "attach="+randToken())
	}
	return "ws://" + pb.direct.addr + "/pty"
}

// stream runs one stream (or -pty-streams at once, when acc is not nil)
// of p through tether or directly and says why it was not complete, if
// so; acc adds up its CPU.
func (pb *ptyBench) stream(isTether bool, p *payload, acc *cpuAcc) (streamResult, string) {
	cfg := pb.cfg
	cs := cpuSet{"direct": pb.direct.pid()}
	if isTether {
		cs = tetherCPUSet(pb.ts)
	}
	u := pb.url(isTether)
	before := cs.read()
	r, err := ptyStream(u, p)
	if k := cfg.ptyStreams; k > 1 && acc != nil {
		// k streams at once on k PTYs: the throughput is of all of
		// them together, and every one must be complete.
		rs := make([]streamResult, k)
		errs := make([]error, k)
		var wg sync.WaitGroup
		for j := 1; j < k; j++ {
			uj := pb.url(isTether)
			wg.Add(1)
			go func() { defer wg.Done(); rs[j], errs[j] = ptyStream(uj, p) }()
		}
		wg.Wait()
		rs[0], errs[0] = r, err
		for j := range rs {
			if errs[j] != nil && err == nil {
				err = errs[j]
			}
			if !rs[j].ok && r.ok {
				r = rs[j]
			}
			r.elapsed = max(r.elapsed, rs[j].elapsed)
		}
		r.elapsed /= time.Duration(k) // so that mibps reports the aggregate
	}
	after := cs.read()
	// A child left writing (its socket was closed early) would steal
	// CPU from the next run.
	if pid, ok := cs["pty-plugin"]; ok {
		waitNoChildren(pid, time.Minute)
	}
	waitNoChildren(pb.direct.pid(), time.Minute)
	switch {
	case err != nil:
		return r, err.Error()
	case !r.ok:
		return r, fmt.Sprintf("got %d of %d bytes, closed %d %q", r.got, p.size, r.code, r.reason)
	}
	if acc != nil {
		acc.add(before, after, p.size*int64(max(cfg.ptyStreams, 1)))
	}
	return r, ""
}

// throughput is the row name: cfg.n pairs of streams of big, tether and
// direct, alternating which goes first.
func (pb *ptyBench) throughput(rep *report, name string, big *payload) {
	cfg := pb.cfg
	var tput, dput, ratio sample
	var tcpu, dcpu cpuAcc
	var tframe, dframe sample // bytes per WebSocket frame
	var fails []string
	completeT := 0
	for i := 0; i < cfg.n; i++ {
		// Alternate which goes first so drift hits both alike.
		order := []bool{true, false}
		if i%2 == 1 {
			order = []bool{false, true}
		}
		var tr, dr streamResult
		var tf, df string
		for _, isTether := range order {
			if isTether {
				tr, tf = pb.stream(true, big, &tcpu)
			} else {
				dr, df = pb.stream(false, big, &dcpu)
			}
		}
		if tf != "" {
			fails = append(fails, fmt.Sprintf("tether run %d: %s", i, tf))
		} else {
			completeT++
			tput.add(tr.mibps(big.size))
			tframe.add(float64(big.size) / float64(max(tr.frames, 1)) / 1024)
		}
		if df != "" {
			fails = append(fails, fmt.Sprintf("direct run %d: %s", i, df))
		} else {
			dput.add(dr.mibps(big.size))
			dframe.add(float64(big.size) / float64(max(dr.frames, 1)) / 1024)
		}
		if tf == "" && df == "" {
			ratio.add(tr.mibps(big.size) / dr.mibps(big.size))
		}
		rate := func(r streamResult, fail string) string {
			if fail != "" {
				return "incomplete: " + fail
			}
			return fmt.Sprintf("%.1f MiB/s", r.mibps(big.size))
		}
		logf(cfg, "pty: run %d tether %s, direct %s", i, rate(tr, tf), rate(dr, df))
		if strings.Contains(tf, "EOF") {
			time.Sleep(500 * time.Millisecond) // the WS plugin is being restarted
		}
	}
	rep.add(result{row: name, metric: "throughput", tether: tput.cell("MiB/s"), baseline: dput.cell("MiB/s"),
		ratio: ratio.cell("×"), target: "ratio ≥ 0.95", met: yesNo(len(ratio.xs) > 0 && median(ratio.xs) >= 0.95), n: len(ratio.xs)})
	rep.add(result{row: name, metric: "complete streams", tether: fmt.Sprintf("%d/%d", completeT, cfg.n),
		target: fmt.Sprintf("%d/%d", cfg.n, cfg.n), met: yesNo(completeT == cfg.n), n: cfg.n})
	for _, f := range fails {
		rep.note("%s: %s", name, f)
	}
	if len(ratio.xs) > 0 {
		// The spread of single pairs is wide on two vCPUs shared by five
		// processes: the quartiles of the pairs' ratios, and the ratio of
		// the totals (all bytes over all time, each side), say how far
		// the median can be trusted.
		var tt, dt float64
		for i := range tput.xs {
			if i < len(dput.xs) {
				tt += 1 / tput.xs[i]
				dt += 1 / dput.xs[i]
			}
		}
		rep.note("%s: ratio per pair (tether/direct, %d pairs): quartiles %.2f / %.2f / %.2f, min %.2f, max %.2f; ratio of the totals (seconds per MiB summed on each side) %.2f; CPU per GiB tether/direct %.2f",
			name, len(ratio.xs), percentile(ratio.xs, .25), median(ratio.xs), percentile(ratio.xs, .75), percentile(ratio.xs, 0), percentile(ratio.xs, 1), dt/tt, tcpu.total()/max(dcpu.total(), 1e-9))
	}
	rep.note("%s CPU per GiB streamed, tether: %s; %s per WebSocket frame", name, &tcpu, tframe.cell("KiB"))
	rep.note("%s CPU per GiB streamed, direct: %s; %s per WebSocket frame", name, &dcpu, dframe.cell("KiB"))
}

// profile is one more stream each, under perf record and not counted
// (perf's own sampling costs CPU the measured runs did not pay).
func (pb *ptyBench) profile(rep *report, name string, big *payload) {
	cfg := pb.cfg
	pp := startPerf(cfg, name+" tether", tetherCPUSet(pb.ts))
	pp.on()
	_, tf := pb.stream(true, big, nil)
	stopPerf(cfg, rep, pp)
	pp = startPerf(cfg, name+" direct", map[string]int{"direct": pb.direct.pid()})
	pp.on()
	_, df := pb.stream(false, big, nil)
	stopPerf(cfg, rep, pp)
	if tf != "" || df != "" {
		rep.note("%s: profiled runs: tether %q, direct %q", name, tf, df)
	}
}

// completeness is the pty-complete row: cfg.checkRuns streams of check
// each way, the child exiting right after its last byte; each must be
// byte-exact.
func (pb *ptyBench) completeness(rep *report, label string, check *payload) {
	cfg := pb.cfg
	okT, okD := 0, 0
	var failT []string
	for i := 0; i < cfg.checkRuns; i++ {
		if _, f := pb.stream(true, check, nil); f == "" {
			okT++
		} else {
			failT = append(failT, f)
			if strings.Contains(f, "EOF") {
				time.Sleep(500 * time.Millisecond)
			}
		}
		if _, f := pb.stream(false, check, nil); f == "" {
			okD++
		}
	}
	rep.add(result{row: "pty-complete " + sizeName(cfg.checkSize) + label, metric: "byte-exact runs",
		tether: fmt.Sprintf("%d/%d", okT, cfg.checkRuns), baseline: fmt.Sprintf("%d/%d", okD, cfg.checkRuns),
		target: fmt.Sprintf("%d/%d", cfg.checkRuns, cfg.checkRuns), met: yesNo(okT == cfg.checkRuns), n: cfg.checkRuns})
	for i, f := range failT {
		if i == 5 {
			rep.note("pty-complete: %d more failures", len(failT)-5)
			break
		}
		rep.note("pty-complete failure: %s", f)
	}
}
