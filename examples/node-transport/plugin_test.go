// Package nodetransport holds the Go tests of the Node.js transport
// plugin beside them (transport.mjs): the conformance kit against the real
// node subprocess, go-plugin's handshake and services by hand, the error
// classes across gRPC, and a real host that loads it.
package nodetransport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/contract/proto/tetherv1"
	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/transporttest"
)

func TestMain(m *testing.M) { e2e.Main(m) }

// wait bounds every wait of these tests.
const wait = 10 * time.Second

// nodeScript returns the node binary and the plugin's absolute path. It
// skips the test without node, and fails it when node is there but the
// npm packages are not (CI installs them with npm ci).
func nodeScript(t *testing.T) (node, script string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("node is not installed: the Node.js transport's tests need node 20 or later (and `npm ci` in examples/node-transport): %v", err)
	}
	script, err = filepath.Abs("transport.mjs")
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"@grpc/grpc-js", "@grpc/proto-loader"} {
		if _, err := os.Stat(filepath.Join("node_modules", pkg, "package.json")); err != nil {
			t.Fatalf("%s is not installed: run `npm ci` in examples/node-transport: %v", pkg, err)
		}
	}
	return node, script
}

// startPlugin starts the plugin as the host does (go-plugin's client,
// contract.Handshake, gRPC only) and kills it at cleanup; its stderr is
// logged when the test fails.
func startPlugin(t *testing.T) (*contract.TransportGRPCClient, *plugin.GRPCClient) {
	t.Helper()
	node, script := nodeScript(t)
	stderr := new(lockedBuffer)
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  contract.Handshake,
		Plugins:          contract.PluginMap(),
		Cmd:              exec.Command(node, script),
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
		t.Fatalf("start the node plugin: %v\nstderr:\n%s", err, stderr.String())
	}
	raw, err := rpc.Dispense(contract.KindTransport)
	if err != nil {
		t.Fatalf("Dispense: %v", err)
	}
	return raw.(*contract.TransportGRPCClient), rpc.(*plugin.GRPCClient)
}

// socketPath returns a socket path in a new short directory.
func socketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "s.sock")
}

// TestConformance runs the Go conformance kit against the Node.js
// plugin, one node process per check, through go-plugin as the host runs
// it.
func TestConformance(t *testing.T) {
	nodeScript(t)
	transporttest.Run(t,
		func(t *testing.T) contract.Transport {
			tr, _ := startPlugin(t)
			return tr
		},
		transporttest.WithListen(func(t *testing.T) string { return "unix:" + socketPath(t) }),
		transporttest.WithDialer(transporttest.LineDialer),
		transporttest.Without(transporttest.Binary|transporttest.MultilineText|transporttest.HalfOpen),
	)
}

// TestHandshake runs the plugin by hand, as a host in any language would:
// without the cookie it refuses; with it, it prints one line
// CORE|APP|unix|PATH|grpc with PATH in PLUGIN_UNIX_SOCKET_DIR, serves the
// health service "plugin", and exits 0 on GRPCController.Shutdown,
// removing its socket.
func TestHandshake(t *testing.T) {
	node, script := nodeScript(t)

	t.Run("no cookie", func(t *testing.T) {
		cmd := exec.Command(node, script)
		cmd.Env = append(os.Environ(), contract.Handshake.MagicCookieKey+"=wrong")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || stdout.Len() > 0 || !strings.Contains(stderr.String(), "This binary is a plugin") {
			t.Errorf("run without the cookie: %v, stdout %q, stderr %q; want exit 1, nothing on stdout, the plugin notice", err, stdout.String(), stderr.String())
		}
	})

	t.Run("serve and shut down", func(t *testing.T) {
		dir := filepath.Dir(socketPath(t))
		cmd := exec.Command(node, script)
		cmd.Env = append(os.Environ(),
			contract.Handshake.MagicCookieKey+"="+contract.Handshake.MagicCookieValue,
			"PLUGIN_PROTOCOL_VERSIONS=1",
			plugin.EnvUnixSocketDir+"="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		stderr := new(lockedBuffer)
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		lines := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(out)
			if sc.Scan() {
				lines <- sc.Text()
			}
			for sc.Scan() {
				t.Errorf("a second line on stdout: %q", sc.Text())
			}
			exited <- cmd.Wait()
		}()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-exited
		})
		var line string
		select {
		case line = <-lines:
		case <-time.After(wait):
			t.Fatalf("no handshake line after %v; stderr:\n%s", wait, stderr.String())
		}
		parts := strings.Split(line, "|")
		if len(parts) != 5 || parts[0] != "1" || parts[1] != "1" || parts[2] != "unix" || parts[4] != "grpc" || filepath.Dir(parts[3]) != dir {
			t.Fatalf("handshake line %q: want 1|1|unix|%s/…|grpc", line, dir)
		}
		conn, err := grpc.NewClient("unix://"+parts[3], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		res, err := grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: plugin.GRPCServiceName})
		if err != nil || res.GetStatus() != grpc_health_v1.HealthCheckResponse_SERVING {
			t.Fatalf("health check of %q: %v %v, want SERVING", plugin.GRPCServiceName, res, err)
		}
		// go-plugin's Empty and protobuf's are the same on the wire.
		if err := conn.Invoke(ctx, "/plugin.GRPCController/Shutdown", &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
			t.Fatalf("GRPCController.Shutdown: %v", err)
		}
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			if err != nil {
				t.Errorf("exit after Shutdown: %v, want status 0", err)
			}
		case <-time.After(wait):
			t.Fatalf("still running %v after Shutdown", wait)
		}
		if _, err := os.Stat(parts[3]); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the plugin's socket after its exit: %v, want it removed", err)
		}
	})
}

// TestErrorClasses checks that the plugin's errors carry tether's
// ErrorInfo, so that errors.Is works on the host's side.
func TestErrorClasses(t *testing.T) {
	tr, rpc := startPlugin(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, err := tr.Start(ctx, contract.StartRequest{Listen: "unix:" + socketPath(t), SendQueue: -1}); !errors.Is(err, contract.ErrInvalidArgument) {
		t.Errorf("Start with a negative setting: got %v, want contract.ErrInvalidArgument", err)
	}
	if _, err := tr.Start(ctx, contract.StartRequest{Listen: "nowhere"}); !errors.Is(err, contract.ErrInvalidArgument) {
		t.Errorf("Start on an address it cannot serve: got %v, want contract.ErrInvalidArgument", err)
	}
	resp, err := tr.Start(ctx, contract.StartRequest{Listen: "unix:" + socketPath(t)})
	if err != nil || !strings.HasPrefix(resp.Addr, "unix:") || resp.Version == "" {
		t.Fatalf("Start: %+v %v, want a unix: address and a version", resp, err)
	}
	if _, err := tr.Start(ctx, contract.StartRequest{Listen: "unix:" + socketPath(t)}); !errors.Is(err, contract.ErrInvalidArgument) {
		t.Errorf("second Start: got %v, want contract.ErrInvalidArgument", err)
	}
	if st, err := tr.Stats(ctx); err != nil || st.Connections != 0 {
		t.Errorf("Stats: %+v %v, want no connection", st, err)
	}

	// The host's client refuses a second Link by itself; ask the plugin.
	raw := tetherv1.NewTransportClient(rpc.Conn)
	first, err := raw.Link(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Send(&tetherv1.CommandBatch{}); err != nil { // the stream is open on the plugin's side once it has a message
		t.Fatal(err)
	}
	second, err := raw.Link(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := second.Recv(); !errors.Is(contract.FromGRPC(err), contract.ErrAlreadyLinked) {
		t.Errorf("a second Link: got %v, want contract.ErrAlreadyLinked", err)
	}

	if err := tr.Stop(ctx, contract.StopRequest{}); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := first.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("the link after Stop: got %v, want its end (io.EOF: the plugin ended it with OK)", err)
	}
	if _, err := tr.Start(ctx, contract.StartRequest{Listen: "unix:" + socketPath(t)}); !errors.Is(err, contract.ErrStopped) {
		t.Errorf("Start after Stop: got %v, want contract.ErrStopped", err)
	}
}

// lockedBuffer is a bytes.Buffer for a writer goroutine and the test.
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
