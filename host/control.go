package host

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/supervise"
	"github.com/tether-agent/tether/internal/statedir"
)

// ControlSocket is the name of the host's control socket in its socket
// dir (SocketDir: <state-dir>/plugins, unless that is too long a path).
// `tether plugins` and `tether ptys` talk to the running host through
// it: one JSON ControlRequest line in, one ControlResponse line out, then
// the host closes the connection. The socket has mode 0600 in the 0700 state dir:
// only the host's user can reach it.
const ControlSocket = "control.sock"

// Control operations.
const (
	// OpList: every plugin's PluginStatus.
	OpList = "list"
	// OpReload: swap the transport plugin Name for a fresh process (of
	// Path when given); for the PTY backend, start it if it is stopped.
	OpReload = "reload"
	// OpStop: stop the PTY backend plugin Name and its PTYs.
	OpStop = "stop"
	// OpLoad: start a transport plugin of Kind (transport) from Path
	// under Name, serving Listen, beside the running ones.
	OpLoad = "load"
	// OpUnload: stop the added transport Name; its sockets are closed
	// with 1012 and their sessions parked.
	OpUnload = "unload"
	// OpPTYs: every live PTY of the PTY backend (PTYs), for `tether
	// ptys`. The answer holds attach tokens, each enough (with the access
	// token) to type into its PTY: the socket's mode keeps it to the
	// host's user.
	OpPTYs = "ptys"
	// OpNotifyTest: send one test notification through every notifier
	// (Notifiers holds each one's answer), for `tether notify test`.
	OpNotifyTest = "notify-test"
)

// Control errors.
var (
	// ErrNoHost: no host answers on the state dir's control socket.
	ErrNoHost = errors.New("no tether host is running on this state dir")
	// ErrNoPTYBackend: the host runs no PTY backend (/api/pty is off).
	ErrNoPTYBackend = errors.New("this host runs no PTY backend (/api/pty is off)")
)

// controlTimeout bounds one control request (a reload waits for the new
// plugin's handshake and the old one's sockets to close).
const controlTimeout = 60 * time.Second

// ControlRequest is one request on the control socket.
type ControlRequest struct {
	Op   string `json:"op"`
	Name string `json:"name,omitempty"`
	// Path and SHA256 (optional) name a new plugin binary for OpReload
	// and OpLoad. Path is absolute; the binary is run with no arguments,
	// like one given with --plugin.
	Path   string `json:"path,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// Kind (OpLoad) is the plugin's kind: transport.
	Kind string `json:"kind,omitempty"`
	// Listen (OpLoad) is the address the transport serves; empty:
	// unix:<state-dir>/<name>.sock (see TransportSpec.Listen).
	Listen string `json:"listen,omitempty"`
}

// ControlResponse is the host's answer.
type ControlResponse struct {
	OK      bool           `json:"ok"`
	Error   string         `json:"error,omitempty"`
	Plugins []PluginStatus `json:"plugins,omitempty"`
	PTYs    []PTYStatus    `json:"ptys,omitempty"`
	// Notifiers (OpNotifyTest) are the notifiers' answers.
	Notifiers []NotifyResult `json:"notifiers,omitempty"`
}

// PTYStatus describes one live PTY (OpPTYs).
type PTYStatus struct {
	// Token is the PTY's attach token.
	Token string `json:"token"`
	// Pid is its process (the process group's leader).
	Pid int `json:"pid"`
	// Cols and Rows are the terminal's size.
	Cols int `json:"cols"`
	Rows int `json:"rows"`
	// Writer says a writer is attached; Viewers counts the read-only
	// viewers.
	Writer  bool `json:"writer"`
	Viewers int  `json:"viewers"`
	// Created is when the PTY started; Detached when its last writer
	// left (zero while one is attached).
	Created  time.Time `json:"created"`
	Detached time.Time `json:"detached,omitzero"`
}

// ptyLister is what OpPTYs asks for the PTYs (a *supervise.Backend).
type ptyLister interface {
	List(ctx context.Context) ([]contract.PTYInfo, error)
}

// listPTYs answers OpPTYs: the live PTYs of l (those whose process has
// exited are about to go and left out), oldest first.
func listPTYs(ctx context.Context, l ptyLister) (ControlResponse, error) {
	infos, err := l.List(ctx)
	if err != nil {
		return ControlResponse{}, fmt.Errorf("listing the PTYs: %w", err)
	}
	ptys := make([]PTYStatus, 0, len(infos))
	for _, p := range infos {
		if p.Exited {
			continue
		}
		ptys = append(ptys, PTYStatus{
			Token: p.Token, Pid: p.Pid, Cols: p.Cols, Rows: p.Rows,
			Writer: !p.Writer.IsZero(), Viewers: p.Viewers,
			Created: p.Created, Detached: p.Detached,
		})
	}
	slices.SortStableFunc(ptys, func(a, b PTYStatus) int { return a.Created.Compare(b.Created) })
	return ControlResponse{PTYs: ptys}, nil
}

// PluginStatus describes one plugin of the running host.
type PluginStatus = supervise.PluginStatus

// Control sends req to the host running on stateDir and returns its
// answer. It fails with ErrNoHost when nothing listens on the control
// socket.
func Control(ctx context.Context, stateDir string, req ControlRequest) (ControlResponse, error) {
	sockDir := SocketDir(stateDir)
	path := filepath.Join(sockDir, ControlSocket)
	// connect(2) follows a symbolic link: the state dir, the socket dir
	// and the socket must be ours and no link, or the answer could come
	// from another user's process posing as the host.
	err := statedir.CheckTop(stateDir)
	if err == nil {
		err = statedir.CheckFile(sockDir)
	}
	if err == nil {
		err = statedir.CheckFile(path)
	}
	if err != nil {
		return ControlResponse{}, fmt.Errorf("control socket: %w", err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return ControlResponse{}, fmt.Errorf("%s: %w", path, ErrNoHost)
		}
		return ControlResponse{}, fmt.Errorf("control socket: %w", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	b, _ := json.Marshal(req)
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return ControlResponse{}, fmt.Errorf("control socket: %w", err)
	}
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		return ControlResponse{}, fmt.Errorf("control socket: reading the answer: %w", err)
	}
	var resp ControlResponse
	if err := json.Unmarshal(line, &resp); err != nil {
		return ControlResponse{}, fmt.Errorf("control socket: bad answer: %w", err)
	}
	if !resp.OK {
		return resp, errors.New(resp.Error)
	}
	return resp, nil
}

// controlServer serves the control socket.
type controlServer struct {
	ln     *net.UnixListener
	handle func(context.Context, ControlRequest) (ControlResponse, error)
	log    zerolog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// listenControl makes the control socket in the socket dir. Only the
// holder of the state dir's lock calls it, so a socket file there is one
// a host that died left behind: it is replaced.
func listenControl(sockDir string) (*net.UnixListener, error) {
	path := filepath.Join(sockDir, ControlSocket)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return ln, nil
}

func newControlServer(ln *net.UnixListener, handle func(context.Context, ControlRequest) (ControlResponse, error), log zerolog.Logger) *controlServer {
	c := &controlServer{ln: ln, handle: handle, log: log}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(1)
	go c.serve()
	return c
}

func (c *controlServer) serve() {
	defer c.wg.Done()
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			if c.ctx.Err() == nil {
				c.log.Error().Err(err).Msg("control socket")
			}
			return
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.serveConn(conn)
		}()
	}
}

func (c *controlServer) serveConn(conn net.Conn) {
	defer conn.Close()
	ctx, cancel := context.WithTimeout(c.ctx, controlTimeout)
	defer cancel()
	_ = conn.SetDeadline(time.Now().Add(controlTimeout))
	var resp ControlResponse
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	var req ControlRequest
	switch {
	case err != nil:
		c.log.Debug().Err(err).Msg("control request")
		return
	case json.Unmarshal(line, &req) != nil:
		resp.Error = "bad request: want one JSON object per line"
	default:
		c.log.Info().Str("op", req.Op).Str("name", req.Name).Str("path", req.Path).Msg("control request")
		if resp, err = c.handle(ctx, req); err != nil {
			resp.Error = err.Error()
			c.log.Warn().Err(err).Str("op", req.Op).Str("name", req.Name).Msg("control request failed")
		} else {
			resp.OK = true
		}
	}
	b, _ := json.Marshal(resp)
	_, _ = conn.Write(append(b, '\n'))
}

// Close stops serving (the socket file is removed) and waits for the
// requests in flight; their contexts are cancelled.
func (c *controlServer) Close() {
	c.cancel()
	_ = c.ln.Close()
	c.wg.Wait()
}

// controlHandler answers the control socket's requests.
func controlHandler(ts *supervise.Transports, backend *supervise.Backend) func(context.Context, ControlRequest) (ControlResponse, error) {
	return func(ctx context.Context, req ControlRequest) (ControlResponse, error) {
		var spec *PluginSpec
		if req.Path != "" {
			if !filepath.IsAbs(req.Path) {
				return ControlResponse{}, fmt.Errorf("plugin path %q is not absolute", req.Path)
			}
			spec = &PluginSpec{Name: req.Name, Path: req.Path, SHA256: req.SHA256}
		}
		isPTY := backend != nil && req.Name == backend.Name()
		var err error
		switch req.Op {
		case OpPTYs:
			if backend == nil {
				return ControlResponse{}, ErrNoPTYBackend
			}
			return listPTYs(ctx, backend)
		case OpList:
		case OpReload:
			switch sup := ts.Get(req.Name); {
			case sup != nil:
				_, err = sup.Reload(ctx, spec)
			case isPTY:
				_, err = backend.Reload(ctx, spec)
			default:
				err = noPlugin(req.Name, ts, backend)
			}
		case OpStop:
			switch {
			case isPTY:
				_, err = backend.StopPTYs(ctx)
			case ts.Get(req.Name) != nil:
				err = fmt.Errorf("plugin %s is a transport: it is not stopped on its own; unload it (an added transport) or reload it to swap it for a fresh process", req.Name)
			default:
				err = noPlugin(req.Name, ts, backend)
			}
		case OpLoad:
			switch {
			case req.Kind != contract.KindTransport:
				err = fmt.Errorf("load %s: kind %q cannot be loaded at runtime (only %s)", req.Name, req.Kind, contract.KindTransport)
			case spec == nil:
				err = fmt.Errorf("load %s: a plugin path is required", req.Name)
			default:
				if err = CheckTransportName(req.Name); err == nil {
					_, err = ts.Load(ctx, TransportSpec{PluginSpec: *spec, Listen: req.Listen}, nil)
				}
			}
		case OpUnload:
			if isPTY {
				err = fmt.Errorf("plugin %s is the PTY backend: stop it with `tether plugins stop %s`", req.Name, req.Name)
			} else {
				err = ts.Unload(ctx, req.Name)
			}
		default:
			err = fmt.Errorf("unknown operation %q (want %s, %s, %s, %s, %s or %s)", req.Op, OpList, OpReload, OpLoad, OpUnload, OpStop, OpPTYs)
		}
		if err != nil {
			return ControlResponse{}, err
		}
		ps := make([]PluginStatus, 0, 4)
		for _, sup := range ts.List() {
			ps = append(ps, sup.Status())
		}
		if backend != nil {
			ps = append(ps, backend.Status())
		}
		return ControlResponse{Plugins: ps}, nil
	}
}

// noPlugin is the error for a name no plugin has.
func noPlugin(name string, ts *supervise.Transports, backend *supervise.Backend) error {
	var names []string
	for _, sup := range ts.List() {
		names = append(names, sup.Name())
	}
	if backend != nil {
		names = append(names, backend.Name())
	}
	return fmt.Errorf("no plugin named %q (plugins: %s)", name, strings.Join(names, ", "))
}
