package supervise

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

// TestStartPluginRefused starts binaries that are not tether plugins
// through the real go-plugin client: each is refused with an error that
// names the check (ErrHandshake, ErrChecksum) and says what to do.
func TestStartPluginRefused(t *testing.T) {
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o700); err != nil {
			t.Fatal(err)
		}
		return p
	}
	silent := script("silent.sh", "#!/bin/sh\nexit 0\n")
	chatty := script("chatty.sh", "#!/bin/sh\necho 'I am no plugin' >&2\necho garbage\n")
	oldProto := script("v2.sh", "#!/bin/sh\necho '1|2|unix|/nonexistent|grpc|'\nsleep 5\n")
	sum, err := fileSHA256(silent)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		spec PluginSpec
		is   error
		want []string
	}{
		{"exits at once", PluginSpec{Name: "ws", Path: silent}, ErrHandshake, []string{"handshake failed", silent, "contract.ServeTransport"}},
		{"an added transport's advice names the built-in", PluginSpec{Name: "u3", Path: silent}, ErrHandshake, []string{"exec tether plugin ws"}},
		{"prints garbage", PluginSpec{Name: "ws", Path: chatty}, ErrHandshake, []string{"handshake failed", "garbage", "I am no plugin"}},
		{"other protocol version", PluginSpec{Name: "ws", Path: oldProto}, ErrHandshake, []string{"handshake failed", "version"}},
		{"checksum mismatch", PluginSpec{Name: "ws", Path: silent, SHA256: strings.Repeat("0", 64)}, ErrChecksum, []string{"checksum mismatch", strings.Repeat("0", 64), sum}},
		{"malformed checksum", PluginSpec{Name: "ws", Path: silent, SHA256: "abc"}, ErrChecksum, []string{"not a hex sha256"}},
		{"missing binary", PluginSpec{Name: "ws", Path: filepath.Join(dir, "nope")}, nil, []string{"cannot run it"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := startPlugin(tt.spec, contract.KindTransport, procOptions{BinDir: filepath.Join(dir, "bin")}, zerolog.Nop())
			if err == nil {
				p.client.Kill()
				t.Fatalf("startPlugin(%s) succeeded", tt.spec.Path)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %q is not %v", err, tt.is)
			}
			if tt.is == nil && (errors.Is(err, ErrHandshake) || errors.Is(err, ErrChecksum)) {
				t.Errorf("error %q: a binary that cannot run is no handshake or checksum failure", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestPluginLogWriterTail(t *testing.T) {
	w := newPluginLogWriter(zerolog.Nop(), "ws", nil)
	for _, s := range []string{"one\n", "two\nthr", "ee\n", `{"level":"warn","message":"four"}` + "\n", "fi"} {
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"two", "three", `{"level":"warn","message":"four"}`, "fi"}
	if got := w.tail(); !slices.Equal(got, want) {
		t.Errorf("tail: got %q, want %q", got, want)
	}
	if got := w.tail(); !slices.Equal(got, want) {
		t.Errorf("tail is not repeatable: got %q", got)
	}
}

func TestMergeEnv(t *testing.T) {
	got := mergeEnv([]string{"A=1", "B=2", "PLUGIN_UNIX_SOCKET_DIR=/tmp", "C=3"}, []string{"B=x", "PLUGIN_UNIX_SOCKET_DIR=/state/plugins"})
	want := []string{"A=1", "C=3", "B=x", "PLUGIN_UNIX_SOCKET_DIR=/state/plugins"}
	if !slices.Equal(got, want) {
		t.Errorf("mergeEnv: got %q, want %q", got, want)
	}
}

// TestPluginEnvLogLevel: a plugin learns the host's log level, and none
// of the host's own TETHER_* settings.
func TestPluginEnvLogLevel(t *testing.T) {
	host := []string{"PATH=/bin", "TETHER_TOKEN=secret", contract.EnvPluginLogLevel + "=trace"}
	for _, tc := range []struct {
		log  zerolog.Logger
		want string
	}{
		{zerolog.Nop().Level(zerolog.WarnLevel), "warn"},
		{zerolog.Nop().Level(zerolog.DebugLevel), "debug"},
		{zerolog.Nop(), "disabled"}, // a host that logs nothing
	} {
		env := pluginEnv(host, []string{"X=1"}, tc.log)
		var level []string
		for _, kv := range env {
			if strings.HasPrefix(kv, "TETHER_TOKEN=") {
				t.Errorf("the host's token reached the plugin: %q", env)
			}
			if v, ok := strings.CutPrefix(kv, contract.EnvPluginLogLevel+"="); ok {
				level = append(level, v)
			}
		}
		if len(level) != 1 || level[0] != tc.want || !slices.Contains(env, "X=1") || !slices.Contains(env, "PATH=/bin") {
			t.Errorf("host at %v: plugin env %q, want %s=%s once, X=1 and PATH", tc.log.GetLevel(), env, contract.EnvPluginLogLevel, tc.want)
		}
	}
}

// TestVerifiedExecTOCTOU swaps the plugin's path for another program
// between the host's open of it and its reading: the bytes that run are
// the bytes that were hashed (the good plugin answers the handshake), the
// swapped-in program never runs (it would leave a marker file), and a
// path that points at the other program from the start is refused.
func TestVerifiedExecTOCTOU(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "evil-ran")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good.sh")
	if err := os.WriteFile(good, []byte("#!/bin/sh\n"+fakePluginEnv+"=1 exec "+self+" \"$@\"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	evil := filepath.Join(dir, "evil.sh")
	if err := os.WriteFile(evil, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "plugin")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	sum, err := fileSHA256(good)
	if err != nil {
		t.Fatal(err)
	}
	swap := func() {
		tmp := link + ".new"
		if err := os.Symlink(evil, tmp); err != nil {
			t.Error(err)
			return
		}
		if err := os.Rename(tmp, link); err != nil {
			t.Error(err)
		}
	}
	openHook = swap
	t.Cleanup(func() { openHook = nil })
	p, err := startPlugin(PluginSpec{Name: "x", Path: link, SHA256: sum}, contract.KindTransport, procOptions{BinDir: filepath.Join(dir, "bin")}, zerolog.Nop())
	openHook = nil
	if err != nil {
		t.Fatalf("the verified plugin did not start: %v", err)
	}
	p.client.Kill()
	if target, _ := os.Readlink(link); target != evil {
		t.Fatalf("the hook did not swap the path (it points at %s)", target)
	}
	// Now the path is the other program from the start: refused, and it
	// never runs.
	if _, err := startPlugin(PluginSpec{Name: "x", Path: link, SHA256: sum}, contract.KindTransport, procOptions{BinDir: filepath.Join(dir, "bin2")}, zerolog.Nop()); !errors.Is(err, ErrChecksum) {
		t.Fatalf("start of the swapped path: %v, want ErrChecksum", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the swapped-in program ran")
	}
}
