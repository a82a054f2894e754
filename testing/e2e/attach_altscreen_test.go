package e2e_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
)

// The screen the vim-like program of TestAttachCLIAltScreenInTmux draws
// on the alternate screen of a 120x40 pane, and its cursor (x, y from 0).
var (
	altScreenRows = map[int]string{0: "ALT-ROW-1", 2: "    ALT-ROW-3 \x1b[1;31mred\x1b[m", 39: "~ bottom"}
	altCursor     = "9 4"
)

// TestAttachCLIAltScreenInTmux: `tether attach` in tmux to a program
// that lives on the alternate screen with mouse reports on, like vim.
// Detached, the pane is back on its primary screen with no mouse
// reports; reattached, the pane is exactly the program's screen, cursor
// included (the status line is not drawn into it); when the program
// leaves the alternate screen, the pane shows the primary screen the
// snapshot restored under it.
func TestAttachCLIAltScreenInTmux(t *testing.T) {
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Fatalf("this test needs tmux (apt-get install tmux): %v", err)
	}
	prog := filepath.Join(t.TempDir(), "vimlike.sh")
	var draw strings.Builder
	for y, text := range altScreenRows {
		fmt.Fprintf(&draw, `\033[%d;1H%s`, y+1, strings.ReplaceAll(text, "\x1b", `\033`))
	}
	// Input is not echoed on the alternate screen (stty -echo, as vim's
	// raw mode); empty lines (the Enter of a detach) are ignored.
	script := `printf 'PRIMARY-TOP\n'
IFS= read -r x
stty -echo
printf '\033[?1049h\033[?1000h\033[?1002h\033[?1006h\033[H\033[2J'
printf '` + draw.String() + `\033[5;10H'
while IFS= read -r line; do
	case "$line" in
	quit) printf '\033[?1000l\033[?1002l\033[?1006l\033[?1049l'; stty echo; printf 'LEFT-ALT\n' ;;
	?*) printf 'GOT:%s\n' "$line" ;;
	esac
done
`
	if err := os.WriteFile(prog, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "sh " + prog}})
	tok := attachToken(t)

	tm := startTmux(t, tmux)
	attachCmd := fmt.Sprintf("%s attach --url http://%s --state-dir %s %s", e2e.Build(t), s.Addr, s.StateDir, tok)
	tm.sendLine(attachCmd)
	tm.waitCount("tether: attached; Enter ~. to detach", 1)
	tm.waitCount("PRIMARY-TOP", 1)
	// The program draws once it reads a line, when the PTY has the
	// pane's size.
	tm.sendLine("go")
	wantAlt := make([]string, 40)
	for y, text := range altScreenRows {
		wantAlt[y] = strings.ReplaceAll(strings.ReplaceAll(text, "\x1b[1;31m", ""), "\x1b[m", "")
	}
	tm.waitScreen(wantAlt)
	if got := tm.display("#{alternate_on} #{mouse_any_flag}"); got != "1 1" {
		t.Fatalf("with the program drawn the pane has alternate_on mouse_any_flag %q, want 1 1", got)
	}

	tm.keys("Enter", "~", ".")
	tm.waitCount("tether: detached", 1)
	if got := tm.display("#{alternate_on} #{mouse_any_flag} #{mouse_sgr_flag}"); got != "0 0 0" {
		t.Errorf("after the detach the pane has alternate_on mouse_any_flag mouse_sgr_flag %q, want 0 0 0", got)
	}

	tm.sendLine(attachCmd)
	tm.waitCount("tether: attached; Enter ~. to detach", 2)
	tm.waitScreen(wantAlt)
	if got := tm.display("#{alternate_on} #{mouse_any_flag} #{cursor_x} #{cursor_y}"); got != "1 1 "+altCursor {
		t.Errorf("reattached, the pane has alternate_on mouse_any_flag cursor_x cursor_y %q, want 1 1 %s", got, altCursor)
	}

	// The kernel echoed "go" on the primary screen before the program
	// turned echo off.
	tm.sendLine("quit")
	wantPrimary := make([]string, 40)
	copy(wantPrimary, []string{"PRIMARY-TOP", "go", "LEFT-ALT"})
	tm.waitScreen(wantPrimary)
	if got := tm.display("#{alternate_on} #{mouse_any_flag}"); got != "0 0" {
		t.Errorf("after the program left the alternate screen the pane has alternate_on mouse_any_flag %q, want 0 0", got)
	}
}

// display returns a tmux format expanded for the pane.
func (tm *tmuxSession) display(format string) string {
	tm.t.Helper()
	return strings.TrimSpace(tm.run("display-message", "-p", "-t", "e2e", format))
}

// waitScreen polls the pane's visible screen (trailing blanks trimmed)
// until it is want, row for row (20 s at most).
func (tm *tmuxSession) waitScreen(want []string) {
	tm.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := strings.Split(strings.TrimSuffix(tm.run("capture-pane", "-p", "-t", "e2e"), "\n"), "\n")
		tm.lastCapture = strings.Join(got, "\n")
		if strings.Join(got, "\n") == strings.Join(want, "\n") {
			return
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("the pane's screen is\n%q\nwant\n%q", got, want)
		}
		time.Sleep(50 * time.Millisecond) // polling a terminal screen
	}
}
