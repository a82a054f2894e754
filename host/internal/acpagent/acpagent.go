// Package acpagent runs an Agent Client Protocol agent (Claude Code,
// Codex, Gemini CLI, hermes… over stdio) behind the session table: one
// agent process for every session, supervised (restarted with backoff
// when it exits, its stderr re-emitted with the field agent), spoken to
// with github.com/coder/acp-go-sdk as its client. Each live session gets
// an agent.Turner: session/new (or session/load of the stored agent
// session) when it is built, session/prompt for a turn — whose
// session/update notifications become acp.update events and whose
// permission requests go to the session's viewers — and session/cancel
// when the turn is interrupted.
package acpagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/acp-go-sdk"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/supervise"
	"github.com/tether-agent/tether/internal/umask"
)

// Errors of the ACP agent.
var (
	// ErrAgentDown: the agent process is not running (it exited and is
	// being restarted, or could not be started).
	ErrAgentDown = errors.New("acp agent not running")
	// ErrNoTurn: a Run on an ACP session (its agent only takes Turns).
	ErrNoTurn = errors.New("acp agents take turns, not runs")
)

// Restart backoff of the agent process.
const (
	backoffMin = 100 * time.Millisecond
	backoffMax = 5 * time.Second
	// cancelGrace is how long a cancelled turn waits for the agent's
	// answer to session/cancel.
	cancelGrace = 30 * time.Second
	// startTimeout bounds the agent's initialize.
	startTimeout = 30 * time.Second
)

// Config configures the agent.
type Config struct {
	// Argv is the agent's command line (--agent-command).
	Argv []string
	// Cwd is the working directory of new agent sessions (--agent-cwd;
	// "": the host's).
	Cwd string
	// HealthInterval and HealthTimeout: the agent is pinged this often
	// (an extension request, "_tether/ping": any answer, an error
	// included, is alive), and one that does not answer in time is killed
	// and restarted with reason unresponsive (0 interval: no pings). An
	// agent that answers the ping with an error is not pinged again: its
	// process state is watched instead (see watch).
	HealthInterval, HealthTimeout time.Duration
	// Version is tether's, told to the agent in initialize.
	Version string
	Log     zerolog.Logger
	Metrics *metrics.Metrics

	// watched, when set (tests), is sent at each health check whether
	// the check still pings, when it can take it at once.
	watched chan bool
}

// Factory is the agent.Factory of ACP sessions: it owns the agent process.
type Factory struct {
	cfg  Config
	log  zerolog.Logger
	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex // guards the fields below
	cur      *process   // the running process, or nil
	up       chan struct{}
	sessions map[acp.SessionId]*session
	closed   bool
}

var _ agent.Factory = (*Factory)(nil)

// process is one agent process and the ACP connection to it.
type process struct {
	gen  int
	cmd  *exec.Cmd
	conn *acp.ClientSideConnection
	caps acp.AgentCapabilities
	done chan struct{} // closed once the process has exited
	// unresponsive is set before a health ping's failure kills it.
	unresponsive atomic.Bool
	stdin        io.Closer
	order        *order // the agent's order of updates and permission requests
}

// New returns a Factory; Start starts the agent.
func New(cfg Config) *Factory {
	if cfg.Cwd == "" {
		cfg.Cwd, _ = os.Getwd()
	}
	if cfg.Metrics != nil {
		for _, r := range []string{supervise.ReasonCrashed, supervise.ReasonUnresponsive} {
			cfg.Metrics.PluginRestarts.WithLabelValues("agent", r) // exists from the start, at 0
		}
	}
	return &Factory{
		cfg:      cfg,
		log:      cfg.Log.With().Str("agent", agentName(cfg.Argv)).Logger(),
		stop:     make(chan struct{}),
		up:       make(chan struct{}),
		sessions: make(map[acp.SessionId]*session),
	}
}

// Start starts the agent process and keeps it running. It fails when the
// first start fails (a missing command, an agent that does not answer
// initialize), so that tether serve can say why at once.
func (f *Factory) Start(ctx context.Context) error {
	p, err := f.launch(ctx, 1)
	if err != nil {
		return err
	}
	f.setCurrent(p)
	f.wg.Add(1)
	go f.supervise(p)
	return nil
}

// launch starts the agent process and initializes the connection.
func (f *Factory) launch(ctx context.Context, gen int) (*process, error) {
	cmd := exec.Command(f.cfg.Argv[0], f.cfg.Argv[1:]...)
	cmd.Env = contract.WithoutTetherEnv(os.Environ())
	cmd.Dir = f.cfg.Cwd
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	umask.Wrap(cmd) // the user's umask, not tether's 077
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("acp agent: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("acp agent: %w", err)
	}
	var dropped = f.cfg.Metrics.PluginLogDropped.WithLabelValues("agent")
	logw := supervise.NewLogWriter(f.cfg.Log, "agent", agentName(f.cfg.Argv), dropped)
	cmd.Stderr = logw
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("acp agent %q: cannot run it: %w", f.cfg.Argv[0], err)
	}
	p := &process{gen: gen, cmd: cmd, stdin: stdin, done: make(chan struct{}), order: newOrder(stdout)}
	cl := &client{f: f, p: p}
	p.order.direct = cl.direct
	p.conn = acp.NewClientSideConnection(cl, stdin, p.order)
	// The library's own complaints (a message it could not parse, a
	// connection it closed) are tether's warnings.
	p.conn.SetLogger(slog.New(slog.NewTextHandler(warnWriter{f.log}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	go func() {
		_ = cmd.Wait()
		_ = logw.Close()
		p.order.close()
		close(p.done)
	}()
	ictx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	resp, err := p.conn.Initialize(ictx, acp.InitializeRequest{
		ProtocolVersion:    acp.ProtocolVersionNumber,
		ClientCapabilities: acp.ClientCapabilities{Fs: acp.FileSystemCapabilities{ReadTextFile: false, WriteTextFile: false}, Terminal: false},
		ClientInfo:         &acp.Implementation{Name: "tether", Version: cmpOrString(f.cfg.Version, "dev")},
	})
	if err != nil {
		p.kill()
		return nil, fmt.Errorf("acp agent %q: initialize: %w", f.cfg.Argv[0], err)
	}
	p.caps = resp.AgentCapabilities
	if f.cfg.HealthInterval > 0 {
		f.wg.Add(1)
		go f.watch(p)
	}
	f.log.Info().Int("pid", cmd.Process.Pid).Int("generation", gen).Bool("load_session", p.caps.LoadSession).
		Int("protocol", int(resp.ProtocolVersion)).Msg("acp agent started")
	return p, nil
}

// warnWriter logs each line written to it at warn level.
type warnWriter struct{ log zerolog.Logger }

func (w warnWriter) Write(p []byte) (int, error) {
	w.log.Warn().Str("from", "acp-go-sdk").Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}

// agentName names the agent in logs: its command line, shortened (the
// first word alone is often a launcher: npx, env, sh).
func agentName(argv []string) string {
	name := filepath.Base(argv[0])
	if len(argv) > 1 {
		name += " " + strings.Join(argv[1:], " ")
	}
	if len(name) > 60 {
		name = name[:57] + "..."
	}
	return name
}

func cmpOrString(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// stopGrace is how long an agent has to exit at shutdown, after its
// stdin closed and SIGTERM, before it is killed.
const stopGrace = 3 * time.Second

// stop ends the agent as a shell's job ends: its stdin closed and SIGTERM
// to its process group, so it can save its sessions (the next host loads
// them), then SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	_ = p.stdin.Close()
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	}
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	p.kill()
}

// kill stops the process group and waits for it.
func (p *process) kill() {
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.done
}

// setCurrent makes p the running process, waking those waiting for one.
func (f *Factory) setCurrent(p *process) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cur = p
	close(f.up)
}

// retire takes p out of use, once: the next use waits for a restart.
func (f *Factory) retire(p *process) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cur == p {
		f.cur = nil
		f.up = make(chan struct{})
	}
}

// dead reports whether p exited or closed its side of the connection.
func (p *process) dead() bool {
	select {
	case <-p.done:
		return true
	case <-p.conn.Done():
		return true
	default:
		return false
	}
}

// supervise waits for the process to exit and starts a new one after a
// capped backoff, until Close. Turns in flight fail (their prompt's
// connection ended); each session reattaches on its next turn.
func (f *Factory) supervise(p *process) {
	defer f.wg.Done()
	wait := time.Duration(0)
	for {
		started := time.Now()
		select {
		case <-p.done:
		case <-p.conn.Done():
			p.kill() // its stdio is gone: of no more use
		case <-f.stop:
			p.stop(stopGrace)
			return
		}
		f.retire(p)
		if p.unresponsive.Load() {
			f.cfg.Metrics.PluginRestarts.WithLabelValues("agent", supervise.ReasonUnresponsive).Inc()
			f.log.Warn().Int("generation", p.gen).Msg("acp agent did not answer its health ping in time; killed it, restarting")
		} else {
			f.cfg.Metrics.PluginRestarts.WithLabelValues("agent", supervise.ReasonCrashed).Inc()
			f.log.Warn().Int("generation", p.gen).Msg("acp agent exited; restarting")
		}
		if time.Since(started) > time.Minute {
			wait = 0
		}
		for {
			select {
			case <-f.stop:
				return
			case <-time.After(wait):
			}
			wait = min(max(2*wait, backoffMin), backoffMax)
			next, err := f.launch(context.Background(), p.gen+1)
			if err != nil {
				f.log.Error().Err(err).Msg("restarting the acp agent")
				continue
			}
			p = next
			f.setCurrent(p)
			break
		}
	}
}

// current returns the running process, waiting for a restart within ctx
// and startTimeout.
func (f *Factory) current(ctx context.Context) (*process, error) {
	// A session waits for a restart as long as a start may take, not for
	// ever: an agent that keeps failing fails its sessions' turns.
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		p, up, closed := f.cur, f.up, f.closed
		f.mu.Unlock()
		if closed {
			return nil, fmt.Errorf("acp agent: %w", ErrAgentDown)
		}
		if p != nil && !p.dead() {
			return p, nil
		}
		if p != nil {
			f.retire(p) // supervise restarts it
			continue
		}
		select {
		case <-up:
		case <-f.stop:
		case <-ctx.Done():
			return nil, fmt.Errorf("acp agent: %v: %w", ctx.Err(), ErrAgentDown)
		case <-deadline.C:
			return nil, fmt.Errorf("acp agent: not running again after %v: %w", startTimeout, ErrAgentDown)
		}
	}
}

// Capabilities are the running agent's (for tether's own initialize on
// /acp: its prompt capabilities are the agent's).
func (f *Factory) Capabilities() acp.AgentCapabilities {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cur == nil {
		return acp.AgentCapabilities{}
	}
	return f.cur.caps
}

// PromptCapabilities are the running agent's prompt capabilities (what a
// prompt may hold besides text and resource links).
func (f *Factory) PromptCapabilities() acp.PromptCapabilities {
	return f.Capabilities().PromptCapabilities
}

// Close stops the agent process.
func (f *Factory) Close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	f.mu.Unlock()
	close(f.stop)
	f.wg.Wait()
}
