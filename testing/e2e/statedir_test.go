package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
)

// The state dir is never trusted blindly (docs/PROTOCOL.md, "The state
// dir"): these tests play a second local user who has no token and
// plants things where a host keeps its state, and check what the real
// binary does about it.

// nobody is the other user whose files the tests plant (root can chown).
const nobody = 65534

// needRoot skips a test that plays another user: only root can give a
// file to uid 65534.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test plants files owned by another user (uid 65534) with chown")
	}
}

// refusalTimeout bounds a refused start: it is refused at once, and a
// hang (the old loop on a dangling token link) fails the test.
const refusalTimeout = 15 * time.Second

// serveRefused runs `tether serve` on state (PTYs off, so it leaves no
// plugin behind if it wrongly starts) and waits for it to stop by itself
// within refusalTimeout; it returns what it printed, its exit code and
// how long it took.
func serveRefused(t *testing.T, state string, args ...string) (stdout, stderr string, code int, took time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), refusalTimeout)
	defer cancel()
	args = append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--log-format", "json", "--pty-command", ""}, args...)
	cmd := exec.CommandContext(ctx, e2e.Build(t), args...)
	cmd.Env = withoutTetherEnv()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	_ = cmd.Run()
	took = time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("tether serve on %s did not stop within %v (a hang, or it started):\nstdout:\n%s\nstderr:\n%s", state, refusalTimeout, out.String(), errb.String())
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode(), took
}

// withoutTetherEnv is the test's environment without TETHER_* variables.
func withoutTetherEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TETHER_") {
			env = append(env, kv)
		}
	}
	return env
}

// wantRefusal checks a refused start: exit 1 within seconds, one line on
// stderr naming path and saying each of says, nothing served.
func wantRefusal(t *testing.T, stdout, stderr string, code int, took time.Duration, path string, says ...string) {
	t.Helper()
	line := strings.TrimSpace(stderr)
	if code != 1 {
		t.Errorf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if took > 10*time.Second {
		t.Errorf("the refusal took %v, want seconds", took)
	}
	if strings.Contains(line, "\n") || !strings.HasPrefix(line, "tether serve: ") {
		t.Errorf("stderr is not one line saying why:\n%s", stderr)
	}
	for _, s := range append([]string{path}, says...) {
		if !strings.Contains(line, s) {
			t.Errorf("the reason %q does not say %q", line, s)
		}
	}
	if strings.Contains(stdout, "tether listening") {
		t.Errorf("a refused host served: %s", stdout)
	}
}

// plantFile writes content to path with mode perm (chmod after, so the
// test's umask does not matter), owned by uid when uid >= 0.
func plantFile(t *testing.T, path, content string, perm fs.FileMode, uid int) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
	if uid >= 0 {
		if err := os.Lchown(path, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
}

// plantDir makes the directory path with mode perm, owned by uid when
// uid >= 0.
func plantDir(t *testing.T, path string, perm fs.FileMode, uid int) {
	t.Helper()
	if err := os.MkdirAll(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
	if uid >= 0 {
		if err := os.Lchown(path, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
}

// modeOf is the permission and type bits of path (lstat), or 0.
func modeOf(path string) fs.FileMode {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0
	}
	return fi.Mode()
}

// TestStateDirRefused plants, as another user or by a mistake, each
// thing the state dir must not hold, and starts the real binary on it:
// it exits 1 within seconds with one line naming the path and the fix,
// never prints a planted token, never follows a link (a link's target
// keeps its content and mode), never hangs on a dangling link or a FIFO,
// and leaves the evidence as it found it (no chmod of a group-writable
// file, no token made).
func TestStateDirRefused(t *testing.T) {
	const planted = "ATTACKERTOKEN0123456789abcdef"
	tests := []struct {
		name string
		root bool
		// plant prepares the state dir at state (its parent exists) and
		// returns the path the refusal must name, and a check of what
		// must be unchanged afterwards.
		plant func(t *testing.T, state string) (path string, unchanged func(t *testing.T))
		says  []string
	}{
		{
			name: "state dir of another user", root: true,
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o700, nobody)
				return state, func(t *testing.T) {
					if _, err := os.Lstat(filepath.Join(state, "token")); err == nil {
						t.Error("a token file was made in another user's state dir")
					}
				}
			},
			says: []string{"state dir", "belongs to uid 65534", "not to uid 0", "use a state dir of your own"},
		},
		{
			// The README's old /tmp/tether-h$i example: the other user
			// made the directory first, left a token and a database WAL.
			name: "another user's /tmp-style dir with a planted token and WAL", root: true,
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o755, nobody)
				plantFile(t, filepath.Join(state, "token"), planted+"\n", 0o644, nobody)
				plantFile(t, filepath.Join(state, "state.db-wal"), "", 0o644, nobody)
				return state, nil
			},
			says: []string{"belongs to uid 65534"},
		},
		{
			name: "a token planted by another user in our dir", root: true,
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o700, -1)
				p := filepath.Join(state, "token")
				plantFile(t, p, planted+"\n", 0o600, nobody)
				return p, nil
			},
			says: []string{"belongs to uid 65534", "another user put it there", "remove it"},
		},
		{
			name: "another user's reattach record", root: true,
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, filepath.Join(state, "plugins"), 0o700, -1)
				chmodOrFail(t, state, 0o700)
				p := filepath.Join(state, "plugins", "pty.json")
				plantFile(t, p, `{"protocol":"grpc","network":"unix","address":"/tmp/evil","pid":1,"started":1}`, 0o600, nobody)
				return p, nil
			},
			says: []string{"belongs to uid 65534"},
		},
		{
			name: "group-writable state dir",
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o770, -1)
				return state, wantMode(state, fs.ModeDir|0o770)
			},
			says: []string{"state dir", "mode 0770", "group or others can write", "chmod go-w"},
		},
		{
			name: "world-writable sticky state dir, like /tmp",
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o777|fs.ModeSticky, -1)
				return state, wantMode(state, fs.ModeDir|fs.ModeSticky|0o777)
			},
			says: []string{"state dir", "mode 0777"},
		},
		{
			name: "group-writable token file",
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o700, -1)
				p := filepath.Join(state, "token")
				plantFile(t, p, planted+"\n", 0o660, -1)
				return p, wantMode(p, 0o660)
			},
			says: []string{"mode 0660", "chmod go-w"},
		},
		{
			name: "world-writable database WAL",
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o700, -1)
				p := filepath.Join(state, "state.db-wal")
				plantFile(t, p, "", 0o666, -1)
				return p, wantMode(p, 0o666)
			},
			says: []string{"mode 0666"},
		},
		{
			name: "symlinked token file",
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o700, -1)
				target := filepath.Join(t.TempDir(), "someone-elses-secret")
				plantFile(t, target, planted+"\n", 0o644, -1)
				p := filepath.Join(state, "token")
				symlinkOrFail(t, target, p)
				return p, func(t *testing.T) {
					b, err := os.ReadFile(target)
					if err != nil || string(b) != planted+"\n" {
						t.Errorf("the link's target now holds %q (%v)", b, err)
					}
					if m := modeOf(target); m != 0o644 {
						t.Errorf("the link's target has mode %v, want 0644: it was chmodded through the link", m)
					}
				}
			},
			says: []string{"symbolic link (to ", "never follows a link"},
		},
		{
			name: "dangling token link",
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o700, -1)
				target := filepath.Join(t.TempDir(), "none")
				p := filepath.Join(state, "token")
				symlinkOrFail(t, target, p)
				return p, func(t *testing.T) {
					if _, err := os.Lstat(target); err == nil {
						t.Error("a file was created through the dangling link")
					}
				}
			},
			says: []string{"symbolic link"},
		},
		{
			name: "token file that is a FIFO",
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o700, -1)
				p := filepath.Join(state, "token")
				if err := syscall.Mkfifo(p, 0o600); err != nil {
					t.Fatal(err)
				}
				return p, nil
			},
			says: []string{"named pipe"},
		},
		{
			name: "symlinked state.db",
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o700, -1)
				target := filepath.Join(t.TempDir(), "elsewhere.db")
				plantFile(t, target, "", 0o644, -1)
				p := filepath.Join(state, "state.db")
				symlinkOrFail(t, target, p)
				return p, wantMode(target, 0o644)
			},
			says: []string{"symbolic link"},
		},
		{
			name: "symlinked host-id",
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o700, -1)
				p := filepath.Join(state, "host-id")
				symlinkOrFail(t, "/etc/hostname", p)
				return p, nil
			},
			says: []string{"symbolic link (to /etc/hostname)"},
		},
		{
			name: "symlinked lock",
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o700, -1)
				target := filepath.Join(t.TempDir(), "precious")
				plantFile(t, target, "do not truncate\n", 0o644, -1)
				p := filepath.Join(state, "lock")
				symlinkOrFail(t, target, p)
				return p, func(t *testing.T) {
					if b, _ := os.ReadFile(target); string(b) != "do not truncate\n" {
						t.Errorf("the lock's target was written through the link: %q", b)
					}
				}
			},
			says: []string{"symbolic link"},
		},
		{
			name: "symlinked plugins dir",
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				plantDir(t, state, 0o700, -1)
				elsewhere := t.TempDir()
				p := filepath.Join(state, "plugins")
				symlinkOrFail(t, elsewhere, p)
				return p, func(t *testing.T) {
					if ents, _ := os.ReadDir(elsewhere); len(ents) > 0 {
						t.Errorf("files were made through the plugins link: %v", ents)
					}
				}
			},
			says: []string{"symbolic link"},
		},
		{
			name: "state dir that is a link",
			plant: func(t *testing.T, state string) (string, func(*testing.T)) {
				real := t.TempDir()
				symlinkOrFail(t, real, state)
				return state, func(t *testing.T) {
					if ents, _ := os.ReadDir(real); len(ents) > 0 {
						t.Errorf("files were made through the state dir link: %v", ents)
					}
				}
			},
			says: []string{"state dir", "symbolic link", "point --state-dir at the directory itself"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root {
				needRoot(t)
			}
			state := filepath.Join(t.TempDir(), "state")
			path, unchanged := tt.plant(t, state)
			stdout, stderr, code, took := serveRefused(t, state)
			wantRefusal(t, stdout, stderr, code, took, path, tt.says...)
			if strings.Contains(stdout+stderr, planted) {
				t.Errorf("the planted token was printed:\nstdout:\n%s\nstderr:\n%s", stdout, stderr)
			}
			if unchanged != nil {
				unchanged(t)
			}
			// tether doctor runs the same check: it reports, word for
			// word, what serve refused with, and its fix.
			detail, fix, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(stderr), "tether serve: "), "; ")
			out, errOut, code := e2e.Tether(t, "doctor", "--state-dir", state, "--listen", "127.0.0.1:0")
			if code != 1 || !strings.Contains(out, detail) || !strings.Contains(out, "fix: "+fix) {
				t.Errorf("doctor: exit %d, want 1 with %q and its fix %q:\n%s%s", code, detail, fix, out, errOut)
			}
			if unchanged != nil {
				unchanged(t)
			}
		})
	}
}

// TestStateDirTokenFileOutside: a --token-file outside the state dir is
// the operator's (a Kubernetes secret mount is a link): a link there is
// read through, and its target is never chmodded (it stays 0644, said at
// info); a dangling one is refused within seconds, nothing is created
// through it.
func TestStateDirTokenFileOutside(t *testing.T) {
	secrets := t.TempDir()
	target := filepath.Join(secrets, "..data", "token")
	plantDir(t, filepath.Dir(target), 0o755, -1)
	plantFile(t, target, "operator-token-0123456789abcdef\n", 0o644, -1)
	mount := filepath.Join(secrets, "token")
	symlinkOrFail(t, filepath.Join("..data", "token"), mount)

	s := e2e.Start(t, e2e.Config{Args: []string{"--token-file", mount, "--pty-command", ""}})
	if s.Token != "operator-token-0123456789abcdef" {
		t.Errorf("the host serves token %q, want the one read through the link", s.Token)
	}
	if m := modeOf(target); m != 0o644 {
		t.Errorf("the link's target has mode %v, want 0644 untouched", m)
	}
	if !strings.Contains(s.Stderr.String(), "tether does not chmod through a link") {
		t.Errorf("the host did not say it left the target's mode alone:\n%s", s.Stderr.Tail(20))
	}

	dangling := filepath.Join(t.TempDir(), "token")
	missing := filepath.Join(t.TempDir(), "missing")
	symlinkOrFail(t, missing, dangling)
	stdout, stderr, code, took := serveRefused(t, filepath.Join(t.TempDir(), "state"), "--token-file", dangling)
	wantRefusal(t, stdout, stderr, code, took, dangling, "symbolic link to "+missing, "which does not exist")
	if _, err := os.Lstat(missing); err == nil {
		t.Errorf("a token file was created through the dangling link")
	}
}

// TestStateDirClientNeverSendsALinkedToken: a client command reading the
// token file of a state dir (no --token) refuses a link there, and
// never sends what it points at: the URL is a listener the attacker
// controls, which records every request; it sees none carrying the
// target's content.
func TestStateDirClientNeverSendsALinkedToken(t *testing.T) {
	const secret = "contents-of-a-file-only-root-reads"
	state := filepath.Join(t.TempDir(), "state")
	plantDir(t, state, 0o700, -1)
	target := filepath.Join(t.TempDir(), "shadow")
	plantFile(t, target, secret+"\n", 0o600, -1)
	symlinkOrFail(t, target, filepath.Join(state, "token"))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.String()+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		http.Error(w, "no", http.StatusUnauthorized)
	})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	url := "http://" + ln.Addr().String()
	for _, args := range [][]string{
		{"sessions", "--url", url, "--state-dir", state},
		{"attach", "--new", "--url", url, "--state-dir", state},
	} {
		_, stderr, code := e2e.Tether(t, args...)
		if code != 1 || !strings.Contains(stderr, "symbolic link") || !strings.Contains(stderr, filepath.Join(state, "token")) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("tether %s: exit %d %q, want 1 and one line saying the token file is a link", args[0], code, stderr)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range seen {
		if strings.Contains(r, secret) {
			t.Errorf("the link's target was sent: %s", r)
		}
	}
}

// TestStateDirPrivateAndUserUmask: a host started under umask 027 by a
// user whose state dir an older tether left 0755 with a 0644 token:
// serve makes them 0700/0600 and says so in words; every file it and
// its plugins make there — the database with its -wal and -shm after a
// stored prompt, the lock, the reattach record, a verified plugin copy,
// the sockets — is 0600 (a copy 0700, sockets with no group or other
// bits), while it runs and after it stops. The processes that run the
// user's code get the user's umask, not tether's: an exec agent and a
// PTY's shell both report 0027, and the files they make are 0640.
func TestStateDirPrivateAndUserUmask(t *testing.T) {
	bin := e2e.Build(t)
	state := filepath.Join(t.TempDir(), "state")
	plantDir(t, state, 0o755, -1)
	plantFile(t, filepath.Join(state, "token"), "older-tether-token-0123456789ab\n", 0o644, -1)
	work := t.TempDir() // the user's files
	ws := filepath.Join(work, "ws.sh")
	plantFile(t, ws, fmt.Sprintf("#!/bin/sh\nexec %s plugin ws \"$@\"\n", bin), 0o700, -1)

	old := syscall.Umask(0o027)
	s := e2e.Start(t, e2e.Config{StateDir: state, Args: []string{
		"--agent", "exec", "--agent-command", `sh -c 'umask; read f; touch "$f"'`,
		"--pty-command", "sh",
		"--plugin", "transport=" + ws + "#" + fileSum(t, ws),
	}})
	syscall.Umask(old)

	logs := s.Stderr.String()
	for _, say := range []string{
		`"message":"the state dir was readable by others; made it 0700"`,
		`"message":"the token file was readable by others; made it 0600"`,
	} {
		if !strings.Contains(logs, say) {
			t.Errorf("the host did not say %s:\n%s", say, s.Stderr.Tail(40))
		}
	}

	// An exec agent: its umask, and a file it makes.
	c := s.Dial(t)
	var snap snapshot
	call(t, c, "session.create", nil, &snap)
	byAgent := filepath.Join(work, "by-agent")
	call(t, c, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": byAgent}, nil)
	if text, status := waitComplete(t, c, snap.SessionID); !strings.Contains(text, "0027") {
		t.Errorf("the exec agent's umask: %q (%s), want 0027", text, status)
	}
	if m := modeOf(byAgent); m != 0o640 {
		t.Errorf("a file the agent made has mode %v, want 0640 (umask 027)", m)
	}

	// A PTY's shell: its umask, and a file it makes.
	byShell := filepath.Join(work, "by-shell")
	p := ptyDial(t, s, "attach="+attachToken(t))
	replayOf(t, p)
	if err := p.Write([]byte("umask; touch " + byShell + "; echo made-$((6*7))\n")); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool { return bytes.Contains(b, []byte("made-42")) }); err != nil {
		t.Fatalf("the shell did not answer: %v\n%q", err, p.Output())
	}
	if out := p.Output(); !bytes.Contains(out, []byte("0027\r\n")) {
		t.Errorf("the PTY's shell's umask: %q, want 0027", out)
	}
	if m := modeOf(byShell); m != 0o640 {
		t.Errorf("a file the shell made has mode %v, want 0640 (umask 027)", m)
	}

	present := walkPrivate(t, state)
	for _, want := range []string{"token", "lock", "state.db", "state.db-wal", "state.db-shm", "plugins", "plugins/pty.json", "plugins/bin"} {
		if !present[want] {
			t.Errorf("the walk did not see %s (saw %v)", want, present)
		}
	}
	if !present["socket"] || !present["copy"] {
		t.Errorf("the walk saw no socket or no plugin copy: %v", present)
	}

	p.Drop()
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("host exit %d, %v", code, err)
	}
	walkPrivate(t, state)
}

// walkPrivate checks that everything under state is this user's and
// private — directories 0700, files 0600 (verified plugin copies 0700),
// sockets with no group or other bits, no link — and returns the names
// it saw (relative to state; "socket" and "copy" when it saw one).
func walkPrivate(t *testing.T, state string) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	err := filepath.WalkDir(state, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(state, path)
		seen[rel] = true
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
			t.Errorf("%s is not this user's", path)
		}
		m := fi.Mode()
		switch {
		case m.IsDir():
			if m.Perm() != 0o700 {
				t.Errorf("directory %s has mode %v, want 0700", rel, m)
			}
		case m.Type() == fs.ModeSocket:
			seen["socket"] = true
			if m.Perm()&0o077 != 0 {
				t.Errorf("socket %s has mode %v, want no group or other bits", rel, m)
			}
		case m.IsRegular() && filepath.Dir(rel) == filepath.Join("plugins", "bin"):
			seen["copy"] = true
			if m.Perm() != 0o700 {
				t.Errorf("plugin copy %s has mode %v, want 0700", rel, m)
			}
		case m.IsRegular():
			if m.Perm() != 0o600 {
				t.Errorf("file %s has mode %v, want 0600", rel, m)
			}
		default:
			t.Errorf("%s is a %v", rel, m.Type())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return seen
}

// TestStateDirEmbeddedNATSPrivate: with --cluster embedded, the NATS
// server's JetStream store in <state-dir>/nats (which nats-server makes
// 0640/0750 by default) and the host-id file are private too, under a
// user's umask 022.
func TestStateDirEmbeddedNATSPrivate(t *testing.T) {
	secret := clusterSecret(t)
	old := syscall.Umask(0o022)
	s := e2e.Start(t, e2e.Config{Args: []string{"--cluster", "embedded", "--cluster-secret-file", secret, "--pty-command", ""}})
	syscall.Umask(old)
	c := s.Dial(t)
	var snap snapshot
	call(t, c, "session.create", nil, &snap)
	call(t, c, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": "kept in jetstream"}, nil)
	waitComplete(t, c, snap.SessionID)
	present := walkPrivate(t, s.StateDir)
	if !present["host-id"] || !present["nats"] {
		t.Errorf("the walk did not see host-id and nats/: %v", present)
	}
	n := 0
	for rel := range present {
		if strings.HasPrefix(rel, "nats"+string(filepath.Separator)) {
			n++
		}
	}
	if n < 3 {
		t.Errorf("the JetStream store has %d paths, want it in use", n)
	}
}

func chmodOrFail(t *testing.T, path string, mode fs.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func symlinkOrFail(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

// wantMode checks afterwards that path still has mode m (lstat).
func wantMode(path string, m fs.FileMode) func(*testing.T) {
	return func(t *testing.T) {
		t.Helper()
		if got := modeOf(path); got != m {
			t.Errorf("%s has mode %v, want %v as it was", path, got, m)
		}
	}
}
