package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tether-agent/tether/internal/bytesize"
)

// flags are tetherbench's command-line flags as given (config checks and
// converts them).
type flags struct {
	bin, repo, rev, rows string
	n                    int
	quick, verbose       bool
	set                  map[string]bool // the flags given on the command line

	ptySize, checkSize, ptyBuffer, ptyModel, ptyData string
	checkRuns, ptyStreams                            int
	ptyBigRing, ptyLines                             bool

	rpcClients string
	rpcDur     time.Duration

	reattachN, reattachSB      int
	reattachRing, reattachSize string

	storm, stormHist      int
	stormDial             bool
	stormPause            time.Duration
	idle                  int
	idleProf, perfDir     string
	idleSettle, quietWait time.Duration
	out                   string

	acp acpOpts

	rcClients                                         string
	rcWords                                           int
	rcDelay, rcKill, rcBackoff, rcBackMax, rcDeadline time.Duration
	rcDial                                            time.Duration
	clWords, clPrompts, clStorm, clFail, clReattach   int
	clDelay, clTTL                                    time.Duration
	clPTYSize                                         string
	fanViewers                                        string
	fanWords                                          int
	fanDelay                                          time.Duration
	burst                                             int
}

// parseFlags parses args (without the program name); -h and bad flags
// end the program as package flag does. With -quick, it lowers the sizes
// of the flags not given.
func parseFlags(args []string) *flags {
	f := &flags{set: map[string]bool{}}
	fs := flag.NewFlagSet("tetherbench", flag.ExitOnError)
	f.register(fs)
	_ = fs.Parse(args)
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	if f.quick {
		f.quickDefaults()
	}
	return f
}

// register defines every flag of fs into f.
func (f *flags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.bin, "tether", "", "tether binary to measure (default: build ./cmd/tether of -repo)")
	fs.StringVar(&f.repo, "repo", "", "tether repository to build (default: the parent of the bench module)")
	fs.StringVar(&f.rev, "rev", "", "build tether from this git revision of -repo (via git archive: uncommitted edits left out) instead of the working tree")
	fs.StringVar(&f.rows, "rows", strings.Join(allRows, ","), "rows to run: "+strings.Join(allRows, ",")+" (cluster: every cluster-* row)")
	fs.IntVar(&f.n, "n", 5, "repetitions of each row")
	fs.BoolVar(&f.quick, "quick", false, "small sizes and 3 repetitions: every row in under 2 minutes")
	fs.BoolVar(&f.verbose, "v", false, "progress on stderr")
	fs.StringVar(&f.ptySize, "pty-size", "256MiB", "bytes the child writes per PTY stream run (KiB/MiB suffix)")
	fs.StringVar(&f.checkSize, "pty-check-size", "8MiB", "bytes per completeness run")
	fs.IntVar(&f.checkRuns, "pty-check-runs", 20, "completeness runs (each must be byte-exact)")
	fs.IntVar(&f.ptyStreams, "pty-streams", 1, "concurrent PTY streams per throughput run (aggregate MiB/s)")
	fs.BoolVar(&f.ptyBigRing, "pty-big-ring", true, "also stream through a tether with a 1 GiB ring (no overrun possible)")
	fs.StringVar(&f.ptyBuffer, "pty-buffer", "", "tether --pty-buffer for the pty rows (default: tether's own, 1MiB)")
	fs.StringVar(&f.ptyModel, "pty-model", "on,off", "the PTY plugin's screen models in the pty rows: on, off (TETHER_PTY_SCREEN_MODEL=off), or on,off for a row each")
	fs.BoolVar(&f.ptyLines, "pty-lines", false, "the same as -pty-data lines")
	fs.StringVar(&f.ptyData, "pty-data", "letters", "what the pty rows' child writes, comma-separated, a row set each: letters (no newline), lines (coloured shell lines, tty output processing off), onlcr (the same lines through a tty with ONLCR on, as a shell's), binary (every byte value, raw tty)")
	fs.StringVar(&f.rpcClients, "rpc-clients", "1,16,100", "concurrent JSON-RPC clients, comma-separated")
	fs.DurationVar(&f.rpcDur, "rpc-duration", 2*time.Second, "measured time per client count and repetition")
	fs.IntVar(&f.reattachN, "reattach", 200, "attaches per repetition of the reattach row")
	fs.StringVar(&f.reattachRing, "reattach-ring", "1MiB", "tether --pty-buffer of the reattach row (filled to the brim)")
	fs.StringVar(&f.reattachSize, "reattach-sizes", "80x24,200x60", "terminal sizes of the reattach row's PTYs, comma-separated (the first also gets the raw ring replay)")
	fs.IntVar(&f.reattachSB, "reattach-scrollback", 1000, "tether --pty-scrollback of the reattach row")
	fs.IntVar(&f.storm, "storm", 256, "sockets resuming one key at once")
	fs.BoolVar(&f.stormDial, "storm-dial", false, "the storm's sockets are dialed in the storm (connect, upgrade, gateway.ready and resume timed together) instead of before it")
	fs.IntVar(&f.stormHist, "storm-history", 0, "words of a prompt run in the one session every storm resumes (0: a fresh empty session per repetition)")
	fs.DurationVar(&f.stormPause, "storm-pause", 0, "pause between storm repetitions (then wait for a quiet machine); 0 starts the next storm while the last one's sockets are torn down")
	fs.IntVar(&f.idle, "idle", 10000, "idle sockets held open")
	fs.StringVar(&f.idleProf, "idle-heap-profile", "", "save the in-process WS transport's heap profile (10,000 idle sockets) to this file")
	fs.DurationVar(&f.idleSettle, "idle-settle", 3*time.Second, "how long sockets sit before RSS is read (before and after)")
	fs.StringVar(&f.perfDir, "perf", "", "profile each row's measured phase with perf record (host, plugins, baselines) into this directory; the two largest costs per process go into the report")
	fs.StringVar(&f.out, "o", "", "also write the table to this file")
	fs.DurationVar(&f.quietWait, "wait-quiet", 0, "before each row, wait up to this long for the machine to be under 15% busy")
	fs.IntVar(&f.acp.updates, "acp-updates", 10000, "updates of the acp row's throughput phase (and of the session it loads)")
	fs.IntVar(&f.acp.burst, "acp-burst", 1000, "updates per prompt of the acp row's throughput phase")
	fs.IntVar(&f.acp.paced, "acp-paced", 300, "updates of the acp row's latency phase")
	fs.IntVar(&f.acp.delayMS, "acp-delay", 5, "ms between the latency phase's updates")
	fs.IntVar(&f.acp.warmup, "acp-warmup", 200, "updates of the acp row's warm-up prompt (not measured)")
	fs.IntVar(&f.acp.single, "acp-single", 10000, "updates of the acp row's last check, one unpaced prompt (0: skip it)")
	fs.IntVar(&f.acp.journal, "acp-journal-per-session", -1, "tether --journal-per-session in the acp row (-1: 4 × -acp-updates + 10000, so the loaded session is whole; 0: tether's default)")
	fs.StringVar(&f.acp.profile, "acp-cpu-profile", "", "after the acp row, profile the host's CPU for 3 s of a throughput phase into this file")
	fs.StringVar(&f.rcClients, "reconnect-clients", "1000", "clients of the reconnect-storm row, comma-separated: one storm on a fresh host each")
	fs.IntVar(&f.rcWords, "reconnect-words", 60, "words per prompt of the reconnect-storm row (one message.delta each)")
	fs.DurationVar(&f.rcDelay, "reconnect-delay", time.Second, "tether --echo-delay of the reconnect-storm row")
	fs.DurationVar(&f.rcKill, "reconnect-kill-after", time.Second, "how long after every run streams the WS plugin is killed")
	fs.DurationVar(&f.rcBackoff, "reconnect-backoff", 100*time.Millisecond, "first backoff bound of a reconnect (full jitter, doubling)")
	fs.DurationVar(&f.rcBackMax, "reconnect-backoff-max", 2*time.Second, "largest backoff bound of a reconnect")
	fs.DurationVar(&f.rcDeadline, "reconnect-deadline", 0, "after the kill, every client must have its run's message.complete by then (0: the run's length + 30s)")
	fs.DurationVar(&f.rcDial, "reconnect-dial-timeout", 5*time.Second, "dial timeout of a reconnect (connect, upgrade, gateway.ready)")
	fs.IntVar(&f.clWords, "cluster-words", 200, "words per prompt of the cluster-relay row (one message.delta each)")
	fs.IntVar(&f.clPrompts, "cluster-prompts", 6, "measured prompts per repetition of the cluster-relay row (alternately from h1 and h2)")
	fs.DurationVar(&f.clDelay, "cluster-echo-delay", 5*time.Millisecond, "tether --echo-delay of the cluster-relay row")
	fs.IntVar(&f.clStorm, "cluster-storm", 256, "sockets (spread over 3 hosts) resuming one key at once in the cluster-storm row")
	fs.DurationVar(&f.clTTL, "cluster-ttl", 2*time.Second, "tether --cluster-ttl of the cluster-failover row")
	fs.IntVar(&f.clFail, "cluster-failovers", 5, "kills of the owning host per repetition (one fresh cluster each) of the cluster-failover row")
	fs.StringVar(&f.clPTYSize, "cluster-pty-size", "32MiB", "bytes per stream of the cluster-pty row")
	fs.IntVar(&f.clReattach, "cluster-reattach", 100, "attaches per host and kind per repetition of the cluster-pty row")
	fs.StringVar(&f.fanViewers, "fanout-viewers", "200,1000", "viewers of the fanout row's one session, comma-separated: one measurement (a fresh host) each")
	fs.IntVar(&f.fanWords, "fanout-words", 40, "words of the fanout row's prompt (one message.delta each)")
	fs.IntVar(&f.burst, "burst", 10000, "clients of the burst row, each submitting a prompt to a session of its own at the same instant")
	fs.DurationVar(&f.fanDelay, "fanout-delay", 20*time.Millisecond, "tether --echo-delay of the fanout row (and the baseline's pause before each delta)")
}

// quickDefaults are -quick's sizes, for the flags not given.
func (f *flags) quickDefaults() {
	def := func(name string, apply func()) {
		if !f.set[name] {
			apply()
		}
	}
	def("n", func() { f.n = 3 })
	def("pty-size", func() { f.ptySize = "32MiB" })
	def("pty-check-size", func() { f.checkSize = "2MiB" })
	def("rpc-duration", func() { f.rpcDur = 500 * time.Millisecond })
	def("reattach", func() { f.reattachN = 100 })
	def("idle", func() { f.idle = 3000 })
	def("idle-settle", func() { f.idleSettle = time.Second })
	def("acp-updates", func() { f.acp.updates = 2000 })
	def("acp-paced", func() { f.acp.paced = 100 })
	def("acp-single", func() { f.acp.single = 0 })
	def("reconnect-clients", func() { f.rcClients = "200" })
	def("reconnect-words", func() { f.rcWords = 20 })
	def("reconnect-delay", func() { f.rcDelay = 250 * time.Millisecond })
	def("cluster-prompts", func() { f.clPrompts = 2 })
	def("cluster-failovers", func() { f.clFail = 2 })
	def("cluster-pty-size", func() { f.clPTYSize = "8MiB" })
	def("cluster-reattach", func() { f.clReattach = 30 })
	def("fanout-viewers", func() { f.fanViewers = "100,300" })
	def("burst", func() { f.burst = 1000 })
}

// config checks the flags and converts them into a config (without bin
// and repo, which run finds).
func (f *flags) config() (config, error) {
	cfg := config{n: f.n, quick: f.quick, verbose: f.verbose, checkRuns: f.checkRuns, ptyBuffer: f.ptyBuffer, ptyBigRing: f.ptyBigRing, ptyStreams: f.ptyStreams, rpcDur: f.rpcDur,
		reattachN: f.reattachN, storm: f.storm, stormPause: f.stormPause, stormHistory: f.stormHist, stormDial: f.stormDial, perfDir: f.perfDir, idle: f.idle, idleSettle: f.idleSettle, idleProfile: f.idleProf, out: f.out, waitQuiet: f.quietWait, rows: map[string]bool{},
		acp: f.acp, burst: f.burst}
	for _, step := range []func(*config) error{f.ptyConfig, f.rpcConfig, f.rowsConfig, f.reconnectConfig, f.clusterConfig, f.fanoutConfig} {
		if err := step(&cfg); err != nil {
			return config{}, err
		}
	}
	if cfg.n < 1 {
		return config{}, fmt.Errorf("-n must be at least 1")
	}
	if cfg.acp.journal < 0 {
		cfg.acp.journal = 4*cfg.acp.updates + 10000
	}
	return cfg, nil
}

// ptyConfig checks the flags of the pty and reattach rows.
func (f *flags) ptyConfig(cfg *config) error {
	var err error
	if cfg.ptySize, err = bytesize.Parse(f.ptySize, 1, maxSize); err != nil {
		return err
	}
	if cfg.checkSize, err = bytesize.Parse(f.checkSize, 1, maxSize); err != nil {
		return err
	}
	if cfg.reattachRing, err = bytesize.Parse(f.reattachRing, 1, maxSize); err != nil {
		return err
	}
	for _, s := range strings.Split(f.reattachSize, ",") {
		var sz screenSize
		if _, err := fmt.Sscanf(strings.TrimSpace(s), "%dx%d", &sz.cols, &sz.rows); err != nil || sz.cols < 1 || sz.rows < 1 {
			return fmt.Errorf("bad -reattach-sizes %q", f.reattachSize)
		}
		cfg.reattachSizes = append(cfg.reattachSizes, sz)
	}
	cfg.reattachScrollback = f.reattachSB
	data := f.ptyData
	if f.ptyLines {
		data = "lines"
	}
	for _, k := range strings.Split(data, ",") {
		k = strings.TrimSpace(k)
		if _, ok := ptyKinds[k]; !ok {
			return fmt.Errorf("bad -pty-data %q (letters, lines, onlcr, binary)", data)
		}
		cfg.ptyData = append(cfg.ptyData, k)
	}
	for _, m := range strings.Split(f.ptyModel, ",") {
		switch strings.TrimSpace(m) {
		case "on":
			cfg.ptyModels = append(cfg.ptyModels, true)
		case "off":
			cfg.ptyModels = append(cfg.ptyModels, false)
		default:
			return fmt.Errorf("bad -pty-model %q (on, off, or on,off)", f.ptyModel)
		}
	}
	return nil
}

// rpcConfig checks -rpc-clients.
func (f *flags) rpcConfig(cfg *config) error {
	var err error
	cfg.rpcClients, err = counts("-rpc-clients", f.rpcClients)
	return err
}

// rowsConfig checks -rows.
func (f *flags) rowsConfig(cfg *config) error {
	for _, r := range strings.Split(f.rows, ",") {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		if r == "cluster" {
			for _, c := range clusterRows {
				cfg.rows[c] = true
			}
			continue
		}
		ok := false
		for _, a := range allRows {
			ok = ok || a == r
		}
		if !ok {
			return fmt.Errorf("unknown row %q (rows: %s)", r, strings.Join(allRows, ","))
		}
		cfg.rows[r] = true
	}
	return nil
}

// reconnectConfig checks the flags of the reconnect-storm row.
func (f *flags) reconnectConfig(cfg *config) error {
	cfg.reconnect = reconnectOpts{words: f.rcWords, delay: f.rcDelay, killAfter: f.rcKill, backoff: f.rcBackoff, backoffMax: f.rcBackMax, deadline: f.rcDeadline, dialWait: f.rcDial}
	var err error
	if cfg.reconnect.clients, err = counts("-reconnect-clients", f.rcClients); err != nil {
		return err
	}
	if cfg.reconnect.words < 2 || cfg.reconnect.delay <= 0 || cfg.reconnect.backoff <= 0 || cfg.reconnect.backoffMax < cfg.reconnect.backoff {
		return fmt.Errorf("-reconnect-words must be ≥ 2, -reconnect-delay and -reconnect-backoff > 0, -reconnect-backoff-max ≥ -reconnect-backoff")
	}
	if cfg.reconnect.deadline == 0 {
		cfg.reconnect.deadline = time.Duration(cfg.reconnect.words)*cfg.reconnect.delay + 30*time.Second
	}
	return nil
}

// clusterConfig checks the flags of the cluster rows.
func (f *flags) clusterConfig(cfg *config) error {
	cfg.cluster = clusterOpts{words: f.clWords, prompts: f.clPrompts, echoDelay: f.clDelay, storm: f.clStorm, ttl: f.clTTL, failovers: f.clFail, reattach: f.clReattach}
	var err error
	if cfg.cluster.ptySize, err = bytesize.Parse(f.clPTYSize, 1, maxSize); err != nil {
		return err
	}
	if cfg.cluster.words < 1 || cfg.cluster.prompts < 1 || cfg.cluster.storm < 3 || cfg.cluster.failovers < 1 || cfg.cluster.reattach < 1 || cfg.cluster.echoDelay < 0 {
		return fmt.Errorf("-cluster-words, -cluster-prompts, -cluster-failovers and -cluster-reattach must be ≥ 1, -cluster-storm ≥ 3, -cluster-echo-delay ≥ 0")
	}
	return nil
}

// fanoutConfig checks the flags of the fanout row.
func (f *flags) fanoutConfig(cfg *config) error {
	cfg.fanout = fanoutOpts{words: f.fanWords, delay: f.fanDelay}
	var err error
	if cfg.fanout.viewers, err = counts("-fanout-viewers", f.fanViewers); err != nil {
		return err
	}
	if cfg.fanout.words < 1 || cfg.fanout.delay < 0 {
		return fmt.Errorf("-fanout-words must be ≥ 1, -fanout-delay ≥ 0")
	}
	return nil
}

// counts parses the comma-separated positive numbers s of the flag name.
func counts(name, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k <= 0 {
			return nil, fmt.Errorf("bad %s %q", name, s)
		}
		out = append(out, k)
	}
	return out, nil
}
