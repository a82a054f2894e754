// Package kitcheck holds what the conformance kits' own tests share:
// starting a real plugin subprocess to run a kit against, and checking
// that a kit fails deliberately broken plugins in the checks it should.
package kitcheck

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/tether-agent/tether/contract"
)

// PluginCmd is `tether plugin NAME` run from bin. A binary built with
// -race sleeps a second before it exits unless told otherwise.
func PluginCmd(bin, name string) *exec.Cmd {
	cmd := exec.Command(bin, "plugin", name)
	cmd.Env = append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return cmd
}

// StartPlugin starts cmd as a go-plugin subprocess, dispenses kind
// (contract.KindTransport or contract.KindBackend) as a T (its gRPC
// client type) and kills it at cleanup. The plugin's stderr is logged
// when the test fails.
func StartPlugin[T any](t *testing.T, cmd *exec.Cmd, kind string) T {
	t.Helper()
	stderr := new(lockedBuffer)
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  contract.Handshake,
		Plugins:          contract.PluginMap(),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
		Stderr:           stderr,
		GRPCDialOptions:  contract.DialOptions(),
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
	raw, err := rpc.Dispense(kind)
	if err != nil {
		t.Fatalf("Dispense(%q): %v", kind, err)
	}
	c, ok := raw.(T)
	if !ok {
		t.Fatalf("Dispense(%q): got %T, want %T", kind, raw, c)
	}
	return c
}

// StartTransportWithDataPlane starts cmd as a transport plugin as the
// host does: with a data plane offered (contract.DataPlaneProtocol), the
// plugin's end inherited as the next descriptor after cmd's ExtraFiles.
// Whether the plugin takes it is up to the kit's Start.
func StartTransportWithDataPlane(t *testing.T, cmd *exec.Cmd) *contract.TransportGRPCClient {
	t.Helper()
	host, pf, err := contract.NewDataPlanePair()
	if err != nil {
		t.Fatalf("NewDataPlanePair: %v", err)
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, pf)
	name := fmt.Sprintf("fd:%d", 2+len(cmd.ExtraFiles))
	tc := StartPlugin[*contract.TransportGRPCClient](t, cmd, contract.KindTransport)
	pf.Close() // the child has its copy
	tc.OfferDataPlane(host, name)
	return tc
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

// Broken is one deliberately broken plugin and the kit's checks that
// must fail on it (nil: the kit must pass).
type Broken struct {
	Name     string
	WantFail []string
}

// RunBroken runs the test binary's TestBrokenHelper once per case in a
// child process with env set to the case's name (the kit takes a
// *testing.T, so a failing run must be a failing test), and checks that
// exactly the runs that should fail do, in at least the checks named.
// what names the plugin kind in messages ("transport", "backend").
func RunBroken(t *testing.T, env, what string, cases []Broken) {
	failLine := regexp.MustCompile(`(?m)^\s*--- FAIL: TestBrokenHelper/([^/\s]+)`)
	for _, tt := range cases {
		t.Run(tt.Name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenHelper$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), env+"="+tt.Name)
			out, err := cmd.CombinedOutput()
			var failed []string
			for _, m := range failLine.FindAllStringSubmatch(string(out), -1) {
				if !slices.Contains(failed, m[1]) {
					failed = append(failed, m[1])
				}
			}
			sort.Strings(failed)
			if tt.WantFail == nil {
				if err != nil || len(failed) > 0 {
					t.Fatalf("kit on an intact %s: got %v, failed checks %q, want a pass\n%s", what, err, failed, out)
				}
				return
			}
			if _, ok := err.(*exec.ExitError); !ok {
				t.Fatalf("kit on %s: got %v, want the test process to fail\n%s", tt.Name, err, out)
			}
			for _, name := range tt.WantFail {
				if !slices.Contains(failed, name) {
					t.Errorf("kit on %s: check %s passed, want it to fail (failed: %q)", tt.Name, name, failed)
				}
			}
			if t.Failed() {
				t.Logf("output:\n%s", out)
			} else {
				t.Logf("failed checks: %q", failed)
			}
		})
	}
}
