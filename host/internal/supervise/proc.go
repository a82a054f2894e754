package supervise

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/internal/statedir"
)

// PluginSpec says how to run a plugin process.
type PluginSpec struct {
	// Name is the plugin's name in logs and listings, e.g. "ws".
	Name string
	// Path is the executable; Args its arguments.
	Path string
	Args []string
	// SHA256 is the expected hex checksum of Path, or "".
	SHA256 string
}

// Plugin start errors.
var (
	// ErrChecksum: the plugin binary's checksum did not match.
	ErrChecksum = errors.New("plugin checksum mismatch")
	// ErrHandshake: the binary did not answer the go-plugin handshake of
	// a tether plugin (TETHER_PLUGIN magic cookie, protocol version 1,
	// gRPC).
	ErrHandshake = errors.New("plugin handshake failed")
)

// pluginStartTimeout bounds a plugin's handshake.
const pluginStartTimeout = 15 * time.Second

// pluginProc is a running plugin subprocess, started or reattached.
type pluginProc struct {
	client *plugin.Client
	rpc    plugin.ClientProtocol
	tr     *contract.TransportGRPCClient // kind transport
	be     *contract.BackendGRPCClient   // kind backend
	nt     *contract.NotifyGRPCClient    // kind notify
	pid    int
	addr   net.Addr
	logw   *pluginLogWriter // nil for a reattached plugin (its stderr is not ours)
	log    zerolog.Logger
	argv   []string // the command line it was started with; nil when reattached
}

// release closes the host's connection to the plugin without stopping
// the plugin: unlike client.Kill (and the ClientProtocol's Close, which
// asks the plugin to shut down) it leaves the process running, for the
// next host to reattach to.
func (p *pluginProc) release() {
	if g, ok := p.rpc.(*plugin.GRPCClient); ok {
		_ = g.Conn.Close()
	}
}

// killNow kills the process at once (SIGKILL): for a plugin that does
// not answer, a graceful stop would only wait for it.
func (p *pluginProc) killNow() {
	if p.pid > 0 {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
}

// pingPlugin asks the plugin's gRPC health service (go-plugin serves one
// in every plugin) whether it is serving.
func pingPlugin(ctx context.Context, p *pluginProc) error {
	g, ok := p.rpc.(*plugin.GRPCClient)
	if !ok || g.Conn == nil {
		return nil
	}
	_, err := grpc_health_v1.NewHealthClient(g.Conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: plugin.GRPCServiceName})
	return err
}

// removeSocket removes the plugin's go-plugin socket file once the
// process is gone (a plugin killed with -9 cannot remove it itself).
func (p *pluginProc) removeSocket() {
	if p.addr == nil || p.addr.Network() != "unix" {
		return
	}
	if err := os.Remove(p.addr.String()); err != nil && !errors.Is(err, os.ErrNotExist) {
		p.log.Debug().Err(err).Msg("removing the plugin's socket")
	}
}

// procOptions are the process settings of a plugin the host starts.
type procOptions struct {
	// ExtraFiles are inherited as fds 3, 4, ...
	ExtraFiles []*os.File
	// Env is added to the host's environment, replacing variables of
	// the same names.
	Env []string
	// Setsid starts the plugin in a session of its own, out of the
	// host's process group and terminal: it survives the host.
	Setsid bool
	// StartTimeout bounds the handshake (0: pluginStartTimeout).
	StartTimeout time.Duration
	// Metrics, when set, counts the stderr lines the rate limit drops.
	Metrics *metrics.Metrics
	// BinDir is where a checksum-verified plugin's private copy is kept
	// (a 0700 directory); required when the spec has a checksum.
	BinDir string
}

// startPlugin starts spec as a go-plugin subprocess and dispenses kind.
// Its errors say what went wrong and what to do: ErrChecksum for a
// binary whose checksum does not match, ErrHandshake for one that is not
// a tether plugin.
func startPlugin(spec PluginSpec, kind string, opts procOptions, log zerolog.Logger) (*pluginProc, error) {
	path := spec.Path
	if spec.SHA256 != "" {
		verified, err := verifiedCopy(spec, opts.BinDir)
		if err != nil {
			return nil, err
		}
		path = verified
	}
	cmd := exec.Command(path, spec.Args...)
	cmd.Env = pluginEnv(os.Environ(), opts.Env, log)
	cmd.ExtraFiles = opts.ExtraFiles
	if opts.Setsid {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	var dropped prometheus.Counter
	if opts.Metrics != nil {
		dropped = opts.Metrics.PluginLogDropped.WithLabelValues(spec.Name)
	}
	logw := newPluginLogWriter(log, spec.Name, dropped)
	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = pluginStartTimeout
	}
	cfg := &plugin.ClientConfig{
		HandshakeConfig:  contract.Handshake,
		Plugins:          contract.PluginMap(),
		Cmd:              cmd,
		SkipHostEnv:      true, // cmd.Env already holds it, with our overrides
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
		Stderr:           logw,
		StartTimeout:     timeout,
		GRPCDialOptions:  contract.DialOptions(),
	}
	client := plugin.NewClient(cfg)
	rpc, err := client.Client()
	if err != nil {
		client.Kill() // also waits for its stderr, so the tail is complete
		logw.close()
		return nil, startError(spec, kind, err, logw.tail(), timeout)
	}
	p, err := dispense(client, rpc, spec.Name, kind)
	if err != nil {
		client.Kill()
		return nil, err
	}
	if rc := client.ReattachConfig(); rc != nil {
		p.pid, p.addr = rc.Pid, rc.Addr
	}
	p.logw, p.log, p.argv = logw, log.With().Str("plugin", spec.Name).Logger(), slices.Clone(cmd.Args)
	return p, nil
}

// pluginEnv is a plugin's environment: the host's without its TETHER_*
// settings, the log level the host logs at (contract.EnvPluginLogLevel:
// a plugin need not write lines the host would parse only to drop; a
// PTY plugin's debug line per attach cost the host an eighth of its CPU
// in an attach storm), then extra.
func pluginEnv(host, extra []string, log zerolog.Logger) []string {
	level := log.GetLevel()
	if level == zerolog.NoLevel {
		level = zerolog.TraceLevel
	}
	return mergeEnv(contract.WithoutTetherEnv(host), append([]string{contract.EnvPluginLogLevel + "=" + level.String()}, extra...))
}

// openHook, when set (by tests), runs after a checksum-verified plugin's
// file is opened and before it is read: the moment a swap of the path
// would win against a check-then-exec of the path.
var openHook func()

// verifiedCopy makes the bytes that run the bytes that were hashed: it
// opens spec.Path once, hashes what it reads through that descriptor
// while copying it into a private file in binDir (mode 0700, named by the
// checksum), and returns the copy's path only when the sum matches. A
// path swapped for another file after the open runs nothing else: the
// copy holds what was read and checked. A copy made before is used again
// after its bytes are hashed again.
func verifiedCopy(spec PluginSpec, binDir string) (string, error) {
	want, err := hex.DecodeString(spec.SHA256)
	if err != nil || len(want) != sha256.Size {
		return "", fmt.Errorf("plugin %s: checksum %q is not a hex sha256 (64 hex digits after #): %w", spec.Name, spec.SHA256, ErrChecksum)
	}
	if binDir == "" {
		return "", fmt.Errorf("plugin %s: no directory for its verified copy", spec.Name)
	}
	if err := os.MkdirAll(binDir, 0o700); err != nil {
		return "", fmt.Errorf("plugin %s: %w", spec.Name, err)
	}
	dest := filepath.Join(binDir, strings.ToLower(spec.SHA256)+"-"+filepath.Base(spec.Path))
	if sum, err := fileSHA256(dest); err == nil && strings.EqualFold(sum, spec.SHA256) {
		return dest, nil
	}
	src, err := os.Open(spec.Path)
	if err != nil {
		return "", fmt.Errorf("plugin %s (%s): cannot run it: %w", spec.Name, spec.Path, err)
	}
	defer src.Close()
	if openHook != nil {
		openHook()
	}
	tmp, err := os.CreateTemp(binDir, ".copy-*")
	if err != nil {
		return "", fmt.Errorf("plugin %s: %w", spec.Name, err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), src); err != nil {
		tmp.Close()
		return "", fmt.Errorf("plugin %s (%s): reading it: %w", spec.Name, spec.Path, err)
	}
	if err := tmp.Chmod(0o700); err != nil {
		tmp.Close()
		return "", fmt.Errorf("plugin %s: %w", spec.Name, err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("plugin %s: %w", spec.Name, err)
	}
	if have := hex.EncodeToString(h.Sum(nil)); !strings.EqualFold(have, spec.SHA256) {
		return "", fmt.Errorf("plugin %s (%s): checksum mismatch: --plugin asks for sha256 %s, the file has %s; check the path, or put the file's checksum after the # (sha256sum %s): %w",
			spec.Name, spec.Path, spec.SHA256, have, spec.Path, ErrChecksum)
	}
	if err := os.Rename(tmp.Name(), dest); err != nil {
		return "", fmt.Errorf("plugin %s: %w", spec.Name, err)
	}
	return dest, nil
}

// reattachPlugin connects to the plugin process rec describes, left
// running by a previous host. go-plugin never kills a reattached plugin
// on its own; Kill does (a graceful shutdown, then SIGKILL).
func reattachPlugin(rec ReattachRecord, name, kind string) (*pluginProc, error) {
	var addr net.Addr
	var err error
	switch rec.Network {
	case "unix":
		addr, err = net.ResolveUnixAddr("unix", rec.Address)
	default:
		addr, err = net.ResolveTCPAddr("tcp", rec.Address)
	}
	if err != nil {
		return nil, fmt.Errorf("plugin %s: reattach address %q: %w", name, rec.Address, err)
	}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  contract.Handshake,
		Plugins:          contract.PluginMap(),
		Reattach:         &plugin.ReattachConfig{Protocol: plugin.Protocol(rec.Protocol), ProtocolVersion: int(contract.Handshake.ProtocolVersion), Addr: addr, Pid: rec.Pid},
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
		GRPCDialOptions:  contract.DialOptions(),
	})
	rpc, err := client.Client()
	if err != nil {
		// Not Kill: a failed reattach is no reason to stop a process.
		return nil, fmt.Errorf("plugin %s: reattach to pid %d at %s: %w", name, rec.Pid, rec.Address, err)
	}
	p, err := dispense(client, rpc, name, kind)
	if err != nil {
		if g, ok := rpc.(*plugin.GRPCClient); ok {
			_ = g.Conn.Close()
		}
		return nil, err
	}
	p.pid, p.addr = rec.Pid, addr
	return p, nil
}

func dispense(client *plugin.Client, rpc plugin.ClientProtocol, name, kind string) (*pluginProc, error) {
	raw, err := rpc.Dispense(kind)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: dispense %s: %w", name, kind, err)
	}
	p := &pluginProc{client: client, rpc: rpc}
	var ok bool
	switch kind {
	case contract.KindTransport:
		p.tr, ok = raw.(*contract.TransportGRPCClient)
	case contract.KindBackend:
		p.be, ok = raw.(*contract.BackendGRPCClient)
	case contract.KindNotify:
		p.nt, ok = raw.(*contract.NotifyGRPCClient)
	}
	if !ok {
		return nil, fmt.Errorf("plugin %s: dispensed %T, not a %s", name, raw, kind)
	}
	return p, nil
}

// startError turns go-plugin's start error into one that says which check
// failed and what to do.
func startError(spec PluginSpec, kind string, err error, stderrTail []string, timeout time.Duration) error {
	var pathErr *fs.PathError
	var execErr *exec.Error
	switch {
	case errors.As(err, &pathErr), errors.As(err, &execErr):
		return fmt.Errorf("plugin %s (%s): cannot run it: %w", spec.Name, spec.Path, err)
	}
	cause, _, _ := strings.Cut(strings.TrimSpace(err.Error()), "\n") // go-plugin adds pages of hints
	if strings.Contains(cause, "timeout while waiting for plugin to start") {
		return fmt.Errorf("plugin %s (%s): handshake timed out: no go-plugin handshake line within %s (the process was killed); a tether plugin answers at once: check that the binary serves contract.ServeTransport or contract.ServeBackend and is not waiting on something: %w",
			spec.Name, spec.Path, timeout, ErrHandshake)
	}
	var said string
	if len(stderrTail) > 0 {
		said = fmt.Sprintf("; it wrote %q", strings.Join(stderrTail, " / "))
	}
	return fmt.Errorf("plugin %s (%s): handshake failed: it did not answer as a tether plugin (go-plugin, magic cookie %s, protocol version %d, gRPC): %s%s; "+
		"it is not a tether plugin, or one built for another handshake: point --plugin at a binary that serves contract.ServeTransport or contract.ServeBackend (a script that runs `exec tether plugin %s \"$@\"` works too): %w",
		spec.Name, spec.Path, contract.Handshake.MagicCookieKey, contract.Handshake.ProtocolVersion, strings.TrimSpace(cause), said, builtinFor(kind), ErrHandshake)
}

// builtinFor is the built-in plugin of a kind, as `tether plugin NAME`
// runs it.
func builtinFor(kind string) string {
	if kind == contract.KindBackend {
		return "pty"
	}
	return "ws"
}

// fileSHA256 returns the hex sha256 of the file at path, a verified
// copy in the state dir: never read through a symbolic link (a link
// there is an error, and verifiedCopy makes a fresh copy over it).
func fileSHA256(path string) (string, error) {
	f, err := statedir.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// mergeEnv returns base with the variables of extra set (replacing those
// of the same name).
func mergeEnv(base, extra []string) []string {
	names := make(map[string]bool, len(extra))
	for _, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		names[k] = true
	}
	env := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if !names[k] {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}
