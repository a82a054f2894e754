// Command tetherbench measures tether against direct baselines (issue 6):
// PTY stream throughput and completeness, JSON-RPC round trips, PTY
// reattach, a resume storm, idle-socket memory and recovery times; the
// ACP gateway against a bare relay (issue 15); and a reconnect storm after
// kill -9 of the WS plugin, checking every event of every client (issue
// 17); and three hosts sharing one session table (the cluster rows, issue
// 16); and one session fanned out to many viewers (the fanout row, issue
// 17).
//
//	cd bench && go run ./cmd/tetherbench            # every row, recorded sizes
//	cd bench && go run ./cmd/tetherbench -quick     # every row in < 2 minutes
//	cd bench && go run ./cmd/tetherbench -rows pty,idle -n 3
//
// It builds ../cmd/tether (or takes -tether PATH), starts it on
// 127.0.0.1:0 with a temporary state dir for each row, and prints a
// benchstat-like table: each figure is the median over -n repetitions with
// its spread (largest distance from the median), and each ratio is taken
// per repetition between tether and its baseline measured back to back.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tether-agent/tether/internal/bytesize"
	"github.com/tether-agent/tether/testing/hostproc"
)

// config is the parsed flags.
type config struct {
	bin          string
	rows         map[string]bool
	n            int
	quick        bool
	verbose      bool
	ptySize      int64
	checkSize    int64
	checkRuns    int
	ptyBuffer    string
	ptyBigRing   bool
	ptyStreams   int
	ptyModels    []bool   // the PTY plugin's screen models on (true) or off, one pty row each
	ptyData      []string // kinds of data the pty rows stream (ptyKinds), a row set each
	rpcClients   []int
	rpcDur       time.Duration
	reattachN    int
	reattachRing int64
	// reattachSizes are the terminal sizes of the reattach row; the
	// first also gets the raw ring replay and the bare socket.
	reattachSizes      []screenSize
	reattachScrollback int
	storm              int
	stormPause         time.Duration
	stormHistory       int
	stormDial          bool
	perfDir            string // -perf: CPU profiles of each row's measured phase go here
	idle               int
	idleSettle         time.Duration
	idleProfile        string
	out                string
	waitQuiet          time.Duration
	repo               string // the tether repository (its testing/acp is the ACP kit)
	acp                acpOpts
	reconnect          reconnectOpts
	cluster            clusterOpts
	fanout             fanoutOpts
}

var allRows = []string{"pty", "rpc", "reattach", "storm", "idle", "recovery", "reconnect-storm", "acp",
	"cluster-relay", "cluster-storm", "cluster-failover", "cluster-pty", "fanout"}

// maxSize bounds the byte-size flags (-pty-size and the like).
const maxSize = 1 << 40

// tmpRoot holds every state dir and payload of this run.
var tmpRoot string

func main() {
	if len(os.Args) > 1 && os.Args[1] == "helper" {
		os.Exit(runHelper(os.Args[2:]))
	}
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("tetherbench", flag.ExitOnError)
	var (
		bin        = fs.String("tether", "", "tether binary to measure (default: build ./cmd/tether of -repo)")
		repo       = fs.String("repo", "", "tether repository to build (default: the parent of the bench module)")
		rev        = fs.String("rev", "", "build tether from this git revision of -repo (via git archive: uncommitted edits left out) instead of the working tree")
		rows       = fs.String("rows", strings.Join(allRows, ","), "rows to run: "+strings.Join(allRows, ",")+" (cluster: every cluster-* row)")
		n          = fs.Int("n", 5, "repetitions of each row")
		quick      = fs.Bool("quick", false, "small sizes and 3 repetitions: every row in under 2 minutes")
		verbose    = fs.Bool("v", false, "progress on stderr")
		ptySize    = fs.String("pty-size", "256MiB", "bytes the child writes per PTY stream run (KiB/MiB suffix)")
		checkSize  = fs.String("pty-check-size", "8MiB", "bytes per completeness run")
		checkRuns  = fs.Int("pty-check-runs", 20, "completeness runs (each must be byte-exact)")
		ptyStreams = fs.Int("pty-streams", 1, "concurrent PTY streams per throughput run (aggregate MiB/s)")
		ptyBigRing = fs.Bool("pty-big-ring", true, "also stream through a tether with a 1 GiB ring (no overrun possible)")
		ptyBuffer  = fs.String("pty-buffer", "", "tether --pty-buffer for the pty rows (default: tether's own, 1MiB)")
		ptyModel   = fs.String("pty-model", "on,off", "the PTY plugin's screen models in the pty rows: on, off (TETHER_PTY_SCREEN_MODEL=off), or on,off for a row each")
		ptyLines   = fs.Bool("pty-lines", false, "the same as -pty-data lines")
		ptyData    = fs.String("pty-data", "letters", "what the pty rows' child writes, comma-separated, a row set each: letters (no newline), lines (coloured shell lines, tty output processing off), onlcr (the same lines through a tty with ONLCR on, as a shell's), binary (every byte value, raw tty)")
		rpcClients = fs.String("rpc-clients", "1,16,100", "concurrent JSON-RPC clients, comma-separated")
		rpcDur     = fs.Duration("rpc-duration", 2*time.Second, "measured time per client count and repetition")
		reattachN  = fs.Int("reattach", 200, "attaches per repetition of the reattach row")
		reattachRg = fs.String("reattach-ring", "1MiB", "tether --pty-buffer of the reattach row (filled to the brim)")
		reattachSz = fs.String("reattach-sizes", "80x24,200x60", "terminal sizes of the reattach row's PTYs, comma-separated (the first also gets the raw ring replay)")
		reattachSB = fs.Int("reattach-scrollback", 1000, "tether --pty-scrollback of the reattach row")
		storm      = fs.Int("storm", 256, "sockets resuming one key at once")
		stormDial  = fs.Bool("storm-dial", false, "the storm's sockets are dialed in the storm (connect, upgrade, gateway.ready and resume timed together) instead of before it")
		stormHist  = fs.Int("storm-history", 0, "words of a prompt run in the one session every storm resumes (0: a fresh empty session per repetition)")
		stormPause = fs.Duration("storm-pause", 0, "pause between storm repetitions (then wait for a quiet machine); 0 starts the next storm while the last one's sockets are torn down")
		idle       = fs.Int("idle", 10000, "idle sockets held open")
		idleProf   = fs.String("idle-heap-profile", "", "save the in-process WS transport's heap profile (10,000 idle sockets) to this file")
		idleSettle = fs.Duration("idle-settle", 3*time.Second, "how long sockets sit before RSS is read (before and after)")
		perfDir    = fs.String("perf", "", "profile each row's measured phase with perf record (host, plugins, baselines) into this directory; the two largest costs per process go into the report")
		out        = fs.String("o", "", "also write the table to this file")
		quietWait  = fs.Duration("wait-quiet", 0, "before each row, wait up to this long for the machine to be under 15% busy")
		acpUpd     = fs.Int("acp-updates", 10000, "updates of the acp row's throughput phase (and of the session it loads)")
		acpBurst   = fs.Int("acp-burst", 1000, "updates per prompt of the acp row's throughput phase")
		acpPaced   = fs.Int("acp-paced", 300, "updates of the acp row's latency phase")
		acpDelay   = fs.Int("acp-delay", 5, "ms between the latency phase's updates")
		acpWarm    = fs.Int("acp-warmup", 200, "updates of the acp row's warm-up prompt (not measured)")
		acpSingle  = fs.Int("acp-single", 10000, "updates of the acp row's last check, one unpaced prompt (0: skip it)")
		acpJournal = fs.Int("acp-journal-per-session", -1, "tether --journal-per-session in the acp row (-1: 4 × -acp-updates + 10000, so the loaded session is whole; 0: tether's default)")
		acpProf    = fs.String("acp-cpu-profile", "", "after the acp row, profile the host's CPU for 3 s of a throughput phase into this file")
		rcClients  = fs.String("reconnect-clients", "1000", "clients of the reconnect-storm row, comma-separated: one storm on a fresh host each")
		rcWords    = fs.Int("reconnect-words", 60, "words per prompt of the reconnect-storm row (one message.delta each)")
		rcDelay    = fs.Duration("reconnect-delay", time.Second, "tether --echo-delay of the reconnect-storm row")
		rcKill     = fs.Duration("reconnect-kill-after", time.Second, "how long after every run streams the WS plugin is killed")
		rcBackoff  = fs.Duration("reconnect-backoff", 100*time.Millisecond, "first backoff bound of a reconnect (full jitter, doubling)")
		rcBackMax  = fs.Duration("reconnect-backoff-max", 2*time.Second, "largest backoff bound of a reconnect")
		rcDeadline = fs.Duration("reconnect-deadline", 0, "after the kill, every client must have its run's message.complete by then (0: the run's length + 30s)")
		rcDial     = fs.Duration("reconnect-dial-timeout", 5*time.Second, "dial timeout of a reconnect (connect, upgrade, gateway.ready)")
		clWords    = fs.Int("cluster-words", 200, "words per prompt of the cluster-relay row (one message.delta each)")
		clPrompts  = fs.Int("cluster-prompts", 6, "measured prompts per repetition of the cluster-relay row (alternately from h1 and h2)")
		clDelay    = fs.Duration("cluster-echo-delay", 5*time.Millisecond, "tether --echo-delay of the cluster-relay row")
		clStorm    = fs.Int("cluster-storm", 256, "sockets (spread over 3 hosts) resuming one key at once in the cluster-storm row")
		clTTL      = fs.Duration("cluster-ttl", 2*time.Second, "tether --cluster-ttl of the cluster-failover row")
		clFail     = fs.Int("cluster-failovers", 5, "kills of the owning host per repetition (one fresh cluster each) of the cluster-failover row")
		clPTYSize  = fs.String("cluster-pty-size", "32MiB", "bytes per stream of the cluster-pty row")
		clReattach = fs.Int("cluster-reattach", 100, "attaches per host and kind per repetition of the cluster-pty row")
		fanViewers = fs.String("fanout-viewers", "200,1000", "viewers of the fanout row's one session, comma-separated: one measurement (a fresh host) each")
		fanWords   = fs.Int("fanout-words", 40, "words of the fanout row's prompt (one message.delta each)")
		fanDelay   = fs.Duration("fanout-delay", 20*time.Millisecond, "tether --echo-delay of the fanout row (and the baseline's pause before each delta)")
	)
	_ = fs.Parse(os.Args[1:])
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick {
		quickDefault := func(name string, apply func()) {
			if !set[name] {
				apply()
			}
		}
		quickDefault("n", func() { *n = 3 })
		quickDefault("pty-size", func() { *ptySize = "32MiB" })
		quickDefault("pty-check-size", func() { *checkSize = "2MiB" })
		quickDefault("rpc-duration", func() { *rpcDur = 500 * time.Millisecond })
		quickDefault("reattach", func() { *reattachN = 100 })
		quickDefault("idle", func() { *idle = 3000 })
		quickDefault("idle-settle", func() { *idleSettle = time.Second })
		quickDefault("acp-updates", func() { *acpUpd = 2000 })
		quickDefault("acp-paced", func() { *acpPaced = 100 })
		quickDefault("acp-single", func() { *acpSingle = 0 })
		quickDefault("reconnect-clients", func() { *rcClients = "200" })
		quickDefault("reconnect-words", func() { *rcWords = 20 })
		quickDefault("reconnect-delay", func() { *rcDelay = 250 * time.Millisecond })
		quickDefault("cluster-prompts", func() { *clPrompts = 2 })
		quickDefault("cluster-failovers", func() { *clFail = 2 })
		quickDefault("cluster-pty-size", func() { *clPTYSize = "8MiB" })
		quickDefault("cluster-reattach", func() { *clReattach = 30 })
		quickDefault("fanout-viewers", func() { *fanViewers = "100,300" })
	}
	cfg := config{n: *n, quick: *quick, verbose: *verbose, checkRuns: *checkRuns, ptyBuffer: *ptyBuffer, ptyBigRing: *ptyBigRing, ptyStreams: *ptyStreams, rpcDur: *rpcDur,
		reattachN: *reattachN, storm: *storm, stormPause: *stormPause, stormHistory: *stormHist, stormDial: *stormDial, perfDir: *perfDir, idle: *idle, idleSettle: *idleSettle, idleProfile: *idleProf, out: *out, waitQuiet: *quietWait, rows: map[string]bool{},
		acp: acpOpts{updates: *acpUpd, burst: *acpBurst, paced: *acpPaced, delayMS: *acpDelay, warmup: *acpWarm, single: *acpSingle, journal: *acpJournal, profile: *acpProf}}
	var err error
	if cfg.ptySize, err = bytesize.Parse(*ptySize, 1, maxSize); err != nil {
		return fail(err)
	}
	if cfg.checkSize, err = bytesize.Parse(*checkSize, 1, maxSize); err != nil {
		return fail(err)
	}
	if cfg.reattachRing, err = bytesize.Parse(*reattachRg, 1, maxSize); err != nil {
		return fail(err)
	}
	for _, f := range strings.Split(*reattachSz, ",") {
		var sz screenSize
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%dx%d", &sz.cols, &sz.rows); err != nil || sz.cols < 1 || sz.rows < 1 {
			return fail(fmt.Errorf("bad -reattach-sizes %q", *reattachSz))
		}
		cfg.reattachSizes = append(cfg.reattachSizes, sz)
	}
	cfg.reattachScrollback = *reattachSB
	if *ptyLines {
		*ptyData = "lines"
	}
	for _, k := range strings.Split(*ptyData, ",") {
		k = strings.TrimSpace(k)
		if _, ok := ptyKinds[k]; !ok {
			return fail(fmt.Errorf("bad -pty-data %q (letters, lines, onlcr, binary)", *ptyData))
		}
		cfg.ptyData = append(cfg.ptyData, k)
	}
	for _, f := range strings.Split(*ptyModel, ",") {
		switch strings.TrimSpace(f) {
		case "on":
			cfg.ptyModels = append(cfg.ptyModels, true)
		case "off":
			cfg.ptyModels = append(cfg.ptyModels, false)
		default:
			return fail(fmt.Errorf("bad -pty-model %q (on, off, or on,off)", *ptyModel))
		}
	}
	for _, f := range strings.Split(*rpcClients, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k <= 0 {
			return fail(fmt.Errorf("bad -rpc-clients %q", *rpcClients))
		}
		cfg.rpcClients = append(cfg.rpcClients, k)
	}
	for _, r := range strings.Split(*rows, ",") {
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
			return fail(fmt.Errorf("unknown row %q (rows: %s)", r, strings.Join(allRows, ",")))
		}
		cfg.rows[r] = true
	}
	cfg.reconnect = reconnectOpts{words: *rcWords, delay: *rcDelay, killAfter: *rcKill, backoff: *rcBackoff, backoffMax: *rcBackMax, deadline: *rcDeadline, dialWait: *rcDial}
	for _, f := range strings.Split(*rcClients, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k <= 0 {
			return fail(fmt.Errorf("bad -reconnect-clients %q", *rcClients))
		}
		cfg.reconnect.clients = append(cfg.reconnect.clients, k)
	}
	if cfg.reconnect.words < 2 || cfg.reconnect.delay <= 0 || cfg.reconnect.backoff <= 0 || cfg.reconnect.backoffMax < cfg.reconnect.backoff {
		return fail(fmt.Errorf("-reconnect-words must be ≥ 2, -reconnect-delay and -reconnect-backoff > 0, -reconnect-backoff-max ≥ -reconnect-backoff"))
	}
	if cfg.reconnect.deadline == 0 {
		cfg.reconnect.deadline = time.Duration(cfg.reconnect.words)*cfg.reconnect.delay + 30*time.Second
	}
	cfg.cluster = clusterOpts{words: *clWords, prompts: *clPrompts, echoDelay: *clDelay, storm: *clStorm, ttl: *clTTL, failovers: *clFail, reattach: *clReattach}
	if cfg.cluster.ptySize, err = bytesize.Parse(*clPTYSize, 1, maxSize); err != nil {
		return fail(err)
	}
	if cfg.cluster.words < 1 || cfg.cluster.prompts < 1 || cfg.cluster.storm < 3 || cfg.cluster.failovers < 1 || cfg.cluster.reattach < 1 || cfg.cluster.echoDelay < 0 {
		return fail(fmt.Errorf("-cluster-words, -cluster-prompts, -cluster-failovers and -cluster-reattach must be ≥ 1, -cluster-storm ≥ 3, -cluster-echo-delay ≥ 0"))
	}
	cfg.fanout = fanoutOpts{words: *fanWords, delay: *fanDelay}
	for _, f := range strings.Split(*fanViewers, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k <= 0 {
			return fail(fmt.Errorf("bad -fanout-viewers %q", *fanViewers))
		}
		cfg.fanout.viewers = append(cfg.fanout.viewers, k)
	}
	if cfg.fanout.words < 1 || cfg.fanout.delay < 0 {
		return fail(fmt.Errorf("-fanout-words must be ≥ 1, -fanout-delay ≥ 0"))
	}
	if cfg.n < 1 {
		return fail(fmt.Errorf("-n must be at least 1"))
	}
	if cfg.acp.journal < 0 {
		cfg.acp.journal = 4*cfg.acp.updates + 10000
	}
	if cfg.repo, err = findRepo(*repo); err != nil && (*bin == "" || cfg.rows["acp"]) {
		return fail(err)
	}
	raiseNoFile()
	if cfg.perfDir != "" {
		if _, err := exec.LookPath("perf"); err != nil {
			return fail(fmt.Errorf("-perf needs perf (Debian: linux-perf): %w", err))
		}
		if err := os.MkdirAll(cfg.perfDir, 0o755); err != nil {
			return fail(err)
		}
	}

	tmpRoot, err = os.MkdirTemp("", "tetherbench-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmpRoot)

	start := time.Now()
	cfg.bin = *bin
	what := ""
	if cfg.bin == "" {
		if cfg.bin, what, err = buildTether(cfg.repo, *rev); err != nil {
			return fail(err)
		}
	} else if cfg.bin, err = filepath.Abs(cfg.bin); err != nil {
		return fail(err)
	} else {
		what = "binary " + cfg.bin
	}
	stopOnSignal()

	rep := &report{}
	rep.note("tether measured: %s", what)
	steps := []struct {
		name string
		fn   func(config, *report) error
	}{
		{"pty", rowPTY},
		{"rpc", rowRPC},
		{"reattach", rowReattach},
		{"storm", rowStorm},
		{"idle", rowIdle},
		{"recovery", rowRecovery},
		{"reconnect-storm", rowReconnect},
		{"acp", rowACP},
		{"cluster-relay", rowClusterRelay},
		{"cluster-storm", rowClusterStorm},
		{"cluster-failover", rowClusterFailover},
		{"cluster-pty", rowClusterPTY},
		{"fanout", rowFanout},
	}
	failed := false
	var busyBefore, loadAfter []string
	for _, st := range steps {
		if !cfg.rows[st.name] {
			continue
		}
		busy := waitQuiet(cfg.waitQuiet)
		t := time.Now()
		logf(cfg, "row %s (machine %.0f%% busy before it) ...", st.name, 100*busy)
		busyBefore = append(busyBefore, fmt.Sprintf("%s %.0f%%", st.name, 100*busy))
		if err := st.fn(cfg, rep); err != nil {
			failed = true
			rep.note("row %s failed: %v", st.name, err)
			fmt.Fprintf(os.Stderr, "tetherbench: row %s: %v\n", st.name, err)
		}
		logf(cfg, "row %s done in %v", st.name, time.Since(t).Round(time.Millisecond))
		loadAfter = append(loadAfter, fmt.Sprintf("%s %s", st.name, loadavg()))
	}
	rep.note("%d repetitions; figures are median ± largest distance from the median; ratio = tether/baseline per repetition", cfg.n)
	rep.note("machine: %s; total %v", machine(), time.Since(start).Round(time.Second))
	rep.note("shared machine: CPU busy (all processes) in the half second before each row: %s", strings.Join(busyBefore, ", "))
	rep.note("load average (1, 5, 15 min) after each row: %s", strings.Join(loadAfter, "; "))
	rep.write(os.Stdout)
	if cfg.out != "" {
		f, err := os.Create(cfg.out)
		if err != nil {
			return fail(err)
		}
		rep.write(f)
		f.Close()
	}
	if failed {
		return 1
	}
	return 0
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "tetherbench:", err)
	return 2
}

func logf(cfg config, format string, args ...any) {
	if cfg.verbose {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
}

// raiseNoFile lifts RLIMIT_NOFILE as far as allowed. Setting it
// explicitly (unlike the Go runtime's own raise) is inherited by the
// processes we start: tether and its plugins, and the baselines.
func raiseNoFile() {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return
	}
	for _, want := range []uint64{1 << 20, 262144, 65536} {
		if want <= lim.Max {
			break
		}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: want}) == nil {
			return
		}
	}
	lim.Cur = lim.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

// findRepo returns repo, or when it is empty the tether repository above
// the working directory.
func findRepo(repo string) (string, error) {
	if repo != "" {
		return filepath.Abs(repo)
	}
	d, err := hostproc.FindRepo(".")
	if err != nil {
		return "", fmt.Errorf("%w; pass -repo (or -tether for rows other than acp)", err)
	}
	return d, nil
}

// buildTether builds cmd/tether of repo (of its revision rev when not
// empty) into tmpRoot and says what it built (hostproc.Build: never
// touching the root module's go.mod/go.sum).
func buildTether(repo, rev string) (string, string, error) {
	git := func(args ...string) string {
		b, err := exec.Command("git", append([]string{"-C", repo}, args...)...).Output()
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	src := repo
	what := fmt.Sprintf("working tree of %s at %s", repo, git("rev-parse", "--short", "HEAD"))
	if st := git("status", "--porcelain", "--untracked-files=no"); st != "" {
		what += " with uncommitted changes to " + strings.Join(strings.Fields(strings.ReplaceAll(st, "M ", "")), " ")
	}
	if rev != "" {
		commit := git("rev-parse", rev)
		if commit == "" {
			return "", "", fmt.Errorf("no revision %q in %s", rev, repo)
		}
		src = filepath.Join(tmpRoot, "src")
		if err := os.MkdirAll(src, 0o755); err != nil {
			return "", "", err
		}
		arch := exec.Command("sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", repo, commit, src)
		arch.Stderr = os.Stderr
		if err := arch.Run(); err != nil {
			return "", "", fmt.Errorf("git archive %s: %w", rev, err)
		}
		what = fmt.Sprintf("commit %s (%s)", commit[:12], git("log", "-1", "--format=%cd %s", "--date=iso", commit))
	}
	out := filepath.Join(tmpRoot, "tether")
	if err := hostproc.Build(src, out, false); err != nil {
		return "", "", fmt.Errorf("building tether: %w", err)
	}
	return out, what, nil
}

func sizeName(n int64) string {
	switch {
	case n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// machine describes where the figures come from.
func machine() string {
	model := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if _, v, ok := strings.Cut(l, ":"); ok {
					model = strings.TrimSpace(v)
				}
				break
			}
		}
	}
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0]); len(f) >= 2 {
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				mem = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	kernel := "?"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%d CPUs, %s, %s RAM, Linux %s, %s", runtime.NumCPU(), model, mem, kernel, runtime.Version())
}
