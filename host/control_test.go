package host

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestControlSocket(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if _, err := Control(ctx, dir, ControlRequest{Op: OpList}); !errors.Is(err, ErrNoHost) {
		t.Fatalf("Control with no host: %v, want ErrNoHost", err)
	}
	// A socket file left by a host that died is no host either, and is
	// replaced.
	sock := SocketDir(dir)
	if err := makeSocketDir(sock); err != nil {
		t.Fatal(err)
	}
	stale, err := net.Listen("unix", filepath.Join(sock, ControlSocket))
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	if _, err := Control(ctx, dir, ControlRequest{Op: OpList}); !errors.Is(err, ErrNoHost) {
		t.Fatalf("Control on a dead socket: %v, want ErrNoHost", err)
	}

	ln, err := listenControl(sock)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(filepath.Join(sock, ControlSocket))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("control socket mode %v, %v; want 0600", info.Mode(), err)
	}
	var got []ControlRequest
	srv := newControlServer(ln, func(_ context.Context, req ControlRequest) (ControlResponse, error) {
		got = append(got, req)
		if req.Op == OpStop {
			return ControlResponse{}, errors.New("no plugin named \"x\"")
		}
		return ControlResponse{Plugins: []PluginStatus{{Name: "ws", Kind: "transport", State: "running", Pid: 7}}}, nil
	}, zerolog.Nop())

	resp, err := Control(ctx, dir, ControlRequest{Op: OpReload, Name: "ws", Path: "/bin/x", SHA256: "ab"})
	if err != nil || !resp.OK || len(resp.Plugins) != 1 || resp.Plugins[0].Pid != 7 {
		t.Errorf("Control reload: %+v, %v", resp, err)
	}
	if _, err := Control(ctx, dir, ControlRequest{Op: OpStop, Name: "x"}); err == nil || !strings.Contains(err.Error(), `no plugin named "x"`) {
		t.Errorf("Control stop x: %v, want the handler's error", err)
	}
	c, err := net.Dial("unix", filepath.Join(sock, ControlSocket))
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("not json\n"))
	b := make([]byte, 512)
	n, _ := c.Read(b)
	c.Close()
	if !strings.Contains(string(b[:n]), `"ok":false`) || !strings.Contains(string(b[:n]), "bad request") {
		t.Errorf("answer to garbage: %q", b[:n])
	}
	srv.Close()
	if len(got) != 2 || got[0] != (ControlRequest{Op: OpReload, Name: "ws", Path: "/bin/x", SHA256: "ab"}) {
		t.Errorf("requests the handler saw: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(sock, ControlSocket)); !os.IsNotExist(err) {
		t.Errorf("control socket after Close: %v, want it removed", err)
	}
	if _, err := Control(ctx, dir, ControlRequest{Op: OpList}); !errors.Is(err, ErrNoHost) {
		t.Errorf("Control after Close: %v, want ErrNoHost", err)
	}
}
