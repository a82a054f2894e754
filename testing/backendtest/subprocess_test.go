package backendtest_test

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/testing/backendtest"
	"github.com/tether-agent/tether/testing/e2e"
)

// TestPluginPTY runs the kit against the real `tether plugin pty`
// subprocess, one process per check, as the host starts it.
func TestPluginPTY(t *testing.T) {
	bin := e2e.Build(t) // once per test binary
	backendtest.Run(t, func(t *testing.T) contract.Backend {
		return startPlugin(t, pluginCmd(bin, "pty"))
	})
}

// pluginCmd is `tether plugin NAME`. A binary built with -race sleeps a
// second before it exits unless told otherwise.
func pluginCmd(bin, name string) *exec.Cmd {
	cmd := exec.Command(bin, "plugin", name)
	cmd.Env = append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return cmd
}

// startPlugin starts cmd as a go-plugin subprocess, dispenses its backend
// and kills it at cleanup (after the kit has closed every PTY). The
// plugin's stderr is logged when the test fails.
func startPlugin(t *testing.T, cmd *exec.Cmd) *contract.BackendGRPCClient {
	t.Helper()
	stderr := new(lockedBuffer)
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  contract.Handshake,
		Plugins:          contract.PluginMap(),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
		Stderr:           stderr,
	})
	t.Cleanup(func() {
		client.Kill()
		if t.Failed() {
			t.Logf("plugin stderr:\n%s", stderr.String())
		}
	})
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("start plugin %v: %v", cmd.Args, err)
	}
	raw, err := rpc.Dispense(contract.KindBackend)
	if err != nil {
		t.Fatalf("Dispense(%q): %v", contract.KindBackend, err)
	}
	be, ok := raw.(*contract.BackendGRPCClient)
	if !ok {
		t.Fatalf("Dispense(%q): got %T, want *contract.BackendGRPCClient", contract.KindBackend, raw)
	}
	return be
}

// lockedBuffer is a bytes.Buffer safe for the writer goroutine go-plugin
// runs and the test goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
