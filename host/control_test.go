package host

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/supervise"
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
	if err := makeSocketDir(sock, zerolog.Nop()); err != nil {
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

// fakeLister is a PTY backend's List.
type fakeLister struct {
	ptys []contract.PTYInfo
	err  error
}

func (f fakeLister) List(context.Context) ([]contract.PTYInfo, error) { return f.ptys, f.err }

func TestControlPTYs(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sock := SocketDir(dir)
	if err := makeSocketDir(sock, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	ln, err := listenControl(sock)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	lister := fakeLister{ptys: []contract.PTYInfo{
		{Token: "newer-token-0123456", Pid: 12, Cols: 80, Rows: 24, Viewers: 2,
			Created: t0.Add(time.Minute), Detached: t0.Add(2 * time.Minute)},
		{Token: "gone-token-01234567", Pid: 13, Exited: true, Created: t0},
		{Token: "older-token-0123456", Pid: 11, Cols: 120, Rows: 40,
			Writer: contract.TransportID{Instance: "ws-1", Conn: 7}, Created: t0},
	}}
	srv := newControlServer(ln, func(ctx context.Context, _ ControlRequest) (ControlResponse, error) {
		return listPTYs(ctx, lister)
	}, zerolog.Nop())
	defer srv.Close()

	resp, err := Control(ctx, dir, ControlRequest{Op: OpPTYs})
	if err != nil {
		t.Fatalf("Control ptys: %v", err)
	}
	want := []PTYStatus{
		{Token: "older-token-0123456", Pid: 11, Cols: 120, Rows: 40, Writer: true, Created: t0},
		{Token: "newer-token-0123456", Pid: 12, Cols: 80, Rows: 24, Viewers: 2,
			Created: t0.Add(time.Minute), Detached: t0.Add(2 * time.Minute)},
	}
	if len(resp.PTYs) != len(want) {
		t.Fatalf("ptys %+v, want %+v", resp.PTYs, want)
	}
	for i := range want {
		got := resp.PTYs[i]
		if got.Token != want[i].Token || got.Pid != want[i].Pid || got.Cols != want[i].Cols || got.Rows != want[i].Rows ||
			got.Writer != want[i].Writer || got.Viewers != want[i].Viewers ||
			!got.Created.Equal(want[i].Created) || !got.Detached.Equal(want[i].Detached) {
			t.Errorf("pty %d: got %+v, want %+v", i, got, want[i])
		}
	}

	// The wire form: snake_case names, no detached time while attached.
	c, err := net.Dial("unix", filepath.Join(sock, ControlSocket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(`{"op":"ptys"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{
		`{"token":"older-token-0123456","pid":11,"cols":120,"rows":40,"writer":true,"viewers":0,"created":"2030-01-02T03:04:05Z"}`,
		`"detached":"2030-01-02T03:06:05Z"`,
	} {
		if !strings.Contains(line, sub) {
			t.Errorf("answer %s lacks %s", line, sub)
		}
	}
}

func TestControlPTYsErrors(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	if _, err := listPTYs(ctx, fakeLister{err: boom}); !errors.Is(err, boom) {
		t.Errorf("listPTYs with a failing backend: %v, want it wrapped", err)
	}
	resp, err := listPTYs(ctx, fakeLister{})
	if err != nil || resp.PTYs == nil || len(resp.PTYs) != 0 {
		t.Errorf("listPTYs with no PTY: %+v, %v; want an empty list", resp, err)
	}
	// A host without a PTY backend says so.
	h := controlHandler(supervise.NewTransports(supervise.Options{}), nil)
	if _, err := h(ctx, ControlRequest{Op: OpPTYs}); !errors.Is(err, ErrNoPTYBackend) {
		t.Errorf("ptys with no backend: %v, want ErrNoPTYBackend", err)
	}
	if _, err := h(ctx, ControlRequest{Op: "nope"}); err == nil || !strings.Contains(err.Error(), OpPTYs) {
		t.Errorf("unknown op: %v, want the list of operations with %s", err, OpPTYs)
	}
}
