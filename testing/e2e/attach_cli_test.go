package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/wire"
)

// cliEnv is the environment of a client command run by these tests: the
// test's own without TETHER_* (the token comes from the host's token
// file, never argv) and without TMUX.
func cliEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TETHER_") && !strings.HasPrefix(kv, "TMUX") && !strings.HasPrefix(kv, "GORACE=") {
			env = append(env, kv)
		}
	}
	return append(env, "GORACE=atexit_sleep_ms=0")
}

// runCLI runs the tether binary with args and stdin, and returns stdout,
// stderr and the exit code (it fails the test past 60 s).
func runCLI(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	return runCLIEnv(t, nil, stdin, args...)
}

// runCLIEnv is runCLI with the KEY=VALUE variables env added to cliEnv.
func runCLIEnv(t *testing.T, env []string, stdin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e2e.Build(t), args...)
	cmd.Env = append(cliEnv(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if ctx.Err() != nil || (err != nil && !errors.As(err, &ee)) {
		t.Fatalf("tether %s: %v (%v)\nstdout %q\nstderr %q", strings.Join(args, " "), err, ctx.Err(), out.String(), errb.String())
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// TestAttachCLIEndOfInput: `echo CMD | tether attach --new | od -c`
// types CMD into a new PTY, shows its output, says the token once
// attached, writes nothing but the PTY's output to a stdout that is not a
// terminal (no screen reset, no mode resets), and ends the shell with its
// input: exit 0 with "session ended", and the PTY is gone, not left for
// --pty-ttl.
func TestAttachCLIEndOfInput(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "sh"}})
	// --settle gives sh time to start on a loaded machine: its echo of
	// the input comes from the kernel before sh has run.
	stdout, stderr, code := runCLI(t, "echo hi-$((6*7))\n", "attach", "--new", "--settle", "3s", "--url", s.URL, "--state-dir", s.StateDir)
	if code != 0 {
		t.Errorf("exit status %d, want 0; stderr %q", code, stderr)
	}
	if !strings.Contains(stdout, "hi-42") {
		t.Errorf("stdout %q lacks the command's output hi-42", stdout)
	}
	for _, seq := range []string{"\x1b[?1049l", "\x1bc", "\x1b[3J", "\x1b[?25h", "\x1b[?2004l"} {
		if strings.Contains(stdout, seq) {
			t.Errorf("stdout %q holds %q: tether wrote a control sequence of its own to a pipe", stdout, seq)
		}
	}
	m := regexp.MustCompile(`^tether: attach token (\S+)\ntether: attached; Enter ~\. to detach\ntether: session ended \(4410\)\n$`).FindStringSubmatch(stderr)
	if m == nil || !wire.ValidAttachToken(m[1]) {
		t.Fatalf("stderr %q, want the token line, the attached line and the session's end", stderr)
	}
	// The shell ended with its input: no PTY is left behind.
	waitFor(t, func() bool {
		out, _, code := runCLI(t, "", "ptys", "--json", "--state-dir", s.StateDir)
		return code == 0 && !strings.Contains(out, m[1])
	}, "the PTY of the piped attach to be gone")
}

// TestAttachCLIPipedJoinLeavesTheShell: piping into `tether attach TOKEN`
// of a PTY this command did not make types the input and detaches, and
// leaves that shell running (it is someone's terminal).
func TestAttachCLIPipedJoinLeavesTheShell(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "sh"}})
	tok := attachToken(t)
	page := ptyDial(t, s, "attach="+tok)
	defer page.Close()
	_, stderr, code := runCLI(t, "echo joined\n", "attach", "--settle", "1s", "--url", s.URL, "--state-dir", s.StateDir, tok)
	if code != 0 || !strings.Contains(stderr, "end of input: detached") {
		t.Fatalf("piped join: exit %d, stderr %q; want a detach at the end of input", code, stderr)
	}
	out, _, code := runCLI(t, "", "ptys", "--json", "--state-dir", s.StateDir)
	if code != 0 || !strings.Contains(out, tok) {
		t.Errorf("after a piped join, tether ptys (status %d) %s no longer lists %s", code, out, tok)
	}
}

// TestPTYsListsTheBrowsersTerminal: a PTY opened through /api/pty, as the
// page does, is listed by `tether ptys` (and --json) with its pid,
// command, size, writer and viewers, and `tether attach TOKEN` joins it.
func TestPTYsListsTheBrowsersTerminal(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "sh"}})
	tok := attachToken(t)
	page := ptyDial(t, s, "attach="+tok)
	if err := page.Resize(91, 37); err != nil {
		t.Fatal(err)
	}
	if err := page.Write([]byte("echo pid=$$ size=$(stty size)\r")); err != nil {
		t.Fatal(err)
	}
	if err := page.WaitOutput(ctxT(t, 15*time.Second), func(b []byte) bool { return bytes.Contains(b, []byte("size=37 91")) }); err != nil {
		t.Fatal(err)
	}
	pid := readPID(t, page)
	viewer := ptyDial(t, s, "attach="+tok+"&view=1")
	replayOf(t, viewer)

	out, stderr, code := runCLI(t, "", "ptys", "--state-dir", s.StateDir)
	if code != 0 {
		t.Fatalf("tether ptys: status %d, stderr %q", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "TOKEN PID SIZE WRITER VIEWERS AGE DETACHED COMMAND" {
		t.Fatalf("tether ptys: %q, want a header and one line", out)
	}
	f := strings.Fields(lines[1])
	if len(f) != 8 || f[0] != tok || f[1] != strconv.Itoa(pid) || f[2] != "91x37" || f[3] != "yes" || f[4] != "1" || f[6] != "-" || f[7] != "sh" {
		t.Errorf("tether ptys line %q, want %s, pid %d, 91x37, writer yes, 1 viewer, not detached, sh", lines[1], tok, pid)
	}

	out, stderr, code = runCLI(t, "", "ptys", "--json", "--state-dir", s.StateDir)
	if code != 0 {
		t.Fatalf("tether ptys --json: status %d, stderr %q", code, stderr)
	}
	var entries []struct {
		Token      string    `json:"token"`
		Pid        int       `json:"pid"`
		Command    []string  `json:"command"`
		Cols       int       `json:"cols"`
		Rows       int       `json:"rows"`
		Writer     bool      `json:"writer"`
		Viewers    int       `json:"viewers"`
		Created    time.Time `json:"created"`
		AgeSeconds int64     `json:"age_seconds"`
		Detached   time.Time `json:"detached"`
	}
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatalf("tether ptys --json: %v\n%s", err, out)
	}
	if len(entries) != 1 {
		t.Fatalf("tether ptys --json: %s, want one PTY", out)
	}
	e := entries[0]
	if e.Token != tok || e.Pid != pid || len(e.Command) != 1 || e.Command[0] != "sh" || !e.Writer || e.Viewers != 1 ||
		e.Created.IsZero() || time.Since(e.Created) > time.Minute || !e.Detached.IsZero() || e.Cols != 91 || e.Rows != 37 {
		t.Errorf("tether ptys --json: %s", out)
	}

	// Joined from the CLI: typed input reaches the browser's shell, and
	// the page is superseded like any writer.
	stdout, stderr, code := runCLI(t, "echo joined-$((6*7))\n", "attach", "--settle", "3s", "--url", s.URL, "--state-dir", s.StateDir, tok)
	if code != 0 || !strings.Contains(stdout, "joined-42") {
		t.Errorf("tether attach %s: status %d, stdout %q, stderr %q; want the typed command's output", tok, code, stdout, stderr)
	}
	if !strings.Contains(stdout, "size=37 91") {
		t.Errorf("tether attach %s: stdout %q lacks the screen the page left", tok, stdout)
	}
	if code := closeCode(t, page); code != 4409 {
		t.Errorf("the page's socket: close %d, want 4409", code)
	}
	if err := viewer.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool { return bytes.Contains(b, []byte("joined-42")) }); err != nil {
		t.Errorf("the viewer did not see the CLI's input: %v", err)
	}

	out, _, _ = runCLI(t, "", "ptys", "--state-dir", s.StateDir)
	if f := strings.Fields(strings.Split(strings.TrimSpace(out), "\n")[1]); len(f) < 9 || f[3] != "no" || f[7] != "ago" {
		t.Errorf("tether ptys after the CLI detached: %q, want writer no, detached … ago", out)
	}
}

// TestPTYsErrors: no host on the state dir, and a host without PTYs.
func TestPTYsErrors(t *testing.T) {
	_, stderr, code := runCLI(t, "", "ptys", "--state-dir", t.TempDir())
	if code != 1 || !strings.Contains(stderr, "no tether host is running on this state dir") {
		t.Errorf("no host: status %d, stderr %q", code, stderr)
	}
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", ""}})
	_, stderr, code = runCLI(t, "", "ptys", "--state-dir", s.StateDir)
	if code != 1 || stderr != "tether ptys: this host runs no PTY backend (/api/pty is off)\n" {
		t.Errorf("no PTY backend: status %d, stderr %q", code, stderr)
	}
}

// The queries the program of the tmux test asks on start and on a poke:
// device attributes, cursor position, background colour, bracketed
// paste mode; tmux answers the first two at least.
const tmuxQueries = `\033[c\033[6n\033]11;?\007\033[?2004$p`

// TestAttachCLIInTmux: a program that asks the terminal questions on
// start, then prints GOT:<line> for each line typed, is joined with
// `tether attach` in tmux, detached (Enter ~ .), joined again, cut off
// and resumed while the program asked again; typed "hello" comes back as
// exactly GOT:hello — no answer of tmux to an old question was typed
// into the program.
func TestAttachCLIInTmux(t *testing.T) {
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Fatalf("this test needs tmux (apt-get install tmux): %v", err)
	}
	dir := t.TempDir()
	fifo := filepath.Join(dir, "poke")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(dir, "asker.sh")
	script := `fifo=$1
(while :; do if read x <"$fifo"; then printf '` + tmuxQueries + `'; printf 'ASKED-AGAIN\n'; fi; done) &
printf '` + tmuxQueries + `'
printf 'READY\n'
while IFS= read -r line; do printf 'GOT:%s\n' "$line"; done
`
	if err := os.WriteFile(prog, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	proxy := newCutProxy(t)
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "sh " + prog + " " + fifo, "--allow-host", proxy.addr}})
	proxy.setUpstream(s.Addr)

	// The program starts with no terminal to answer it, as when a
	// client that answers nothing opened it.
	tok := attachToken(t)
	opener := ptyDial(t, s, "attach="+tok)
	if err := opener.WaitOutput(ctxT(t, 15*time.Second), func(b []byte) bool { return bytes.Contains(b, []byte("READY")) }); err != nil {
		t.Fatal(err)
	}
	opener.Close()
	// A viewer sees everything the program prints from here on: what it
	// read, and the kernel's echo of what was typed into it.
	viewer := ptyDial(t, s, "attach="+tok+"&view=1")
	replayOf(t, viewer)

	tm := startTmux(t, tmux)
	attachCmd := fmt.Sprintf("%s attach --url http://%s --state-dir %s %s", e2e.Build(t), proxy.addr, s.StateDir, tok)
	tm.sendLine(attachCmd)
	tm.waitCount("tether: attached; Enter ~. to detach", 1)
	tm.waitCount("READY", 1)
	tm.keys("Enter", "~", ".")
	tm.waitCount("tether: detached", 1)

	tm.sendLine(attachCmd)
	tm.waitCount("tether: attached; Enter ~. to detach", 2)

	// Cut off; the program asks again meanwhile (a viewer on the host
	// sees it, so it is in the ring); back, the client resumes with the
	// raw bytes it missed.
	proxy.cut()
	tm.waitCount("tether: connection lost, reconnecting…", 1)
	poke(t, fifo)
	if err := viewer.WaitOutput(ctxT(t, 15*time.Second), func(b []byte) bool { return bytes.Contains(b, []byte("ASKED-AGAIN")) }); err != nil {
		t.Fatal(err)
	}
	proxy.resume()
	tm.waitCount("tether: reconnected", 1)
	tm.waitCount("ASKED-AGAIN", 1)
	if screen := tm.capture(); strings.Contains(screen, "redrawn") {
		t.Errorf("the reattach was not a resume:\n%s", screen)
	}

	// The Enter of the detach was an empty line; hello is the next.
	tm.sendLine("hello")
	if err := viewer.WaitOutput(ctxT(t, 15*time.Second), func(b []byte) bool { return bytes.Contains(b, []byte("GOT:hello")) }); err != nil {
		t.Fatal(err)
	}
	out := string(viewer.Output())
	got := regexp.MustCompile(`GOT:[^\r\n]*`).FindAllString(out, -1)
	if len(got) != 2 || got[0] != "GOT:" || got[1] != "GOT:hello" {
		t.Errorf("the program read %q, want exactly [GOT: GOT:hello]; its output: %q", got, out)
	}
	// Nothing but the Enter, the poke and hello went in: the kernel's
	// echo of any answer typed into the PTY would show here (as ^[…).
	want := "\r\nGOT:\r\n" + "\x1b[c\x1b[6n\x1b]11;?\a\x1b[?2004$p" + "ASKED-AGAIN\r\n" + "hello\r\nGOT:hello\r\n"
	if out != want {
		t.Errorf("the PTY's output since the first attach %q\nwant %q", out, want)
	}
	tm.waitCount("GOT:hello", 1)
	screen := tm.capture()
	if strings.Contains(screen, "^[") {
		t.Errorf("the pane shows escape sequences typed into the PTY:\n%s", screen)
	}
}

// poke writes a line to the fifo the program's background loop reads.
func poke(t *testing.T, fifo string) {
	t.Helper()
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("go\n"); err != nil {
		t.Fatal(err)
	}
}

// tmuxSession is a detached tmux server of the test's own, with one
// pane running sh.
type tmuxSession struct {
	t    *testing.T
	bin  string
	sock string

	lastCapture string // the pane as last seen, for the log
}

func startTmux(t *testing.T, bin string) *tmuxSession {
	t.Helper()
	return startTmuxSized(t, bin, 120, 40)
}

// run runs a tmux command on the test's server.
func (tm *tmuxSession) run(args ...string) string {
	tm.t.Helper()
	cmd := exec.Command(tm.bin, append([]string{"-S", tm.sock}, args...)...)
	cmd.Env = cliEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		tm.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// sendLine types line and Enter into the pane.
func (tm *tmuxSession) sendLine(line string) {
	tm.t.Helper()
	tm.run("send-keys", "-t", "e2e", "-l", line)
	tm.run("send-keys", "-t", "e2e", "Enter")
}

// keys sends tmux key names (Enter) and single characters one by one.
func (tm *tmuxSession) keys(keys ...string) {
	tm.t.Helper()
	for _, k := range keys {
		if len(k) == 1 {
			tm.run("send-keys", "-t", "e2e", "-l", k)
		} else {
			tm.run("send-keys", "-t", "e2e", k)
		}
	}
}

// capture returns the pane's history and screen as text.
func (tm *tmuxSession) capture() string {
	tm.t.Helper()
	return tm.run("capture-pane", "-p", "-J", "-t", "e2e", "-S", "-")
}

// waitCount polls the pane until sub shows n times (20 s at most).
func (tm *tmuxSession) waitCount(sub string, n int) {
	tm.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		screen := tm.capture()
		tm.lastCapture = screen
		if strings.Count(screen, sub) >= n {
			return
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("the pane never showed %q %d times; it shows:\n%s", sub, n, screen)
		}
		time.Sleep(50 * time.Millisecond) // polling a terminal screen
	}
}

// cutProxy forwards TCP connections to upstream and can cut them all
// and refuse new ones (closed at once) until resumed.
type cutProxy struct {
	addr string // 127.0.0.1:PORT it listens on
	ln   net.Listener
	wg   sync.WaitGroup

	mu       sync.Mutex // guards the fields below
	upstream string     // where to forward; "" refuses
	paused   bool
	conns    map[net.Conn]bool
}

// setUpstream sets where connections are forwarded.
func (p *cutProxy) setUpstream(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.upstream = addr
}

func newCutProxy(t *testing.T) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]bool{}}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		paused, upstream := p.paused, p.upstream
		p.mu.Unlock()
		if paused || upstream == "" {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", upstream)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		p.wg.Go(func() { pipe(up, c) })
		p.wg.Go(func() { pipe(c, up) })
	}
}

// cut closes every forwarded connection and refuses new ones.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
	for c := range p.conns {
		c.Close()
	}
}

// resume forwards new connections again.
func (p *cutProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = false
}
