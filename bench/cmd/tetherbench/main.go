// Command tetherbench measures tether against direct baselines (issue 6):
// PTY stream throughput and completeness, JSON-RPC round trips, PTY
// reattach, a resume storm, idle-socket memory and recovery times; the
// ACP gateway against a bare relay (issue 15); and a reconnect storm after
// kill -9 of the WS plugin, checking every event of every client (issue
// 17); and three hosts sharing one session table (the cluster rows, issue
// 16); and one session fanned out to many viewers (the fanout row, issue
// 17); and a burst of prompts submitted at the same instant (the burst
// row, issue 28).
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
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

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
	burst              int // clients of the burst row
}

var allRows = []string{"pty", "rpc", "reattach", "storm", "idle", "recovery", "reconnect-storm", "acp",
	"cluster-relay", "cluster-storm", "cluster-failover", "cluster-pty", "fanout", "burst"}

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

// rowSteps are the rows in the order they run.
var rowSteps = []struct {
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
	{"burst", rowBurst},
}

// run is the program: 0 when every row ran, 1 when one failed, 2 for a
// bad flag or set-up.
func run() int {
	f := parseFlags(os.Args[1:])
	cfg, err := f.config()
	if err != nil {
		return fail(err)
	}
	if cfg.repo, err = findRepo(f.repo); err != nil && (f.bin == "" || cfg.rows["acp"]) {
		return fail(err)
	}
	raiseNoFile()
	if err := preparePerf(cfg.perfDir); err != nil {
		return fail(err)
	}

	tmpRoot, err = os.MkdirTemp("", "tetherbench-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmpRoot)

	start := time.Now()
	var what string
	if cfg.bin, what, err = tetherBinary(cfg.repo, f.bin, f.rev); err != nil {
		return fail(err)
	}
	stopOnSignal()

	rep := &report{}
	rep.note("tether measured: %s", what)
	failed, busyBefore, loadAfter := runRows(cfg, rep)
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

// preparePerf checks that -perf can work and makes its directory.
func preparePerf(dir string) error {
	if dir == "" {
		return nil
	}
	if _, err := exec.LookPath("perf"); err != nil {
		return fmt.Errorf("-perf needs perf (Debian: linux-perf): %w", err)
	}
	return os.MkdirAll(dir, 0o755)
}

// tetherBinary is the binary to measure — bin, or else cmd/tether of repo
// (at rev) built into tmpRoot — and what it is, for the report.
func tetherBinary(repo, bin, rev string) (path, what string, err error) {
	if bin == "" {
		return buildTether(repo, rev)
	}
	if path, err = filepath.Abs(bin); err != nil {
		return "", "", err
	}
	return path, "binary " + path, nil
}

// runRows runs the rows cfg selects, in order, each after waiting for a
// quiet machine (-wait-quiet), and notes a failed row in rep. It returns
// whether one failed, and per row how busy the machine was before it and
// the load average after it.
func runRows(cfg config, rep *report) (failed bool, busyBefore, loadAfter []string) {
	for _, st := range rowSteps {
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
	return failed, busyBefore, loadAfter
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
