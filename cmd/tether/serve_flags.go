package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host"
	"github.com/tether-agent/tether/host/agent"
)

// serveFlags are tether serve's flags as parsed, then (validate) what
// they make: the logger, the agents, the plugins and the cluster.
type serveFlags struct {
	listen, token, stateDir, tokenFile string
	orphanGrace, sessionTTL            time.Duration
	maxLive                            int
	journalPer, journalTotal           int
	journalBytes                       sizeFlag
	allowOrigins, allowHosts           strList
	plugins, listens                   strList
	agentKind, agentCommand, agentCwd  string
	echoDelay                          time.Duration
	adminListen, logLevel, logFormat   string
	publicURL                          string
	pprof                              bool
	ptyCommand                         string
	ptyTTL, ptyIdleExit                time.Duration
	ptyMax, ptyScroll                  int
	ptyBuffer                          sizeFlag
	ptyMaxSize                         ptySize
	pingInterval, peerTimeout          time.Duration
	stopPTYs                           bool
	restartLimit                       int
	startTimeout                       time.Duration
	healthEvery, healthWait            time.Duration
	tlsCert, tlsKey                    string
	maxConns                           int
	dataPlane                          bool
	cluster                            *clusterFlags
	proxy                              *proxyFlags
	notify                             *notifyFlags

	// Set by validate.
	log           zerolog.Logger
	agents        agent.Factory
	acpArgv       []string
	ptyArgv       []string
	transport     host.PluginSpec
	backend       host.PluginSpec
	extra         []host.TransportSpec
	clusterConfig *host.ClusterConfig
	authProxy     *host.AuthProxy
}

// newServeFlags defines tether serve's flags on fs.
func newServeFlags(fs *flag.FlagSet) *serveFlags {
	f := &serveFlags{
		journalBytes: sizeFlag{n: 64 << 20, most: 1 << 40},
		ptyBuffer:    sizeFlag{n: 1 << 20},
		ptyMaxSize:   ptySize{cols: 1000, rows: 1000},
	}
	fs.StringVar(&f.listen, "listen", "127.0.0.1:7717", "address of the public listener")
	fs.StringVar(&f.token, "token", "", "access token clients must present (default: the one in --token-file, made there at random the first time; prefer TETHER_TOKEN or the file: a flag's value shows in ps)")
	fs.StringVar(&f.stateDir, "state-dir", defaultStateDir(), "directory for state.db, the token file, plugin records and sockets (created with mode 0700; refused when it, or anything in it, belongs to another user, is writable by group or others, or is a symbolic link)")
	fs.DurationVar(&f.orphanGrace, "orphan-grace", 20*time.Second, "how long a session with no viewer is kept parked before it is reaped (0 = forever)")
	fs.DurationVar(&f.sessionTTL, "session-ttl", 6*time.Hour, "a parked, idle live session older than this is persisted and released (0 = never)")
	fs.IntVar(&f.maxLive, "max-live-sessions", 0, "live sessions at most; only parked idle ones are evicted, oldest first (0 = no cap)")
	fs.IntVar(&f.journalPer, "journal-per-session", 10000, "events kept per session in the journal (older ones are pruned)")
	fs.IntVar(&f.journalTotal, "journal-total", 1000000, "events kept in the journal in all (the oldest are pruned)")
	fs.StringVar(&f.agentKind, "agent", "echo", "agent: echo, exec or acp")
	fs.StringVar(&f.agentCommand, "agent-command", "", "for --agent exec: command run per prompt (prompt on stdin, stdout streamed); for --agent acp: the ACP agent, started once and spoken to on stdio")
	fs.StringVar(&f.agentCwd, "agent-cwd", "", "for --agent acp: the agent's working directory, and that of sessions made without one (default: the current directory)")
	fs.DurationVar(&f.echoDelay, "echo-delay", 0, "for --agent echo: pause before each streamed word")
	fs.StringVar(&f.publicURL, "public-url", "", "the host's URL as its users reach it, e.g. https://tether.example.com behind a reverse proxy: the base of the URLs tether token create and tether share print (default: the listener's)")
	fs.StringVar(&f.adminListen, "admin-listen", "", "address of the admin listener: Prometheus /metrics and /healthz, and /debug/pprof with --pprof, all behind the access token (off when empty)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: trace, debug, info, warn, error")
	fs.StringVar(&f.logFormat, "log-format", "", "log format: json or console (default: console on a terminal)")
	fs.StringVar(&f.ptyCommand, "pty-command", defaultShell(), "command line run in each new PTY, split like a POSIX shell (quotes respected, no expansion); empty switches /api/pty off")
	fs.DurationVar(&f.ptyTTL, "pty-ttl", 30*time.Minute, "how long a detached PTY lives")
	fs.IntVar(&f.ptyMax, "pty-max-sessions", 16, "live PTYs at most")
	fs.DurationVar(&f.ptyIdleExit, "pty-idle-exit", 50*time.Second, "a PTY plugin left running with no host and no PTY exits after this long")
	fs.IntVar(&f.ptyScroll, "pty-scrollback", 1000, "lines of scrollback kept in a PTY's screen model and sent in a screen snapshot (0: none)")
	fs.DurationVar(&f.pingInterval, "ping-interval", 20*time.Second, "how often the transport pings idle clients")
	fs.DurationVar(&f.peerTimeout, "peer-timeout", 60*time.Second, "a client silent for this long is closed as dead")
	fs.BoolVar(&f.stopPTYs, "stop-ptys", false, "on shutdown also stop the PTY plugin (and its PTYs) instead of leaving it for the next host")
	fs.IntVar(&f.restartLimit, "plugin-restart-limit", 5, "a transport plugin that fails this many times in a row (crashes within a minute of starting, or fails to start) is marked failed and not restarted until reloaded (0 = restart forever)")
	fs.DurationVar(&f.startTimeout, "plugin-start-timeout", 15*time.Second, "how long a plugin may take to answer the go-plugin handshake")
	fs.DurationVar(&f.healthEvery, "plugin-health-interval", 5*time.Second, "the host pings every plugin this often (0 = never)")
	fs.DurationVar(&f.healthWait, "plugin-health-timeout", 3*time.Second, "a plugin that does not answer its health ping in this long is killed and restarted (unresponsive)")
	fs.StringVar(&f.tokenFile, "token-file", "", "where the access token is kept (mode 0600): read when --token/TETHER_TOKEN is not given, created with a random token when missing; in the state dir never through a symbolic link, elsewhere read through one but never created or chmodded through it (default <state-dir>/token)")
	fs.BoolVar(&f.pprof, "pprof", false, "also serve /debug/pprof on --admin-listen (it shows the process's command line and memory: token-protected, but enable it only when you need it)")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "PEM certificate: serve HTTPS/WSS on --listen (with --tls-key)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "PEM private key for --tls-cert")
	fs.IntVar(&f.maxConns, "max-connections", 20000, "open connections per transport at most (every accepted TCP connection counts); past it a new one gets HTTP 503")
	fs.BoolVar(&f.dataPlane, "plugin-data-plane", true, "offer each transport plugin a framed Unix-socket data plane for its connections' frames (a plugin that does not speak it stays on gRPC); false: every frame over gRPC")
	f.cluster = addClusterFlags(fs)
	f.proxy = addProxyFlags(fs)
	f.notify = addNotifyFlags(fs)
	fs.Var(&f.ptyBuffer, "pty-buffer", "replay ring size per PTY: bytes, or with a KiB/MiB/GiB suffix (up to 1GiB)")
	fs.Var(&f.ptyMaxSize, "pty-max-size", "largest PTY size a resize may ask for, `COLSxROWS`, each 1-10000; a larger resize is dropped")
	fs.Var(&f.journalBytes, "journal-bytes-per-session", "bytes of events kept per session in the journal (older ones are pruned; the newest is always kept): a `size` in bytes, or with a KiB/MiB/GiB suffix")
	fs.Var(&f.allowOrigins, "allow-origin", "an extra accepted Origin (repeatable)")
	fs.Var(&f.allowHosts, "allow-host", "an extra accepted Host name: NAME (any port or none, as behind a reverse proxy) or NAME:PORT (repeatable)")
	fs.Var(&f.plugins, "plugin", "KIND=PATH[#sha256]: run an external plugin binary instead of the built-in one; transport:NAME=PATH[#sha256] adds a transport named NAME, notify:NAME=PATH[#sha256] a notifier (repeatable)")
	fs.Var(&f.listens, "transport-listen", "NAME=ADDR: the address an added transport serves (default unix:<state-dir>/NAME.sock; a TCP host:port is bound by the host) (repeatable)")
	return f
}

// validate refuses a bad flag, in the order tether serve always checked
// them (the first mistake is the one reported), and makes what the
// flags describe. self is this binary, the built-in plugins' executable.
// Nothing is written: a refused start leaves a fresh state dir as it was.
func (f *serveFlags) validate(self string) (err error) {
	if f.log, err = newLogger(f.logLevel, f.logFormat); err != nil {
		return err
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if u, err := url.Parse(f.publicURL); f.publicURL != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "") {
		return fmt.Errorf("--public-url %q: want http(s)://HOST[:PORT][/PATH], no userinfo, query or fragment", f.publicURL)
	}
	if f.agents, f.acpArgv, err = agentFactory(f.agentKind, f.agentCommand, f.echoDelay); err != nil {
		return err
	}
	if f.agentCwd != "" {
		if fi, err := os.Stat(f.agentCwd); err != nil || !fi.IsDir() || !filepath.IsAbs(f.agentCwd) {
			return fmt.Errorf("--agent-cwd %q: want an absolute path to a directory", f.agentCwd)
		}
	}
	if f.ptyArgv, err = agent.ParseCommandLine(f.ptyCommand); err != nil {
		return fmt.Errorf("--pty-command %q: %w", f.ptyCommand, err)
	}
	switch {
	case f.maxConns < 1:
		return errors.New("--max-connections must be at least 1")
	case f.ptyScroll < 0 || f.ptyScroll > 1<<20:
		return errors.New("--pty-scrollback must be 0-1048576")
	case f.ptyMax < 1:
		return errors.New("--pty-max-sessions must be at least 1")
	}
	if err := f.pluginSpecs(self); err != nil {
		return err
	}
	if f.clusterConfig, err = f.cluster.config(); err != nil {
		return err
	}
	if f.authProxy, err = f.proxy.config(); err != nil {
		return err
	}
	if f.restartLimit < 0 {
		return errors.New("--plugin-restart-limit must be at least 0")
	}
	if err := f.notify.validate(); err != nil {
		return err
	}
	if f.tokenFile == "" {
		f.tokenFile = filepath.Join(f.stateDir, "token")
	}
	return nil
}

// pluginSpecs makes the plugins: the built-in ones (self), those --plugin
// puts in their place, the transports it adds, and their addresses
// (--transport-listen).
func (f *serveFlags) pluginSpecs(self string) error {
	f.transport = host.PluginSpec{Name: "ws", Path: self, Args: []string{"plugin", "ws"}}
	f.backend = host.PluginSpec{Name: "pty", Path: self, Args: []string{"plugin", "pty"}}
	if len(f.ptyArgv) == 0 {
		f.backend = host.PluginSpec{} // an empty --pty-command switches /api/pty off (4404)
	}
	for _, p := range f.plugins {
		kind, spec, err := parsePluginFlag(p)
		if err != nil {
			return err
		}
		if name, ok := strings.CutPrefix(kind, contract.KindNotify+":"); ok {
			if err := f.notify.addPlugin(p, name, spec); err != nil {
				return err
			}
			continue
		}
		if name, ok := strings.CutPrefix(kind, contract.KindTransport+":"); ok {
			if err := host.CheckTransportName(name); err != nil {
				return fmt.Errorf("--plugin %s: %w", p, err)
			}
			if slices.ContainsFunc(f.extra, func(t host.TransportSpec) bool { return t.Name == name }) {
				return fmt.Errorf("--plugin %s: transport %s given twice", p, name)
			}
			spec.Name = name
			f.extra = append(f.extra, host.TransportSpec{PluginSpec: spec})
			continue
		}
		switch kind {
		case contract.KindTransport:
			spec.Name = "ws"
			f.transport = spec
		case contract.KindBackend:
			spec.Name = "pty"
			f.backend = spec
		default:
			return fmt.Errorf("--plugin %s: kind %q is not supported (supported: transport, transport:NAME, backend, notify:NAME)", p, kind)
		}
	}
	for _, l := range f.listens {
		name, addr, ok := strings.Cut(l, "=")
		i := slices.IndexFunc(f.extra, func(t host.TransportSpec) bool { return t.Name == name })
		switch {
		case !ok || addr == "":
			return fmt.Errorf("--transport-listen %q: want NAME=ADDR", l)
		case i < 0:
			return fmt.Errorf("--transport-listen %q: no transport %q added with --plugin transport:%s=PATH", l, name, name)
		}
		f.extra[i].Listen = addr
	}
	return nil
}

// hostConfig is the host's configuration the validated flags describe;
// the caller adds the token when --token is not given, Reload and Stdout.
func (f *serveFlags) hostConfig() host.Config {
	return host.Config{
		Listen:      f.listen,
		Token:       f.token,
		StateDir:    f.stateDir,
		TokenFile:   f.tokenFile,
		OrphanGrace: f.orphanGrace,
		SessionTTL:  f.sessionTTL,

		MaxLiveSessions:   f.maxLive,
		JournalPerSession: f.journalPer,
		JournalTotal:      f.journalTotal,
		JournalBytes:      f.journalBytes.n,
		Pprof:             f.pprof,
		TransportSettings: host.TransportSettings{
			MaxConnections: f.maxConns,
			TLSCert:        f.tlsCert,
			TLSKey:         f.tlsKey,
			PingInterval:   f.pingInterval,
			PeerTimeout:    f.peerTimeout,
			AllowOrigins:   f.allowOrigins,
			AllowHosts:     f.allowHosts,
			AuthProxy:      f.authProxy,
			GRPCLinkOnly:   !f.dataPlane,
		},
		Agents:       f.agents,
		ACPAgent:     f.acpArgv,
		AgentCwd:     f.agentCwd,
		Transport:    f.transport,
		Transports:   f.extra,
		RestartLimit: f.restartLimit,
		Cluster:      f.clusterConfig,

		PluginStartTimeout: f.startTimeout,
		HealthInterval:     f.healthEvery,
		HealthTimeout:      f.healthWait,
		PTY: host.PTYConfig{Spec: f.backend, BackendConfig: contract.BackendConfig{
			Argv:        f.ptyArgv,
			TTL:         f.ptyTTL,
			MaxSessions: f.ptyMax,
			Buffer:      f.ptyBuffer.n,
			Scrollback:  scrollback(f.ptyScroll),
			IdleExit:    f.ptyIdleExit,
			MaxCols:     f.ptyMaxSize.cols,
			MaxRows:     f.ptyMaxSize.rows,
		}},
		StopPTYs:    f.stopPTYs,
		AdminListen: f.adminListen,
		PublicURL:   strings.TrimRight(f.publicURL, "/"),
		Version:     version,
		Log:         f.log,

		NotifyWebhooks: f.notify.webhooks,
		NotifySecret:   f.notify.secret,
		Notifiers:      f.notify.plugins,

		NotifyPush:         f.notify.push,
		NotifyPushSubject:  f.notify.pushSubject,
		NotifyPushInsecure: f.notify.pushInsecure,
	}
}
