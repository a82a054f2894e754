package e2e_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-agent/tether/testing/e2e"
)

// TestLifecyclePluginRefused: `tether serve --plugin` refuses a binary
// whose checksum does not match (the error says "checksum") and one that
// does not answer the tether handshake — /bin/true, and the real plugin
// run with another magic cookie, as a plugin built for another host would
// see it — with an error that says "handshake" and what to do. The host
// exits 1 and leaves no plugin behind. A reload to such a binary is
// refused the same way while the running plugin keeps serving.
func TestLifecyclePluginRefused(t *testing.T) {
	checkNoLeaks(t)
	bin := e2e.Build(t)
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o700); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := script("ws.sh", fmt.Sprintf("#!/bin/sh\nexec %s plugin ws \"$@\"\n", bin))
	goodPTY := script("pty.sh", fmt.Sprintf("#!/bin/sh\nexec %s plugin pty \"$@\"\n", bin))
	otherCookie := script("other-cookie.sh", fmt.Sprintf("#!/bin/sh\nTETHER_PLUGIN=some-other-host exec %s plugin ws \"$@\"\n", bin))
	wrongSum := strings.Repeat("ab", 32)

	tests := []struct {
		name   string
		plugin string
		want   []string
	}{
		{"transport checksum", "transport=" + good + "#" + wrongSum, []string{"checksum", wrongSum, fileSum(t, good)}},
		{"backend checksum", "backend=" + goodPTY + "#" + wrongSum, []string{"checksum", wrongSum}},
		{"malformed checksum", "transport=" + good + "#xyz", []string{"checksum", "not a hex sha256"}},
		{"transport not a plugin", "transport=/bin/true", []string{"handshake", "/bin/true", "contract.ServeTransport"}},
		{"backend not a plugin", "backend=/bin/true", []string{"handshake", "/bin/true"}},
		{"transport with another cookie", "transport=" + otherCookie, []string{"handshake", "This binary is a plugin"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := t.TempDir()
			_, errOut, code := e2e.Tether(t, "serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--log-format", "json", "--plugin", tt.plugin)
			if code != 1 {
				t.Fatalf("serve --plugin %s: exit %d, want 1\n%s", tt.plugin, code, errOut)
			}
			for _, w := range tt.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("serve --plugin %s: the error does not say %q:\n%s", tt.plugin, w, errOut)
				}
			}
			if _, err := os.Stat(recordFile(state)); !os.IsNotExist(err) {
				t.Errorf("a host that failed to start left a PTY plugin record: %v", err)
			}
		})
	}

	// The right checksum starts.
	s := e2e.Start(t, e2e.Config{Args: []string{"--plugin", "transport=" + good + "#" + fileSum(t, good)}})
	s.Dial(t)
	pid := pluginPID(t, s, 1)
	for _, bad := range []struct{ path, want string }{
		{"/bin/true", "handshake"},
		{good + "#" + wrongSum, "checksum"},
	} {
		_, errOut, code := e2e.Tether(t, "plugins", "reload", "ws", "--plugin-path", bad.path, "--state-dir", s.StateDir)
		if code != 1 || !strings.Contains(errOut, bad.want) {
			t.Errorf("plugins reload ws --plugin-path %s: exit %d %q, want 1 and %q", bad.path, code, errOut, bad.want)
		}
	}
	if !pidAlive(pid) {
		t.Errorf("the running plugin %d stopped after a refused reload", pid)
	}
	s.Dial(t) // still serving
}

// fileSum is the hex sha256 of the file at path.
func fileSum(tb testing.TB, path string) string {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
