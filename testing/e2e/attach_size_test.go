package e2e_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
)

// sizeRows is how many marker rows the program of TestAttachCLIAtAnother
// Size draws under one another, each sizeWidth columns wide, on a
// 128x41 terminal; its shell's prompt is on the row below them, the last.
const (
	sizeRows  = 40
	sizeWidth = 120
)

// sizeRow is marker row i (from 1) as the program draws it.
func sizeRow(i int) string {
	head := fmt.Sprintf("ROW-%02d ", i)
	return head + strings.Repeat(".", sizeWidth-len(head))
}

// TestAttachCLIAtAnotherSize: a PTY made at 128x41 by a client that
// resizes it once attached (as the page does) holds a full screen of
// wide marker rows and a shell's prompt on the last row. `tether attach`
// from a smaller (100x30) and from a larger (150x50) tmux pane shows
// that screen, each row where it belongs: the PTY takes the pane's size
// before the snapshot is drawn. The shell, which redraws nothing on
// SIGWINCH, then says the pane's size.
func TestAttachCLIAtAnotherSize(t *testing.T) {
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Fatalf("this test needs tmux (apt-get install tmux): %v", err)
	}
	prog := filepath.Join(t.TempDir(), "screen.sh")
	// It draws once it reads a line (after the resize), then becomes a
	// shell whose prompt stays where the drawing left the cursor.
	script := fmt.Sprintf(`stty -echo; IFS= read -r x; stty echo
pad=$(printf '%%%ds' '' | tr ' ' .)
printf '\033[H\033[2J'
i=1
while [ $i -le %d ]; do printf 'ROW-%%02d %%s\n' $i "$pad"; i=$((i + 1)); done
PS1='PROMPT$ ' exec sh
`, sizeWidth-len("ROW-01 "), sizeRows)
	if err := os.WriteFile(prog, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "sh " + prog}})

	for _, tc := range []struct {
		name       string
		cols, rows int
		want       []string // the pane's rows
	}{
		{"smaller", 100, 30, func() []string {
			// The cursor's row is the last: the rows above it that no
			// longer fit went up into the scrollback, and every row is
			// cut at the new width.
			var w []string
			for i := sizeRows + 2 - 30; i <= sizeRows; i++ {
				w = append(w, sizeRow(i)[:100])
			}
			return append(w, "PROMPT$")
		}()},
		{"larger", 150, 50, func() []string {
			w := make([]string, 50)
			for i := 1; i <= sizeRows; i++ {
				w[i-1] = sizeRow(i)
			}
			w[sizeRows] = "PROMPT$"
			return w
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := attachToken(t)
			opener := ptyDial(t, s, "attach="+tok)
			replayOf(t, opener)
			if err := opener.Resize(128, 41); err != nil {
				t.Fatal(err)
			}
			if err := opener.Write([]byte("go\n")); err != nil {
				t.Fatal(err)
			}
			if err := opener.WaitOutput(ctxT(t, 15*time.Second), func(b []byte) bool { return bytes.Contains(b, []byte("PROMPT$ ")) }); err != nil {
				t.Fatal(err)
			}
			opener.Close()

			tm := startTmuxSized(t, tmux, tc.cols, tc.rows)
			tm.sendLine(fmt.Sprintf("%s attach --url http://%s --state-dir %s %s", e2e.Build(t), s.Addr, s.StateDir, tok))
			tm.waitScreen(tc.want)

			tm.sendLine("stty size")
			tm.waitCount(fmt.Sprintf("\n%d %d\n", tc.rows, tc.cols), 1)
		})
	}
}

// startTmuxSized starts a tmux server of the test's own with one pane of
// cols×rows running sh (startTmux: 120x40).
func startTmuxSized(t *testing.T, bin string, cols, rows int) *tmuxSession {
	t.Helper()
	tm := &tmuxSession{t: t, bin: bin, sock: filepath.Join(t.TempDir(), "tmux.sock")}
	tm.run("-f", "/dev/null", "new-session", "-d", "-s", "e2e", "-x", fmt.Sprint(cols), "-y", fmt.Sprint(rows), "sh")
	t.Cleanup(func() {
		cmd := exec.Command(tm.bin, "-S", tm.sock, "kill-server")
		cmd.Env = cliEnv()
		_ = cmd.Run()
		if t.Failed() {
			t.Logf("tmux pane at the end:\n%s", tm.lastCapture)
		}
	})
	tm.run("set-option", "-g", "status", "off")
	tm.run("set-option", "-g", "history-limit", "10000")
	return tm
}

// viewProgram is the PTY program of TestAttachCLIViewDetachInTmux: it
// reads the name of the screen to leave (not echoed), draws it, and
// stays.
const viewProgram = `stty -echo; IFS= read -r screen; stty echo
case "$screen" in
prompt)
	printf '\033[H\033[2Jfirst line\n'
	PS1='me@machine:~/src/repo# ' exec sh ;;
alternate)
	printf '\033[?1049h\033[?1000h\033[?1006h\033[?7l\033[?1h\033=\033[H\033[2J'
	i=1; while [ $i -le 30 ]; do printf '\033[%d;1HALT-%02d' $i $i; i=$((i + 1)); done
	exec sleep 3600 ;;
lastrow)
	i=1; while [ $i -le 60 ]; do echo "line $i"; i=$((i + 1)); done
	PS1='me@machine:~/src/repo# ' exec sh ;;
wrapped)
	i=1; while [ $i -le 45 ]; do printf 'WIDE-%02d %0130d\n' $i 0; i=$((i + 1)); done
	printf 'no newline at the end'
	exec sleep 3600 ;;
region)
	printf '\033[H\033[2Jstatus line\033[2;29r\033[?6h\033[4h'
	printf '\033[27;1Hin the region'
	exec sleep 3600 ;;
esac
`

// TestAttachCLIViewDetachInTmux: `tether attach --view` from a 120x40
// tmux pane to PTYs of other sizes, each left in a state that can push
// the last status line off the start of a line — a prompt with no
// newline after it, a program on the alternate screen with mouse
// reports and autowrap off, the cursor on the last row under a
// scrollback, wide lines wrapped with no newline at the end, a scroll
// region with origin and insert mode. Enter ~ . leaves "tether: detached" on a line of its own, the
// shell's next prompt on the line after it and nothing under them, and
// the pane's modes as a shell expects them.
func TestAttachCLIViewDetachInTmux(t *testing.T) {
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Fatalf("this test needs tmux (apt-get install tmux): %v", err)
	}
	prog := filepath.Join(t.TempDir(), "view.sh")
	if err := os.WriteFile(prog, []byte(viewProgram), 0o600); err != nil {
		t.Fatal(err)
	}
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "sh " + prog}})
	for _, tc := range []struct {
		screen     string
		cols, rows int
		shown      string // on the pane once the snapshot is drawn
	}{
		{"prompt", 100, 30, "me@machine:~/src/repo#"},
		{"alternate", 100, 30, "ALT-30"},
		{"lastrow", 100, 30, "line 60"},
		{"wrapped", 150, 50, "no newline at the end"},
		{"region", 100, 30, "in the region"},
	} {
		t.Run(tc.screen, func(t *testing.T) {
			tok := attachToken(t)
			opener := ptyDial(t, s, "attach="+tok)
			replayOf(t, opener)
			if err := opener.Resize(tc.cols, tc.rows); err != nil {
				t.Fatal(err)
			}
			if err := opener.Write([]byte(tc.screen + "\n")); err != nil {
				t.Fatal(err)
			}
			if err := opener.WaitOutput(ctxT(t, 15*time.Second), func(b []byte) bool { return bytes.Contains(b, []byte(tc.shown)) }); err != nil {
				t.Fatal(err)
			}
			opener.Close()

			tm := startTmux(t, tmux)
			tm.sendLine("PS1='LOCAL> '; clear")
			tm.sendLine(fmt.Sprintf("%s attach --view --url http://%s --state-dir %s %s", e2e.Build(t), s.Addr, s.StateDir, tok))
			tm.waitCount(tc.shown, 1) // the announcement may be under an alternate screen
			tm.keys("Enter", "~", ".")

			// Once the shell has printed its prompt under the last line
			// that mentions the detach, that line is the message alone,
			// the prompt is alone on the next, and nothing is under it.
			var rows []string
			at := -1
			deadline := time.Now().Add(20 * time.Second)
			for {
				rows = strings.Split(strings.TrimSuffix(tm.run("capture-pane", "-p", "-t", "e2e"), "\n"), "\n")
				tm.lastCapture = strings.Join(rows, "\n")
				at = -1
				for i, r := range rows {
					if strings.Contains(r, "tether: detached") {
						at = i
					}
				}
				if at >= 0 && at+1 < len(rows) && strings.Contains(strings.Join(rows[at+1:], "\n"), "LOCAL>") &&
					tm.display("#{pane_current_command}") == "sh" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no shell prompt under the detach message; the pane:\n%s", tm.lastCapture)
				}
				time.Sleep(50 * time.Millisecond) // polling a terminal screen
			}
			if rows[at] != "tether: detached" || rows[at+1] != "LOCAL>" {
				t.Errorf("after the detach the pane's rows read %q, %q; want %q, then the prompt %q", rows[at], rows[at+1], "tether: detached", "LOCAL>")
			}
			for i, r := range rows[at+2:] {
				if r != "" {
					t.Errorf("row %d under the prompt shows %q, want it empty", at+2+i, r)
				}
			}
			const modes = "#{alternate_on} #{mouse_any_flag} #{mouse_sgr_flag} #{wrap_flag} #{origin_flag} #{insert_flag} #{keypad_flag} #{keypad_cursor_flag} #{cursor_flag} #{scroll_region_upper} #{scroll_region_lower}"
			if got, want := tm.display(modes), "0 0 0 1 0 0 0 0 1 0 39"; got != want {
				t.Errorf("after the detach the pane's %s are %q, want %q", modes, got, want)
			}
		})
	}
}
