package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-agent/tether/host"
)

// fakeControl answers the control socket of a state dir with answer, one
// request per connection, and records the requests.
type fakeControl struct {
	mu       sync.Mutex // guards the field below
	requests []host.ControlRequest
}

func newFakeControl(t *testing.T, stateDir string, answer host.ControlResponse) *fakeControl {
	t.Helper()
	sock := host.SocketDir(stateDir)
	if err := os.MkdirAll(sock, 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(sock, host.ControlSocket))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeControl{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			line, err := bufio.NewReader(c).ReadBytes('\n')
			var req host.ControlRequest
			if err == nil && json.Unmarshal(line, &req) == nil {
				f.mu.Lock()
				f.requests = append(f.requests, req)
				f.mu.Unlock()
			}
			b, _ := json.Marshal(answer)
			_, _ = c.Write(append(b, '\n'))
			c.Close()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return f
}

func (f *fakeControl) ops() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ops []string
	for _, r := range f.requests {
		ops = append(ops, r.Op)
	}
	return ops
}

func TestPTYsCommand(t *testing.T) {
	dir := t.TempDir()
	created := time.Now().Add(-90 * time.Second).Truncate(time.Second)
	detached := created.Add(30 * time.Second)
	const goneToken, myToken = "gone-token-0123456789", "this-token-0123456789"
	f := newFakeControl(t, dir, host.ControlResponse{OK: true, PTYs: []host.PTYStatus{
		{Token: myToken, Pid: os.Getpid(), Cols: 120, Rows: 40, Writer: true, Viewers: 1, Created: created},
		{Token: goneToken, Pid: 1 << 30, Cols: 80, Rows: 24, Created: created, Detached: detached},
	}})

	var stdout, stderr bytes.Buffer
	if code := ptys([]string{"--state-dir", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("tether ptys: status %d, stderr %q", code, stderr.String())
	}
	lines := strings.Split(strings.TrimRight(stdout.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "TOKEN ") {
		t.Fatalf("output %q, want a header and two lines", stdout.String())
	}
	me := strings.Fields(lines[1])
	myArgv := shellJoin(os.Args)
	if len(me) < 8 || me[0] != myToken || me[1] != strconv.Itoa(os.Getpid()) || me[2] != "120x40" ||
		me[3] != "yes" || me[4] != "1" || me[6] != "-" || !strings.HasSuffix(lines[1], "  "+myArgv) {
		t.Errorf("line %q, want %s, pid %d, 120x40, writer yes, 1 viewer, not detached, command %q", lines[1], myToken, os.Getpid(), myArgv)
	}
	gone := strings.Fields(lines[2])
	if len(gone) != 9 || gone[0] != goneToken || gone[2] != "80x24" || gone[3] != "no" || !strings.HasPrefix(gone[5], "1m3") || !strings.HasPrefix(gone[6], "1m") || gone[7] != "ago" || gone[8] != "?" {
		t.Errorf("line %q, want %s, 80x24, no writer, detached an age ago, command ?", lines[2], goneToken)
	}

	stdout.Reset()
	if code := ptys([]string{"--state-dir", dir, "--json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("tether ptys --json: status %d, stderr %q", code, stderr.String())
	}
	var got []map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("--json output %q: %v", stdout.String(), err)
	}
	if len(got) != 2 {
		t.Fatalf("--json: %d entries, want 2: %s", len(got), stdout.String())
	}
	cmd, _ := got[0]["command"].([]any)
	if got[0]["token"] != myToken || got[0]["pid"] != float64(os.Getpid()) || got[0]["cols"] != 120.0 || got[0]["rows"] != 40.0 ||
		got[0]["writer"] != true || got[0]["viewers"] != 1.0 || len(cmd) != len(os.Args) || cmd[0] != os.Args[0] {
		t.Errorf("--json entry %v", got[0])
	}
	if _, ok := got[0]["detached"]; ok {
		t.Errorf("--json entry %v has a detached time while a writer is attached", got[0])
	}
	if age, _ := got[1]["age_seconds"].(float64); age < 90 || age > 90+testWait.Seconds() {
		t.Errorf("--json age_seconds %v, want about 90", got[1]["age_seconds"])
	}
	if d, _ := got[1]["detached"].(string); d != detached.Format(time.RFC3339) {
		t.Errorf("--json detached %v, want %s", got[1]["detached"], detached.Format(time.RFC3339))
	}
	if c, ok := got[1]["command"].([]any); !ok || len(c) != 0 {
		t.Errorf("--json command of a gone process: %v, want []", got[1]["command"])
	}
	if ops := f.ops(); !reflect.DeepEqual(ops, []string{host.OpPTYs, host.OpPTYs}) {
		t.Errorf("requests %v, want two %s", ops, host.OpPTYs)
	}
}

func TestPTYsCommandErrors(t *testing.T) {
	var stdout, stderr bytes.Buffer
	dir := t.TempDir()
	if code := ptys([]string{"--state-dir", dir}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "no tether host is running on this state dir") {
		t.Errorf("no host: status %d, stderr %q", code, stderr.String())
	}
	newFakeControl(t, dir, host.ControlResponse{Error: host.ErrNoPTYBackend.Error()})
	stderr.Reset()
	if code := ptys([]string{"--state-dir", dir}, &stdout, &stderr); code != 1 || stderr.String() != "tether ptys: "+host.ErrNoPTYBackend.Error()+"\n" {
		t.Errorf("no backend: status %d, stderr %q", code, stderr.String())
	}
	stderr.Reset()
	if code := ptys([]string{"--state-dir", dir, "extra"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), `unexpected argument "extra"`) {
		t.Errorf("extra argument: status %d, stderr %q", code, stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout %q, want nothing", stdout.String())
	}
}

func TestPrintPTYs(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	var b bytes.Buffer
	if err := printPTYs(&b, nil, now); err != nil || b.String() != "no live PTYs\n" {
		t.Errorf("no PTYs: %q, %v", b.String(), err)
	}
	b.Reset()
	err := printPTYs(&b, []ptyEntry{
		{Token: "aaaaaaaaaaaaaaaa", Pid: 7, Command: []string{"sh", "-c", "echo 'hi'; exec bash"}, Cols: 100, Rows: 30,
			Writer: true, Created: now.Add(-2*time.Hour - 3*time.Minute - 4*time.Second - 500*time.Millisecond)},
		{Token: "bbbbbbbbbbbbbbbb", Pid: 8, Command: []string{"/bin/bash"}, Cols: 80, Rows: 24, Viewers: 2,
			Created: now.Add(-time.Minute), Detached: now.Add(-5 * time.Second)},
	}, now)
	want := "" +
		"TOKEN             PID  SIZE    WRITER  VIEWERS  AGE     DETACHED  COMMAND\n" +
		"aaaaaaaaaaaaaaaa  7    100x30  yes     0        2h3m4s  -         sh -c 'echo '\\''hi'\\''; exec bash'\n" +
		"bbbbbbbbbbbbbbbb  8    80x24   no      2        1m0s    5s ago    /bin/bash\n"
	if err != nil || b.String() != want {
		t.Errorf("got\n%s(%v)\nwant\n%s", b.String(), err, want)
	}
}

func TestShellJoin(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"bash"}, "bash"},
		{[]string{"/usr/bin/env", "A=b", "x@y:z,w+%"}, "/usr/bin/env A=b x@y:z,w+%"},
		{[]string{"sh", "-c", "a b"}, "sh -c 'a b'"},
		{[]string{"it's"}, `'it'\''s'`},
		{[]string{""}, "''"},
		{[]string{"$HOME", "*"}, "'$HOME' '*'"},
	} {
		if got := shellJoin(tc.argv); got != tc.want {
			t.Errorf("shellJoin(%q) = %s, want %s", tc.argv, got, tc.want)
		}
	}
}

func TestProcCommand(t *testing.T) {
	if got := procCommand(os.Getpid()); !reflect.DeepEqual(got, os.Args) {
		t.Errorf("procCommand(self) = %q, want %q", got, os.Args)
	}
	if got := procCommand(1 << 30); got != nil {
		t.Errorf("procCommand(no such pid) = %q, want nil", got)
	}
}
