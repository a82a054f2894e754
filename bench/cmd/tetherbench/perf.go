package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"
)

// perfRecs is one CPU profile per process of a row's measured phase,
// taken with `perf record -g -p PID` (-perf DIR): the Go binaries keep
// frame pointers and symbols, so perf sees every process of one side —
// host, WS plugin, PTY plugin, a baseline — without any change to them.
type perfRecs struct {
	row     string
	start   time.Time
	windows int // phases sampled (on calls)
	recs    []perfRec
}

type perfRec struct {
	name, file string
	cmd        *exec.Cmd
	ctl, ack   *os.File // perf's control FIFOs (enable/disable, and its answers)
}

// startPerf starts one perf record per process of procs (name → pid)
// when -perf is set, paused; on and off bracket the phases it profiles
// (any number: one file adds them up), and stopPerf ends it. With -perf
// unset it returns nil, and every method of a nil *perfRecs does nothing.
func startPerf(cfg config, row string, procs map[string]int) *perfRecs {
	if cfg.perfDir == "" {
		return nil
	}
	p := &perfRecs{row: row, start: time.Now()}
	names := make([]string, 0, len(procs))
	for name := range procs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		base := filepath.Join(cfg.perfDir, perfFileName(row, name))
		r, err := startPerfRec(name, base, procs[name])
		if err != nil {
			logf(cfg, "perf %s %s: %v", row, name, err)
			continue
		}
		p.recs = append(p.recs, r)
	}
	return p
}

func startPerfRec(name, base string, pid int) (perfRec, error) {
	r := perfRec{name: name, file: base + ".data"}
	for _, f := range []string{base + ".ctl", base + ".ack"} {
		_ = os.Remove(f)
		if err := syscall.Mkfifo(f, 0o600); err != nil {
			return r, err
		}
	}
	var err error
	// O_RDWR: opening a FIFO so never waits for the other end.
	if r.ctl, err = os.OpenFile(base+".ctl", os.O_RDWR, 0); err != nil {
		r.closeFiles()
		return r, err
	}
	if r.ack, err = os.OpenFile(base+".ack", os.O_RDWR, 0); err != nil {
		r.closeFiles()
		return r, err
	}
	r.cmd = exec.Command("perf", "record", "-q", "-F", "1999", "-g", "-D", "-1",
		"--control", "fifo:"+base+".ctl,"+base+".ack", "-p", fmt.Sprint(pid), "-o", r.file)
	r.cmd.Stderr = os.Stderr
	if err := r.cmd.Start(); err != nil {
		r.closeFiles()
		return r, err
	}
	// perf answers the first command once it is attached.
	if err := r.command("ping"); err != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.closeFiles()
		return r, err
	}
	return r, nil
}

// closeFiles closes and removes the control FIFOs.
func (r perfRec) closeFiles() {
	base := strings.TrimSuffix(r.file, ".data")
	for _, f := range []*os.File{r.ctl, r.ack} {
		if f != nil {
			_ = f.Close()
		}
	}
	_ = os.Remove(base + ".ctl")
	_ = os.Remove(base + ".ack")
}

// command sends perf one control command and waits for its ack.
func (r perfRec) command(c string) error {
	if _, err := r.ctl.WriteString(c + "\n"); err != nil {
		return err
	}
	_ = r.ack.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 16)
	if _, err := r.ack.Read(buf); err != nil {
		return fmt.Errorf("perf %s: no ack: %w", c, err)
	}
	return nil
}

// on starts (or resumes) sampling.
func (p *perfRecs) on() {
	if p == nil {
		return
	}
	for _, r := range p.recs {
		_ = r.command("enable")
	}
	p.windows++
}

// off pauses sampling.
func (p *perfRecs) off() {
	if p == nil {
		return
	}
	for _, r := range p.recs {
		_ = r.command("disable")
	}
}

// stopPerf ends the recordings, writes each process's tables next to its
// data (row-process.txt) and adds the two largest costs of each process
// to the report.
func stopPerf(cfg config, rep *report, p *perfRecs) {
	if p == nil {
		return
	}
	for _, r := range p.recs {
		_ = r.cmd.Process.Signal(syscall.SIGINT)
	}
	for _, r := range p.recs {
		_ = r.cmd.Wait()
		r.closeFiles()
	}
	for _, r := range p.recs {
		if err := writePerfTables(r.file, p.row, r.name, p.windows, time.Since(p.start)); err != nil {
			logf(cfg, "perf %s: %v", r.file, err)
			continue
		}
		self, cum := perfTable(r.file, false), perfTable(r.file, true)
		if len(self) == 0 {
			continue // a process that did nothing in the phase (the PTY plugin of an RPC row)
		}
		rep.note("%s, CPU profile of %s (%s): largest self in user space: %s; largest cumulative: %s", p.row, r.name,
			filepath.Base(strings.TrimSuffix(r.file, ".data")+".txt"),
			strings.Join(first(userSpace(self), 2), "; "), strings.Join(first(cum, 2), "; "))
	}
}

// writePerfTables writes the tables of the recording file (FILE.data)
// to FILE.txt: the largest self costs and the largest cumulative ones in
// user space. A recording with no samples gets no file.
func writePerfTables(file, row, proc string, windows int, d time.Duration) error {
	self := perfTable(file, false)
	if len(self) == 0 {
		return nil
	}
	cum := perfTable(file, true)
	head := fmt.Sprintf("# %s", row)
	if proc != "" {
		head += fmt.Sprintf(", %s: perf record -F 1999 -g, %d measured phase(s) within %.1fs", proc, windows, d.Seconds())
	}
	txt := fmt.Sprintf("%s\n\n## self (flat)\n%s\n\n## cumulative (children), user space, entry points left out\n%s\n",
		head, strings.Join(self, "\n"), strings.Join(cum, "\n"))
	return os.WriteFile(strings.TrimSuffix(file, ".data")+".txt", []byte(txt), 0o644)
}

// profiled is the number of extra rounds a row runs under perf: 1 with
// -perf, else 0.
func profiled(cfg config) int {
	if cfg.perfDir == "" {
		return 0
	}
	return 1
}

// userSpace drops the kernel's rows of a perfTable.
func userSpace(rows []string) []string {
	var out []string
	for _, r := range rows {
		if !strings.HasSuffix(r, " [kernel]") {
			out = append(out, r)
		}
	}
	return out
}

func first(s []string, n int) []string {
	if len(s) > n {
		s = s[:n]
	}
	out := make([]string, len(s))
	for i, l := range s {
		out[i] = strings.Join(strings.Fields(l), " ")
	}
	return out
}

// perfLine is a `perf report --stdio` row: a percentage (two with
// --children) then the symbol.
var perfLine = regexp.MustCompile(`^\s+([0-9.]+)%\s+(?:[0-9.]+%\s+)?\S+\s+\[([.k])\]\s+(.+)$`)

// perfTable is the top of perf report of file: by self time, or by
// cumulative time restricted to frames that say where the time goes
// (runtime entry points such as goexit and mcall left out).
func perfTable(file string, cumulative bool) []string {
	args := []string{"report", "-i", file, "--stdio", "-g", "none", "--sort", "dso,sym"}
	if cumulative {
		args = append(args, "--children")
	} else {
		args = append(args, "--no-children")
	}
	out, err := exec.Command("perf", args...).Output()
	if err != nil {
		return []string{fmt.Sprintf("perf report: %v", err)}
	}
	var rows []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := perfLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		sym, kernel := m[3], m[2] == "k"
		if cumulative && (kernel || perfEntryPoint.MatchString(sym)) {
			continue
		}
		if len(sym) > 160 {
			sym = sym[:157] + "…" // grpc's generic stream types run to a screen each
		}
		if kernel {
			sym += " [kernel]"
		}
		rows = append(rows, fmt.Sprintf("%6s%%  %s", m[1], sym))
		if len(rows) == 15 {
			break
		}
	}
	return rows
}

// perfEntryPoint: frames every goroutine or thread has under it.
var perfEntryPoint = regexp.MustCompile(`^(runtime\.(goexit|main|mstart|mcall|systemstack|goexit1|park_m|schedule|findRunnable|morestack)|main\.main|.*\.gowrap[0-9]+$|.*\.func[0-9]+$|entry_SYSCALL|do_syscall_64|x64_sys_call|__x64_sys)`)

// perfUnsafe is what a file name made of a row's name leaves out.
var perfUnsafe = regexp.MustCompile(`[^A-Za-z0-9]+`)

func perfFileName(row, proc string) string {
	clean := func(s string) string { return strings.Trim(perfUnsafe.ReplaceAllString(s, "-"), "-") }
	return clean(row) + "." + clean(proc)
}
