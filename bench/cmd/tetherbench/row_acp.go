package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tether-agent/tether/testing/hostproc"
)

// acpOpts are the acp row's flags.
type acpOpts struct {
	updates int    // throughput phase (and the loaded session)
	burst   int    // updates per prompt of the throughput phase
	paced   int    // latency phase
	delayMS int    // its pacing
	warmup  int    // warm-up prompt
	single  int    // one unpaced prompt at the end (0: none)
	journal int    // tether --journal-per-session (0: tether's default)
	profile string // host CPU profile file, or ""
}

// acpSDKVersion is the @agentclientprotocol/sdk version testing/acp pins.
const acpSDKVersion = "2.4.0"

// acpKit returns testing/acp of repo and the node binary, or an error
// saying what to install.
func acpKit(repo string) (dir, node string, err error) {
	node, err = exec.LookPath("node")
	if err != nil {
		return "", "", fmt.Errorf("node is not installed: the acp row needs it (and `npm ci` in testing/acp): %w", err)
	}
	dir = filepath.Join(repo, "testing", "acp")
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", "@agentclientprotocol", "sdk", "package.json"))
	if err != nil {
		return "", "", fmt.Errorf("@agentclientprotocol/sdk is not installed: run `npm ci` in %s: %w", dir, err)
	}
	var pkg struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(b, &pkg); err != nil || pkg.Version != acpSDKVersion {
		return "", "", fmt.Errorf("@agentclientprotocol/sdk in %s is %q, want %s: run `npm ci` there", dir, pkg.Version, acpSDKVersion)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "ws", "package.json")); err != nil {
		return "", "", fmt.Errorf("ws is not installed: run `npm ci` in %s: %w", dir, err)
	}
	return dir, node, nil
}

// shellQuote quotes a word for tether's --agent-command parser (POSIX
// single quotes).
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// benchResult is what bench.mjs prints.
type benchResult struct {
	Latency *struct {
		MS []float64 `json:"ms"`
	} `json:"latency"`
	Throughput *struct {
		N               int      `json:"n"`
		Prompts         int      `json:"prompts"`
		TotalMS         float64  `json:"totalMS"`
		UpdatesPerSec   float64  `json:"updatesPerSec"`
		StreamingPerSec *float64 `json:"streamingPerSec"`
		Bursts          []struct {
			FirstUpdateMS float64 `json:"firstUpdateMS"`
			AgentStartMS  float64 `json:"agentStartMS"`
		} `json:"bursts"`
	} `json:"throughput"`
	Load *struct {
		ResponseMS    float64  `json:"responseMS"`
		FirstUpdateMS *float64 `json:"firstUpdateMS"`
		Replayed      int      `json:"replayed"`
		Complete      bool     `json:"complete"`
		Problems      []string `json:"problems"`
	} `json:"load"`
	Single *struct {
		Completed bool            `json:"completed"`
		Received  int             `json:"received"`
		PromptMS  float64         `json:"promptMS"`
		Error     json.RawMessage `json:"error"`
	} `json:"single"`
	Errors []string `json:"errors"`
}

// acpSide is one side of the row (tether or the relay) for one
// repetition: where bench.mjs connects and whose CPU it reads.
type acpSide struct {
	name  string
	url   string
	token string
	procs func() cpuSet // the side's processes, looked up when read
}

// acpRun is one bench.mjs run: its result and the CPU its side and the
// client spent in the throughput phase.
type acpRun struct {
	res benchResult
	cpu map[string]cpuTime // throughput phase, per process
}

// runBench runs bench.mjs against side with args; at its PHASE lines it
// reads the CPU of the side's processes (and of itself), and at the
// throughput phase's start it calls onThroughput (may be nil).
func runBench(kit, node string, side acpSide, args []string, onThroughput func()) (acpRun, error) {
	var run acpRun
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{filepath.Join(kit, "bench.mjs"), side.url}, args...)...)
	cmd.Dir = kit
	env := hostproc.Environ()
	if side.token != "" {
		env = append(env, "ACP_TEST_TOKEN="+side.token)
	}
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		return run, err
	}
	if err := cmd.Start(); err != nil {
		return run, fmt.Errorf("node bench.mjs: %w", err)
	}
	stderr := &tail{}
	var (
		before map[string]cpuTime
		cs     cpuSet
		wg     sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(errPipe)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(stderr, line)
			switch {
			case strings.HasPrefix(line, `PHASE {"phase":"throughput",`):
				cs = side.procs()
				cs["client"] = cmd.Process.Pid
				before = cs.readProcs()
				if onThroughput != nil {
					onThroughput()
				}
			case strings.HasPrefix(line, `PHASE {"phase":"throughput-end",`) && before != nil:
				after := cs.readProcs()
				run.cpu = map[string]cpuTime{}
				for k, v := range after {
					run.cpu[k] = v.sub(before[k])
				}
			}
		}
	}()
	wg.Wait()
	werr := cmd.Wait()
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &run.res); err != nil {
		return run, fmt.Errorf("bench.mjs against %s printed %q (%v, exit %v); stderr:\n%s", side.name, stdout.String(), err, werr, stderr)
	}
	if werr != nil || len(run.res.Errors) > 0 {
		return run, fmt.Errorf("bench.mjs against %s: %v: %s", side.name, werr, strings.Join(run.res.Errors, "; "))
	}
	return run, nil
}

// readProcs is read without the harness's own CPU: the client is a
// process of its own here.
func (cs cpuSet) readProcs() map[string]cpuTime {
	out := map[string]cpuTime{}
	for name, pid := range cs {
		out[name] = procCPU(pid)
	}
	return out
}

// childWith returns the first child of pid whose command line contains
// word, or 0.
func childWith(pid int, word string) int {
	for _, k := range children(pid) {
		cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", k))
		if err == nil && bytes.Contains(cl, []byte(word)) {
			return k
		}
	}
	return 0
}

// startRelay runs relay.mjs with the test agent behind it.
func startRelay(kit, node, agentDir string) (*server, string, error) {
	s := &server{stderr: &tail{}, exited: make(chan struct{})}
	s.cmd = exec.Command(node, filepath.Join(kit, "relay.mjs"), "--", node, filepath.Join(kit, "agent.mjs"), "--dir", agentDir)
	s.cmd.Dir = kit
	s.cmd.Env = hostproc.Environ()
	s.cmd.Stderr = s.stderr
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start relay.mjs: %w", err)
	}
	running.Store(s, struct{}{})
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	rd := bufio.NewReader(out)
	line, err := rd.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "relay listening on ") {
		s.kill()
		return nil, "", fmt.Errorf("relay.mjs printed %q (%v); stderr:\n%s", line, err, s.stderr)
	}
	go func() { _, _ = io.Copy(io.Discard, rd) }()
	return s, strings.TrimSpace(strings.TrimPrefix(line, "relay listening on ")), nil
}

// startACPTether runs tether with the test agent behind /acp.
func startACPTether(cfg config, kit, node string, profile bool) (*server, error) {
	agentDir, err := os.MkdirTemp(tmpRoot, "acp-agent-")
	if err != nil {
		return nil, err
	}
	command := strings.Join([]string{shellQuote(node), shellQuote(filepath.Join(kit, "agent.mjs")), "--dir", shellQuote(agentDir)}, " ")
	extra := []string{"--agent", "acp", "--agent-command", command}
	if cfg.acp.journal > 0 {
		extra = append(extra, "--journal-per-session", strconv.Itoa(cfg.acp.journal))
	}
	if profile {
		extra = append(extra, "--pprof")
	}
	return startTether(cfg.bin, tetherOpts{admin: profile, extra: extra})
}

func tetherACPSide(ts *server) acpSide {
	return acpSide{name: "tether", url: "ws://" + ts.addr + "/acp", token: ts.token, procs: func() cpuSet {
		cs := tetherCPUSet(ts)
		if pid := childWith(ts.pid(), "agent.mjs"); pid != 0 {
			cs["agent"] = pid
		}
		return cs
	}}
}

func rowACP(cfg config, rep *report) error {
	kit, node, err := acpKit(cfg.repo)
	if err != nil {
		return err
	}
	o := cfg.acp
	if o.burst < 1 || o.updates < 1 {
		return errors.New("-acp-updates and -acp-burst must be at least 1")
	}
	args := []string{"--warmup", strconv.Itoa(o.warmup), "--paced", strconv.Itoa(o.paced), "--delay", strconv.Itoa(o.delayMS),
		"--updates", strconv.Itoa(o.updates), "--burst", strconv.Itoa(o.burst), "--load", "--single", strconv.Itoa(o.single)}

	st := &acpStats{tCPU: map[string]cpuTime{}, rCPU: map[string]cpuTime{}}
	for r := 0; r < cfg.n; r++ {
		tr, rr, err := acpRep(cfg, kit, node, args, r)
		if err != nil {
			return err
		}
		if tr.res.Latency == nil || rr.res.Latency == nil || tr.res.Throughput == nil || rr.res.Throughput == nil || tr.res.Load == nil || rr.res.Load == nil {
			return fmt.Errorf("repetition %d: a phase is missing from bench.mjs's result", r)
		}
		st.add(r, tr, rr)
		logf(cfg, "acp rep %d: latency p50 tether %.3f relay %.3f ms; updates/s tether %.0f relay %.0f; load tether %.0f ms (%d updates), agent's own %.0f ms",
			r, percentile(tr.res.Latency.MS, .5), percentile(rr.res.Latency.MS, .5), tr.res.Throughput.UpdatesPerSec, rr.res.Throughput.UpdatesPerSec, tr.res.Load.ResponseMS, tr.res.Load.Replayed, rr.res.Load.ResponseMS)
	}
	st.report(cfg, rep)
	if o.profile != "" {
		if err := profileACP(cfg, kit, node); err != nil {
			return fmt.Errorf("acp profile: %w", err)
		}
		rep.note("acp: host CPU profile of 3 s of a throughput phase written to %s", o.profile)
	}
	return nil
}

// acpRep is repetition r of the acp row: bench.mjs with args against a
// fresh tether and a fresh relay.mjs, in alternating order.
func acpRep(cfg config, kit, node string, args []string, r int) (tr, rr acpRun, err error) {
	ts, err := startACPTether(cfg, kit, node, false)
	if err != nil {
		return tr, rr, err
	}
	defer ts.stop()
	relayDir, err := os.MkdirTemp(tmpRoot, "acp-relay-agent-")
	if err != nil {
		return tr, rr, err
	}
	rl, rlURL, err := startRelay(kit, node, relayDir)
	if err != nil {
		return tr, rr, err
	}
	defer rl.stop()
	tside := tetherACPSide(ts)
	rside := acpSide{name: "relay", url: rlURL, procs: func() cpuSet {
		cs := cpuSet{"relay": rl.cmd.Process.Pid}
		if pid := childWith(rl.cmd.Process.Pid, "agent.mjs"); pid != 0 {
			cs["agent"] = pid
		}
		return cs
	}}
	runT := func() error { var err error; tr, err = runBench(kit, node, tside, args, nil); return err }
	runR := func() error { var err error; rr, err = runBench(kit, node, rside, args, nil); return err }
	order := []func() error{runT, runR}
	if r%2 == 1 {
		order = []func() error{runR, runT}
	}
	for _, f := range order {
		if err := f(); err != nil {
			return tr, rr, fmt.Errorf("repetition %d: %w; tether stderr:\n%s", r, err, ts.stderr)
		}
	}
	return tr, rr, nil
}

// acpStats are the acp row's figures over its repetitions: t… tether,
// r… the relay, q… their ratio.
type acpStats struct {
	t50, t99, r50, r99, q50, q99        sample
	tUps, rUps, qUps, tStr, rStr, qStr  sample
	tTot, rTot, qTot                    sample
	tLoad, rLoad, qLoad, tLoadF, rLoadF sample
	tFirst, rFirst                      sample
	tSingle, rSingle                    int
	singleFails                         []string
	tLoadOK, rLoadOK                    int
	loadFails                           []string
	tCPU, rCPU                          map[string]cpuTime
	tCPUUpd, rCPUUpd                    int
	replayed                            []string
}

// add adds repetition r: tr through tether, rr through the relay.
func (st *acpStats) add(r int, tr, rr acpRun) {
	tl, rlat := tr.res.Latency.MS, rr.res.Latency.MS
	st.t50.add(percentile(tl, .5))
	st.t99.add(percentile(tl, .99))
	st.r50.add(percentile(rlat, .5))
	st.r99.add(percentile(rlat, .99))
	st.q50.add(percentile(tl, .5) / percentile(rlat, .5))
	st.q99.add(percentile(tl, .99) / percentile(rlat, .99))
	tt, rt := tr.res.Throughput, rr.res.Throughput
	st.tUps.add(tt.UpdatesPerSec)
	st.rUps.add(rt.UpdatesPerSec)
	st.qUps.add(tt.UpdatesPerSec / rt.UpdatesPerSec)
	if tt.StreamingPerSec != nil && rt.StreamingPerSec != nil {
		st.tStr.add(*tt.StreamingPerSec)
		st.rStr.add(*rt.StreamingPerSec)
		st.qStr.add(*tt.StreamingPerSec / *rt.StreamingPerSec)
	}
	st.tTot.add(tt.TotalMS)
	st.rTot.add(rt.TotalMS)
	st.qTot.add(tt.TotalMS / rt.TotalMS)
	var tf, rf []float64
	for _, b := range tt.Bursts {
		tf = append(tf, b.FirstUpdateMS)
	}
	for _, b := range rt.Bursts {
		rf = append(rf, b.FirstUpdateMS)
	}
	st.tFirst.add(median(tf))
	st.rFirst.add(median(rf))
	st.tLoad.add(tr.res.Load.ResponseMS)
	st.rLoad.add(rr.res.Load.ResponseMS)
	st.qLoad.add(tr.res.Load.ResponseMS / rr.res.Load.ResponseMS)
	if f := tr.res.Load.FirstUpdateMS; f != nil {
		st.tLoadF.add(*f)
	}
	if f := rr.res.Load.FirstUpdateMS; f != nil {
		st.rLoadF.add(*f)
	}
	st.replayed = append(st.replayed, strconv.Itoa(tr.res.Load.Replayed))
	for _, sd := range []struct {
		name string
		run  acpRun
		ok   *int
	}{{"tether", tr, &st.tLoadOK}, {"relay", rr, &st.rLoadOK}} {
		if sd.run.res.Load.Complete {
			*sd.ok++
			continue
		}
		p := sd.run.res.Load.Problems
		st.loadFails = append(st.loadFails, fmt.Sprintf("repetition %d, %s: %d updates replayed; %s", r, sd.name, sd.run.res.Load.Replayed, strings.Join(p[:min(2, len(p))], "; ")))
	}
	if st.single(r, "tether", tr) {
		st.tSingle++
	}
	if st.single(r, "relay", rr) {
		st.rSingle++
	}
	addRunCPU(st.tCPU, tr)
	addRunCPU(st.rCPU, rr)
	st.tCPUUpd += tt.N
	st.rCPUUpd += rt.N
}

// single reports whether the run's unpaced prompt completed, and notes
// why not when it failed.
func (st *acpStats) single(r int, side string, run acpRun) bool {
	s := run.res.Single
	if s == nil || s.Completed {
		return s != nil
	}
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Data    struct {
			Reason string `json:"reason"`
		} `json:"data"`
	}
	_ = json.Unmarshal(s.Error, &e)
	st.singleFails = append(st.singleFails, fmt.Sprintf("repetition %d, %s: after %d updates, %d %s: %s", r, side, s.Received, e.Code, e.Message, e.Data.Reason))
	return false
}

// addRunCPU adds run's CPU times to acc.
func addRunCPU(acc map[string]cpuTime, run acpRun) {
	for k, v := range run.cpu {
		a := acc[k]
		a.self += v.self
		a.children += v.children
		acc[k] = a
	}
}

// report adds the acp rows and notes to rep.
func (st *acpStats) report(cfg config, rep *report) {
	o := cfg.acp
	lat := fmt.Sprintf("acp update latency, %d paced %d ms apart", o.paced, o.delayMS)
	rep.add(result{row: lat, metric: "p50", tether: st.t50.cell("ms"), baseline: "relay " + st.r50.cell("ms"), ratio: st.q50.cell("×"),
		target: "ratio ≤ 1.5", met: yesNo(median(st.q50.xs) <= 1.5), n: cfg.n})
	rep.add(result{row: lat, metric: "p99", tether: st.t99.cell("ms"), baseline: "relay " + st.r99.cell("ms"), ratio: st.q99.cell("×"),
		target: "ratio ≤ 1.5", met: yesNo(median(st.q99.xs) <= 1.5), n: cfg.n})
	tput := fmt.Sprintf("acp throughput, %d updates in prompts of %d", o.updates, o.burst)
	rep.add(result{row: tput, metric: "updates/s (first prompt sent → last answered)", tether: st.tUps.cell("/s"), baseline: "relay " + st.rUps.cell("/s"), ratio: st.qUps.cell("×"),
		target: "ratio ≥ 0.67 (≤ 1.5× the time)", met: yesNo(median(st.qUps.xs) >= 1/1.5), n: cfg.n})
	rep.add(result{row: tput, metric: "updates/s while streaming", tether: st.tStr.cell("/s"), baseline: "relay " + st.rStr.cell("/s"), ratio: st.qStr.cell("×"), n: cfg.n})
	rep.add(result{row: tput, metric: "time to the last prompt's answer", tether: st.tTot.cell("ms"), baseline: "relay " + st.rTot.cell("ms"), ratio: st.qTot.cell("×"), n: cfg.n})
	rep.add(result{row: tput, metric: "prompt sent → its first update (median of prompts)", tether: st.tFirst.cell("ms"), baseline: "relay " + st.rFirst.cell("ms"), n: cfg.n})
	load := fmt.Sprintf("acp session/load, %d updates + %d prompts", o.updates, (o.updates+o.burst-1)/o.burst)
	rep.add(result{row: load, metric: "time to the load response", tether: st.tLoad.cell("ms"), baseline: "agent's own load via relay " + st.rLoad.cell("ms"), ratio: st.qLoad.cell("×"), n: cfg.n})
	rep.add(result{row: load, metric: "time to the first replayed update", tether: st.tLoadF.cell("ms"), baseline: "agent's own " + st.rLoadF.cell("ms"), n: cfg.n})
	rep.add(result{row: load, metric: "replay whole and in order", tether: fmt.Sprintf("%d/%d (replayed %s)", st.tLoadOK, cfg.n, strings.Join(st.replayed, ", ")),
		baseline: fmt.Sprintf("agent's own %d/%d", st.rLoadOK, cfg.n), target: "every time", met: yesNo(st.tLoadOK == cfg.n), n: cfg.n})
	for _, f := range st.loadFails {
		rep.note("acp session/load not whole: %s", f)
	}
	if o.single > 0 {
		rep.add(result{row: fmt.Sprintf("acp one unpaced prompt of %d updates", o.single), metric: "completed", tether: fmt.Sprintf("%d/%d", st.tSingle, cfg.n),
			baseline: fmt.Sprintf("relay %d/%d", st.rSingle, cfg.n), target: "every time", met: yesNo(st.tSingle == cfg.n), n: cfg.n})
		for _, f := range st.singleFails {
			rep.note("acp one unpaced prompt of %d updates failed: %s", o.single, f)
		}
	}
	journal := "tether's default"
	if o.journal > 0 {
		journal = strconv.Itoa(o.journal)
	}
	rep.note("acp: fresh tether (--agent acp, the test agent testing/acp/agent.mjs; --journal-per-session %s) and fresh relay.mjs per repetition, order alternating; client testing/acp/bench.mjs (SDK %s) with --warmup %d; the kit's scripts are the working tree's", journal, acpSDKVersion, o.warmup)
	rep.note("acp throughput phase, CPU per update: tether %s; relay %s", cpuPerProc(st.tCPU, st.tCPUUpd, "host", "ws-plugin", "agent", "client"), cpuPerProc(st.rCPU, st.rCPUUpd, "relay", "agent", "client"))
}

// cpuPerProc formats CPU time per update of the named processes.
func cpuPerProc(acc map[string]cpuTime, n int, names ...string) string {
	if n == 0 {
		return "—"
	}
	var parts []string
	total := 0.0
	for _, k := range names {
		t, ok := acc[k]
		if !ok {
			continue
		}
		us := (t.self + t.children) / float64(n) * 1e6
		total += us
		parts = append(parts, fmt.Sprintf("%s %.0f", k, us))
	}
	return fmt.Sprintf("%s = %.0f µs", strings.Join(parts, ", "), total)
}

// profileACP runs one more tether with --pprof and saves 3 s of the
// host's CPU profile, taken from the start of a throughput phase long
// enough to outlast it.
func profileACP(cfg config, kit, node string) error {
	ts, err := startACPTether(cfg, kit, node, true)
	if err != nil {
		return err
	}
	defer ts.stop()
	var (
		wg      sync.WaitGroup
		profErr error
	)
	fetch := func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequest(http.MethodGet, "http://"+ts.admin+"/debug/pprof/profile?seconds=3", nil)
			if err != nil {
				profErr = err
				return
			}
			req.Header.Set("Authorization", "Bearer "+ts.token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				profErr = err
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("GET /debug/pprof/profile: %s: %s", resp.Status, b)
			}
			if err == nil {
				err = os.WriteFile(cfg.acp.profile, b, 0o644)
			}
			profErr = err
		}()
	}
	// 3 s of the throughput phase: enough updates for it to last longer.
	args := []string{"--warmup", strconv.Itoa(cfg.acp.warmup), "--paced", "0", "--updates", strconv.Itoa(max(cfg.acp.updates, 30000)),
		"--burst", strconv.Itoa(cfg.acp.burst)}
	_, err = runBench(kit, node, tetherACPSide(ts), args, fetch)
	wg.Wait()
	if err != nil {
		err = fmt.Errorf("%w; tether stderr:\n%s", err, ts.stderr)
	}
	return errors.Join(err, profErr)
}
