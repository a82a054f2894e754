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
