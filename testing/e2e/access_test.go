package e2e_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host"
	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

// TestAccessTokenFileSurvivesRestart: with no --token the host makes a
// token file (0600) once and every later start on the state dir uses the
// same token, so clients holding it keep working across restarts.
func TestAccessTokenFileSurvivesRestart(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", ""}, Env: []string{"TETHER_TOKEN="}})
	path := filepath.Join(s.StateDir, "token")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("no token file after the first start: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v, want 0600", fi.Mode().Perm())
	}
	b, _ := os.ReadFile(path)
	if strings.TrimSpace(string(b)) != s.Token {
		t.Errorf("token file holds %q, the host printed %q", b, s.Token)
	}
	if strings.Contains(s.Stderr.String(), "used before") {
		t.Errorf("a fresh state dir was taken for a used one: %s", s.Stderr.Tail(5))
	}
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("exit %d, %v", code, err)
	}
	// A start refused for a bad flag makes no token file.
	fresh := t.TempDir()
	if _, stderr, exit := e2e.Tether(t, "serve", "--state-dir", fresh, "--agent", "acp"); exit != 2 || !strings.Contains(stderr, "--agent acp needs --agent-command") {
		t.Errorf("serve --agent acp with no command: exit %d, %q; want 2 and why", exit, stderr)
	}
	if _, err := os.Stat(filepath.Join(fresh, "token")); !os.IsNotExist(err) {
		t.Errorf("a refused start left a token file (stat: %v)", err)
	}
	s2 := e2e.Start(t, e2e.Config{StateDir: s.StateDir, Args: []string{"--pty-command", ""}, Env: []string{"TETHER_TOKEN="}})
	if s2.Token != s.Token {
		t.Errorf("token after a restart %q, want the same %q", s2.Token, s.Token)
	}
	s2.Dial(t) // the old token is let in
}

// TestAccessCustomTokenFile: --token-file puts the token where it says
// (its directory made 0700, the file 0600, nothing in the state dir), a
// restart with the same flag reuses it, and a client command given the
// same --token-file gets in with it.
func TestAccessCustomTokenFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "secrets", "tether-token")
	args := []string{"--pty-command", "", "--token-file", file}
	s := e2e.Start(t, e2e.Config{Args: args, Env: []string{"TETHER_TOKEN="}})
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatalf("no token file at --token-file: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v, want 0600", fi.Mode().Perm())
	}
	if di, err := os.Stat(filepath.Dir(file)); err != nil {
		t.Error(err)
	} else if di.Mode().Perm() != 0o700 {
		t.Errorf("token file's new directory mode %v, want 0700", di.Mode().Perm())
	}
	waitLogLine(t, s, "new access token created", map[string]any{"file": file})
	if b, _ := os.ReadFile(file); strings.TrimSpace(string(b)) != s.Token {
		t.Errorf("token file holds %q, the host printed %q", b, s.Token)
	}
	if _, err := os.Stat(filepath.Join(s.StateDir, "token")); !os.IsNotExist(err) {
		t.Errorf("a token file in the state dir too (stat: %v), want only --token-file", err)
	}
	// A client finds the token by --token-file alone (its state dir has
	// none).
	out, errOut, code := runCLIEnv(t, []string{"TETHER_TOKEN="}, "", "sessions", "--url", s.URL, "--state-dir", t.TempDir(), "--token-file", file)
	if code != 0 || !strings.HasPrefix(out, "LIVE") {
		t.Errorf("tether sessions --token-file: exit %d\n%s%s", code, out, errOut)
	}

	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("exit %d, %v", code, err)
	}
	s2 := e2e.Start(t, e2e.Config{StateDir: s.StateDir, Args: args, Env: []string{"TETHER_TOKEN="}})
	if s2.Token != s.Token {
		t.Errorf("token after a restart %q, want the same %q", s2.Token, s.Token)
	}
	if strings.Contains(s2.Stderr.String(), "new access token created") {
		t.Errorf("the restarted host made a new token: %s", s2.Stderr.Tail(5))
	}
}

// TestAccessTLSFlagsGoTogether: --tls-cert without --tls-key (or the
// other way round) is a bad flag: exit 2, one line saying so, and no
// token file made.
func TestAccessTLSFlagsGoTogether(t *testing.T) {
	pem := filepath.Join(t.TempDir(), "cert.pem")
	for _, flag := range []string{"--tls-cert", "--tls-key"} {
		dir := t.TempDir()
		stdout, stderr, exit := e2e.Tether(t, "serve", "--state-dir", dir, "--listen", "127.0.0.1:0", flag, pem)
		if want := "tether serve: --tls-cert and --tls-key go together\n"; exit != 2 || stderr != want || stdout != "" {
			t.Errorf("serve %s alone: exit %d, stdout %q, stderr %q; want 2, nothing, %q", flag, exit, stdout, stderr, want)
		}
		if _, err := os.Stat(filepath.Join(dir, "token")); !os.IsNotExist(err) {
			t.Errorf("serve %s alone left a token file (stat: %v)", flag, err)
		}
	}
}

// TestAccessWildcardListener: a host listening on 0.0.0.0 prints a URL a
// browser here can open (127.0.0.1) and accepts Host and Origin as
// 127.0.0.1, localhost and this machine's addresses with its port; any
// other name is refused with 4403, unless --allow-host names it.
func TestAccessWildcardListener(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--listen", "0.0.0.0:0", "--pty-command", "", "--allow-host", "tether.example"}})
	host, port, err := net.SplitHostPort(s.Addr)
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("printed address %s: want 127.0.0.1:PORT for a wildcard listener", s.Addr)
	}
	dial := func(hostHeader, origin string) int {
		t.Helper()
		c, err := s.DialRaw(ctxT(t, 10*time.Second), "/api/ws", wsclient.Options{
			Token:  s.Token,
			Header: http.Header{"Host": []string{hostHeader}},
			Origin: origin,
		})
		if err != nil {
			t.Fatalf("dial with Host %s: %v", hostHeader, err)
		}
		defer c.Close()
		ev, err := c.NextEvent(ctxT(t, 10*time.Second))
		if err == nil && ev.Type == "gateway.ready" {
			return 0
		}
		select {
		case <-c.Closed():
		case <-time.After(10 * time.Second):
		}
		code, _ := c.CloseCode()
		return code
	}
	tests := []struct {
		host, origin string
		want         int
	}{
		{"127.0.0.1:" + port, "http://127.0.0.1:" + port, 0},
		{"localhost:" + port, "http://localhost:" + port, 0},
		{"tether.example", "https://tether.example", 0},
		{"evil.example:" + port, "", 4403},
		{"127.0.0.1:" + port, "http://evil.example@127.0.0.1:" + port, 4403},
		{"127.0.0.1:" + port, "http://evil.example", 4403},
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
				tests = append(tests, struct {
					host, origin string
					want         int
				}{net.JoinHostPort(n.IP.String(), port), "", 0})
				break
			}
		}
	}
	for _, tt := range tests {
		if got := dial(tt.host, tt.origin); got != tt.want {
			t.Errorf("Host %q Origin %q: got %d, want %d", tt.host, tt.origin, got, tt.want)
		}
	}
}

// TestAccessAdminListener: the admin listener asks for the token (401
// without it), checks the Host (403 for a foreign one: a DNS-rebinding
// page cannot read it), and serves /debug/pprof only with --pprof.
func TestAccessAdminListener(t *testing.T) {
	for _, pprof := range []bool{false, true} {
		args := []string{"--pty-command", "", "--admin-listen", "127.0.0.1:0"}
		if pprof {
			args = append(args, "--pprof")
		}
		s := e2e.Start(t, e2e.Config{Args: args})
		get := func(path, token, host string) int {
			req, err := http.NewRequest(http.MethodGet, s.AdminURL+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			if host != "" {
				req.Host = host
			}
			cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := cl.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		if got := get("/metrics", "", ""); got != 401 {
			t.Errorf("/metrics without the token: %d, want 401", got)
		}
		if got := get("/metrics", "wrong", ""); got != 401 {
			t.Errorf("/metrics with a wrong token: %d, want 401", got)
		}
		if got := get("/metrics", s.Token, "rebind.attacker.example"); got != 403 {
			t.Errorf("/metrics with a foreign Host: %d, want 403", got)
		}
		if got := get("/metrics", s.Token, ""); got != 200 {
			t.Errorf("/metrics with the token: %d, want 200", got)
		}
		if got := get("/healthz", s.Token, ""); got != 200 {
			t.Errorf("/healthz with the token: %d, want 200", got)
		}
		want := 404
		if pprof {
			want = 200
		}
		if got := get("/debug/pprof/cmdline", s.Token, ""); got != want {
			t.Errorf("pprof=%v: /debug/pprof/cmdline: %d, want %d", pprof, got, want)
		}
		if got := get("/debug/pprof/cmdline?token="+s.Token, "", ""); got != want {
			t.Errorf("pprof=%v: /debug/pprof/cmdline?token=: %d, want %d", pprof, got, want)
		}
	}
}

// TestPluginsGetTheHostsLogLevel: both built-in plugins, real
// subprocesses of a host started with --log-level warn, are told that
// level (and nothing else of the host's TETHER_* settings), so they do
// not write debug lines the host would parse only to drop.
func TestPluginsGetTheHostsLogLevel(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--log-level", "warn"}, Env: []string{"TETHER_TOKEN=env-given-token-1234567890"}})
	found := map[string]bool{}
	for _, pid := range childPIDs(t, s.Cmd.Process.Pid) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		var name string
		switch {
		case bytes.Contains(cmdline, []byte("plugin\x00ws")):
			name = "ws"
		case bytes.Contains(cmdline, []byte("plugin\x00pty")):
			name = "pty"
		default:
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			t.Fatal(err)
		}
		vars := strings.Split(string(env), "\x00")
		if !slices.Contains(vars, contract.EnvPluginLogLevel+"=warn") {
			t.Errorf("plugin %s (pid %d): no %s=warn in its environment", name, pid, contract.EnvPluginLogLevel)
		}
		if strings.Contains(string(env), "TETHER_TOKEN") || strings.Contains(string(env), s.Token) {
			t.Errorf("plugin %s (pid %d): the host's token reached its environment", name, pid)
		}
		found[name] = true
	}
	if !found["ws"] || !found["pty"] {
		t.Fatalf("plugins found among the host's children: %v, want ws and pty", found)
	}
}

// TestAccessNoTetherEnvInPTY: a PTY's shell sees none of tether's
// TETHER_* variables (the access token among them), even when the host
// was given its token that way.
func TestAccessNoTetherEnvInPTY(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "env"}, Env: []string{"TETHER_TOKEN=env-given-token-1234567890", "TETHER_ORPHAN_GRACE=5s"}})
	if s.Token != "env-given-token-1234567890" {
		t.Fatalf("the host did not take TETHER_TOKEN: printed %q", s.Token)
	}
	p := ptyDial(t, s, "attach="+attachToken(t))
	replayOf(t, p)
	if code := closeCode(t, p); code != 4410 {
		t.Fatalf("env exited: close %d, want 4410", code)
	}
	out := string(p.Output())
	if !strings.Contains(out, "PATH=") {
		t.Fatalf("the shell's environment was not printed: %q", out)
	}
	if strings.Contains(out, "TETHER_") || strings.Contains(out, s.Token) {
		t.Errorf("a TETHER_ variable reached the PTY:\n%s", out)
	}
}

// TestAccessTokenNeverInArgv runs the documented commands the documented
// way — tether serve with its token file, tether sessions, tether attach
// — and reads every process's command line: the token is in none (not in
// the host's, its plugins' or the clients'), while the clients still get
// in by reading the host's token file.
func TestAccessTokenNeverInArgv(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "cat"}})
	scan := func(when string) {
		t.Helper()
		dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range dirs {
			b, err := os.ReadFile(p)
			if err == nil && strings.Contains(string(b), s.Token) {
				t.Errorf("%s: %s holds the token: %q", when, p, strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
	}
	scan("host running")
	out, errOut, code := e2e.Tether(t, "sessions", "--url", s.URL, "--state-dir", s.StateDir)
	if code != 0 || !strings.Contains(out, "LIVE") {
		t.Fatalf("tether sessions with the token file: exit %d\n%s%s", code, out, errOut)
	}
	// attach keeps running: scan while it is connected.
	cmd := exec.Command(e2e.Build(t), "attach", "--url", s.URL, "--state-dir", s.StateDir, "--new")
	cmd.Env = append(os.Environ(), "TETHER_TOKEN=")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr e2e.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	}()
	waitFor(t, func() bool { return strings.Contains(stderr.String(), "attach token") }, "tether attach to connect")
	waitFor(t, func() bool {
		return len(pluginsJSON(t, s.StateDir)) > 0 && pluginsJSON(t, s.StateDir)["pty"].Connections == 1
	}, "the attach to reach the PTY")
	scan("tether attach connected")
}

// TestAccessClientTokenMessages: a client command given a wrong token,
// or finding none (TETHER_TOKEN empty, no token file in its state dir),
// exits 1 with the one line that says what is wrong and where the token
// is looked for. `tether ptys` talks to the control socket and takes no
// token: a wrong one changes nothing, and an empty state dir has no host.
func TestAccessClientTokenMessages(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "cat"}})
	empty := t.TempDir()
	refused := func(dir string) string {
		return "the host refused the access token (4401 unauthorized): set TETHER_TOKEN to the host's token, or run this as the host's user on its machine so that its token file (" + filepath.Join(dir, "token") + ") is read\n"
	}
	missing := func(dir string) string {
		return "no access token: set TETHER_TOKEN, or run this as the host's user on its machine so that its token file (" + filepath.Join(dir, "token") + ") is read\n"
	}
	for _, tc := range []struct {
		name   string
		token  string // TETHER_TOKEN
		dir    string // --state-dir
		args   []string
		exit   int
		stderr string // all of it
	}{
		{"sessions, wrong token", "wrong", s.StateDir, []string{"sessions"}, 1, "tether sessions: " + refused(s.StateDir)},
		{"sessions, no token", "", empty, []string{"sessions"}, 1, "tether sessions: " + missing(empty)},
		{"sessions --json, wrong token", "wrong", s.StateDir, []string{"sessions", "--json"}, 1, "tether sessions: " + refused(s.StateDir)},
		{"attach --new, wrong token", "wrong", s.StateDir, []string{"attach", "--new"}, 1, "tether: " + refused(s.StateDir)},
		{"attach --new, no token", "", empty, []string{"attach", "--new"}, 1, "tether: " + missing(empty)},
		{"ptys, wrong token", "wrong", s.StateDir, []string{"ptys"}, 0, ""},
		{"ptys, empty state dir", "", empty, []string{"ptys"}, 1,
			"tether ptys: " + filepath.Join(host.SocketDir(empty), host.ControlSocket) + ": no tether host is running on this state dir\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(slices.Clone(tc.args), "--state-dir", tc.dir)
			if tc.args[0] != "ptys" {
				args = append(args, "--url", s.URL)
			}
			stdout, stderr, exit := runCLIEnv(t, []string{"TETHER_TOKEN=" + tc.token}, "", args...)
			if exit != tc.exit || stderr != tc.stderr {
				t.Errorf("tether %s: exit %d, stderr %q; want %d, %q", strings.Join(args, " "), exit, stderr, tc.exit, tc.stderr)
			}
			if tc.exit != 0 && stdout != "" {
				t.Errorf("tether %s: stdout %q, want nothing", strings.Join(args, " "), stdout)
			}
		})
	}
	if files, _ := os.ReadDir(empty); len(files) != 0 {
		t.Errorf("the client commands left %d files in an empty state dir, want none", len(files))
	}
}
