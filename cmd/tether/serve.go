package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/term"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/internal/umask"
)

func serve(args []string) int {
	// Every file the host, its plugins and its libraries make is private
	// from birth (0600, directories 0700); the processes that run the
	// user's code get back the user's umask (internal/umask).
	umask.Restrict()
	fs := flag.NewFlagSet("tether serve", flag.ContinueOnError)
	var (
		listen       = fs.String("listen", "127.0.0.1:7717", "address of the public listener")
		token        = fs.String("token", "", "access token clients must present (default: the one in --token-file, made there at random the first time; prefer TETHER_TOKEN or the file: a flag's value shows in ps)")
		stateDir     = fs.String("state-dir", defaultStateDir(), "directory for state.db, the token file, plugin records and sockets (created with mode 0700; refused when it, or anything in it, belongs to another user, is writable by group or others, or is a symbolic link)")
		orphanGrace  = fs.Duration("orphan-grace", 20*time.Second, "how long a session with no viewer is kept parked before it is reaped (0 = forever)")
		sessionTTL   = fs.Duration("session-ttl", 6*time.Hour, "a parked, idle live session older than this is persisted and released (0 = never)")
		maxLive      = fs.Int("max-live-sessions", 0, "live sessions at most; only parked idle ones are evicted, oldest first (0 = no cap)")
		journalPer   = fs.Int("journal-per-session", 10000, "events kept per session in the journal (older ones are pruned)")
		journalTotal = fs.Int("journal-total", 1000000, "events kept in the journal in all (the oldest are pruned)")
		journalBytes = sizeFlag{n: 64 << 20, most: 1 << 40}
		allowOrigins strList
		plugins      strList
		agentKind    = fs.String("agent", "echo", "agent: echo, exec or acp")
		agentCommand = fs.String("agent-command", "", "for --agent exec: command run per prompt (prompt on stdin, stdout streamed); for --agent acp: the ACP agent, started once and spoken to on stdio")
		agentCwd     = fs.String("agent-cwd", "", "for --agent acp: the agent's working directory, and that of sessions made without one (default: the current directory)")
		echoDelay    = fs.Duration("echo-delay", 0, "for --agent echo: pause before each streamed word")
		publicURL    = fs.String("public-url", "", "the host's URL as its users reach it, e.g. https://tether.example.com behind a reverse proxy: the base of the URLs tether token create and tether share print (default: the listener's)")
		adminListen  = fs.String("admin-listen", "", "address of the admin listener: Prometheus /metrics and /healthz, and /debug/pprof with --pprof, all behind the access token (off when empty)")
		logLevel     = fs.String("log-level", "info", "log level: trace, debug, info, warn, error")
		logFormat    = fs.String("log-format", "", "log format: json or console (default: console on a terminal)")
		ptyCommand   = fs.String("pty-command", defaultShell(), "command line run in each new PTY, split like a POSIX shell (quotes respected, no expansion); empty switches /api/pty off")
		ptyTTL       = fs.Duration("pty-ttl", 30*time.Minute, "how long a detached PTY lives")
		ptyMax       = fs.Int("pty-max-sessions", 16, "live PTYs at most")
		ptyBuffer    = sizeFlag{n: 1 << 20}
		ptyMaxSize   = ptySize{cols: 1000, rows: 1000}
		ptyIdleExit  = fs.Duration("pty-idle-exit", 50*time.Second, "a PTY plugin left running with no host and no PTY exits after this long")
		ptyScroll    = fs.Int("pty-scrollback", 1000, "lines of scrollback kept in a PTY's screen model and sent in a screen snapshot (0: none)")
		pingInterval = fs.Duration("ping-interval", 20*time.Second, "how often the transport pings idle clients")
		peerTimeout  = fs.Duration("peer-timeout", 60*time.Second, "a client silent for this long is closed as dead")
		stopPTYs     = fs.Bool("stop-ptys", false, "on shutdown also stop the PTY plugin (and its PTYs) instead of leaving it for the next host")
		restartLimit = fs.Int("plugin-restart-limit", 5, "a transport plugin that fails this many times in a row (crashes within a minute of starting, or fails to start) is marked failed and not restarted until reloaded (0 = restart forever)")
		startTimeout = fs.Duration("plugin-start-timeout", 15*time.Second, "how long a plugin may take to answer the go-plugin handshake")
		healthEvery  = fs.Duration("plugin-health-interval", 5*time.Second, "the host pings every plugin this often (0 = never)")
		healthWait   = fs.Duration("plugin-health-timeout", 3*time.Second, "a plugin that does not answer its health ping in this long is killed and restarted (unresponsive)")
		listens      strList
		allowHosts   strList
		tokenFile    = fs.String("token-file", "", "where the access token is kept (mode 0600): read when --token/TETHER_TOKEN is not given, created with a random token when missing; in the state dir never through a symbolic link, elsewhere read through one but never created or chmodded through it (default <state-dir>/token)")
		pprofOn      = fs.Bool("pprof", false, "also serve /debug/pprof on --admin-listen (it shows the process's command line and memory: token-protected, but enable it only when you need it)")
		tlsCert      = fs.String("tls-cert", "", "PEM certificate: serve HTTPS/WSS on --listen (with --tls-key)")
		tlsKey       = fs.String("tls-key", "", "PEM private key for --tls-cert")
		maxConns     = fs.Int("max-connections", 20000, "open connections per transport at most (every accepted TCP connection counts); past it a new one gets HTTP 503")
	)
	cluster := addClusterFlags(fs)
	fs.Var(&ptyBuffer, "pty-buffer", "replay ring size per PTY: bytes, or with a KiB/MiB/GiB suffix (up to 1GiB)")
	fs.Var(&ptyMaxSize, "pty-max-size", "largest PTY size a resize may ask for, `COLSxROWS`, each 1-10000; a larger resize is dropped")
	fs.Var(&journalBytes, "journal-bytes-per-session", "bytes of events kept per session in the journal (older ones are pruned; the newest is always kept): a `size` in bytes, or with a KiB/MiB/GiB suffix")
	fs.Var(&allowOrigins, "allow-origin", "an extra accepted Origin (repeatable)")
	fs.Var(&allowHosts, "allow-host", "an extra accepted Host name: NAME (any port or none, as behind a reverse proxy) or NAME:PORT (repeatable)")
	fs.Var(&plugins, "plugin", "KIND=PATH[#sha256]: run an external plugin binary instead of the built-in one; transport:NAME=PATH[#sha256] adds a transport named NAME (repeatable)")
	fs.Var(&listens, "transport-listen", "NAME=ADDR: the address an added transport serves (default unix:<state-dir>/NAME.sock; a TCP host:port is bound by the host) (repeatable)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: tether serve [flags]

Runs the host: the session table, the gateway and its plugins. Its first
line on stdout is "tether listening on URL/?token=TOKEN". Every flag can
also be set as TETHER_<NAME>, e.g. TETHER_LISTEN.

flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "tether serve:", err)
		return 2
	}
	log, err := newLogger(*logLevel, *logFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether serve:", err)
		return 2
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		fmt.Fprintln(os.Stderr, "tether serve: --tls-cert and --tls-key go together")
		return 2
	}
	agents, acpArgv, err := agentFactory(*agentKind, *agentCommand, *echoDelay)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether serve:", err)
		return 2
	}
	if *agentCwd != "" {
		if fi, err := os.Stat(*agentCwd); err != nil || !fi.IsDir() || !filepath.IsAbs(*agentCwd) {
			fmt.Fprintf(os.Stderr, "tether serve: --agent-cwd %q: want an absolute path to a directory\n", *agentCwd)
			return 2
		}
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether serve: finding own binary:", err)
		return 1
	}
	ptyArgv, err := agent.ParseCommandLine(*ptyCommand)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tether serve: --pty-command %q: %v\n", *ptyCommand, err)
		return 2
	}
	if u, err := url.Parse(*publicURL); *publicURL != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "") {
		fmt.Fprintf(os.Stderr, "tether serve: --public-url %q: want http(s)://HOST[:PORT][/PATH], no userinfo, query or fragment\n", *publicURL)
		return 2
	}
	if *maxConns < 1 {
		fmt.Fprintln(os.Stderr, "tether serve: --max-connections must be at least 1")
		return 2
	}
	if *ptyScroll < 0 || *ptyScroll > 1<<20 {
		fmt.Fprintln(os.Stderr, "tether serve: --pty-scrollback must be 0-1048576")
		return 2
	}
	if *ptyMax < 1 {
		fmt.Fprintln(os.Stderr, "tether serve: --pty-max-sessions must be at least 1")
		return 2
	}
	transport := host.PluginSpec{Name: "ws", Path: self, Args: []string{"plugin", "ws"}}
	backend := host.PluginSpec{Name: "pty", Path: self, Args: []string{"plugin", "pty"}}
	if len(ptyArgv) == 0 {
		backend = host.PluginSpec{} // an empty --pty-command switches /api/pty off (4404)
	}
	var extra []host.TransportSpec
	for _, p := range plugins {
		kind, spec, err := parsePluginFlag(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tether serve:", err)
			return 2
		}
		if name, ok := strings.CutPrefix(kind, contract.KindTransport+":"); ok {
			if err := host.CheckTransportName(name); err != nil {
				fmt.Fprintf(os.Stderr, "tether serve: --plugin %s: %v\n", p, err)
				return 2
			}
			for _, t := range extra {
				if t.Name == name {
					fmt.Fprintf(os.Stderr, "tether serve: --plugin %s: transport %s given twice\n", p, name)
					return 2
				}
			}
			spec.Name = name
			extra = append(extra, host.TransportSpec{PluginSpec: spec})
			continue
		}
		switch kind {
		case contract.KindTransport:
			spec.Name = "ws"
			transport = spec
		case contract.KindBackend:
			spec.Name = "pty"
			backend = spec
		default:
			fmt.Fprintf(os.Stderr, "tether serve: --plugin %s: kind %q is not supported (supported: transport, transport:NAME, backend)\n", p, kind)
			return 2
		}
	}
	for _, l := range listens {
		name, addr, ok := strings.Cut(l, "=")
		i := slices.IndexFunc(extra, func(t host.TransportSpec) bool { return t.Name == name })
		switch {
		case !ok || addr == "":
			fmt.Fprintf(os.Stderr, "tether serve: --transport-listen %q: want NAME=ADDR\n", l)
			return 2
		case i < 0:
			fmt.Fprintf(os.Stderr, "tether serve: --transport-listen %q: no transport %q added with --plugin transport:%s=PATH\n", l, name, name)
			return 2
		}
		extra[i].Listen = addr
	}
	clusterCfg, err := cluster.config()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether serve:", err)
		return 2
	}
	if *restartLimit < 0 {
		fmt.Fprintln(os.Stderr, "tether serve: --plugin-restart-limit must be at least 0")
		return 2
	}
	// The token file is made once every flag is known good: a start
	// refused for a bad flag leaves a fresh state dir as it was.
	if *tokenFile == "" {
		*tokenFile = filepath.Join(*stateDir, "token")
	}
	// Nothing in the state dir is read before it is judged: a state dir
	// (or a file in it) of another user, or one others can write, or a
	// link anywhere in it, is refused before its token file could be
	// printed.
	if err := host.PrepareStateDir(*stateDir, log); err != nil {
		fmt.Fprintln(os.Stderr, "tether serve:", err)
		return 1
	}
	tokenCreated := false
	if *token == "" {
		t, created, err := loadOrCreateToken(*stateDir, *tokenFile, log)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tether serve:", err)
			return 1
		}
		*token, tokenCreated = t, created
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// SIGHUP swaps every transport plugin for a fresh process.
	reload := make(chan struct{}, 1)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				select {
				case reload <- struct{}{}:
				default: // one is pending already
				}
			}
		}
	}()
	served := make(chan struct{})
	defer close(served)
	go stopWatchdog(ctx, served, stopDeadline, func() {
		log.Error().Str("after", stopDeadline.String()).Msg("the stop did not finish in time; exiting now (the lines above say what was not persisted)")
		os.Exit(0)
	})
	err = host.Run(ctx, host.Config{
		Listen:      *listen,
		Token:       *token,
		StateDir:    *stateDir,
		OrphanGrace: *orphanGrace,
		SessionTTL:  *sessionTTL,

		MaxLiveSessions:   *maxLive,
		JournalPerSession: *journalPer,
		JournalTotal:      *journalTotal,
		JournalBytes:      journalBytes.n,
		AllowOrigins:      allowOrigins,
		AllowHosts:        allowHosts,
		TokenFile:         *tokenFile,
		TokenCreated:      tokenCreated,
		Pprof:             *pprofOn,
		TLSCert:           *tlsCert,
		TLSKey:            *tlsKey,
		MaxConnections:    *maxConns,
		Agents:            agents,
		ACPAgent:          acpArgv,
		AgentCwd:          *agentCwd,
		Transport:         transport,
		Transports:        extra,
		RestartLimit:      *restartLimit,
		Cluster:           clusterCfg,

		PluginStartTimeout: *startTimeout,
		HealthInterval:     *healthEvery,
		HealthTimeout:      *healthWait,
		PTY: host.PTYConfig{Spec: backend, BackendConfig: contract.BackendConfig{
			Argv:        ptyArgv,
			TTL:         *ptyTTL,
			MaxSessions: *ptyMax,
			Buffer:      ptyBuffer.n,
			Scrollback:  scrollback(*ptyScroll),
			IdleExit:    *ptyIdleExit,
			MaxCols:     ptyMaxSize.cols,
			MaxRows:     ptyMaxSize.rows,
		}},
		StopPTYs:     *stopPTYs,
		Reload:       reload,
		AdminListen:  *adminListen,
		PublicURL:    strings.TrimRight(*publicURL, "/"),
		PingInterval: *pingInterval,
		PeerTimeout:  *peerTimeout,
		Version:      version,
		Stdout:       os.Stdout,
		Log:          log,
	})
	if errors.Is(err, host.ErrPrimaryFailed) {
		return exitPrimaryFailed
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// SIGINT or SIGTERM while starting: a clean stop.
		log.Info().Err(err).Msg("stopped before serving")
		return 0
	}
	if err != nil {
		log.Error().Err(err).Msg("tether serve failed")
		return 1
	}
	return 0
}

// stopDeadline bounds a stop (SIGINT, SIGTERM): the host persists and
// hands back within about 4 s, but when a step cannot finish — a cluster
// that lost its quorum takes no write, and each step then waits out its
// own timeout — the process exits anyway this long after the signal,
// before systemd's TimeoutStopSec (10 s) would kill it.
const stopDeadline = 8 * time.Second

// stopWatchdog calls exit when ctx ends (the stop signal) and served is
// not closed within d.
func stopWatchdog(ctx context.Context, served <-chan struct{}, d time.Duration, exit func()) {
	select {
	case <-ctx.Done():
	case <-served:
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		exit()
	case <-served:
	}
}

// exitPrimaryFailed is tether serve's exit status when the primary
// transport failed its restart limit: a service manager restarts the host.
const exitPrimaryFailed = 3

// defaultStateDir is $XDG_STATE_HOME/tether, else ~/.local/state/tether.
func defaultStateDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "tether")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "tether-state")
	}
	return filepath.Join(home, ".local", "state", "tether")
}

// randomToken returns 128 random bits as hex.
func randomToken() string { return contract.RandomHex(16) }

// loadOrCreateToken reads the access token from path, or creates path
// (mode 0600) with a random token when it is missing, so that the token
// — and every page, bookmark and client that holds it — survives
// restarts. It reads by readTokenFile's rules (in the state dir: never
// through a link, only a file of ours closed to others; elsewhere,
// through a link when it is one) and makes a file others can read 0600,
// saying so. It never creates a file through a link: the token appears
// whole at path by link(2) from a private temporary file, which fails on
// anything already there, a link included, dangling or not. The file is
// then read again, once (another host may have made it first), so a
// dangling link is refused with its reason and never spun on.
func loadOrCreateToken(stateDir, path string, log zerolog.Logger) (token string, created bool, err error) {
	for range 2 {
		t, _, err := readTokenFile(stateDir, path, true, log)
		if !errors.Is(err, os.ErrNotExist) {
			return t, false, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return "", false, fmt.Errorf("token file: %w", err)
		}
		t = randomToken()
		err = createWhole(path, []byte(t+"\n"))
		if errors.Is(err, os.ErrExist) {
			continue // made meanwhile, or a link is in the way: read it again
		}
		if err != nil {
			return "", false, fmt.Errorf("token file: %w", err)
		}
		return t, true, nil
	}
	return "", false, fmt.Errorf("token file %s: something else keeps making and removing it; check who writes there", path)
}

// createWhole makes the file path (mode 0600) holding data, or fails
// with an error wrapping os.ErrExist when anything is at path already,
// a symbolic link included: a reader never sees it empty or half
// written. Where the file system has no hard links it falls back to an
// exclusive create (O_EXCL, which refuses a link as well).
func createWhole(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".new-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	err = os.Link(tmp.Name(), path)
	if err == nil || errors.Is(err, os.ErrExist) {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// agentFactory builds the --agent: an echo or exec factory, or, for acp,
// the agent's command line (the host runs it).
func agentFactory(kind, command string, delay time.Duration) (agent.Factory, []string, error) {
	switch kind {
	case "echo":
		return agent.NewEchoFactory(delay), nil, nil
	case "exec", "acp":
		argv, err := agent.ParseCommandLine(command)
		if err != nil {
			return nil, nil, fmt.Errorf("--agent-command: %w", err)
		}
		if len(argv) == 0 {
			return nil, nil, fmt.Errorf("--agent %s needs --agent-command", kind)
		}
		if kind == "acp" {
			return nil, argv, nil
		}
		f, err := agent.NewExecFactory(argv)
		return f, nil, err
	}
	return nil, nil, fmt.Errorf("--agent %q: want echo, exec or acp", kind)
}

// parsePluginFlag parses KIND=PATH[#sha256] (KIND may be transport:NAME).
func parsePluginFlag(s string) (string, host.PluginSpec, error) {
	kind, rest, ok := strings.Cut(s, "=")
	if !ok || kind == "" || rest == "" {
		return "", host.PluginSpec{}, fmt.Errorf("--plugin %q: want KIND=PATH[#sha256]", s)
	}
	spec, err := pluginFile(rest)
	if err != nil {
		return "", host.PluginSpec{}, fmt.Errorf("--plugin %q: %w", s, err)
	}
	return kind, spec, nil
}

// pluginFile parses PATH[#sha256]: the path made absolute (so the host
// runs the same file whatever its working directory) and checked to
// exist, the checksum lower-cased.
func pluginFile(s string) (host.PluginSpec, error) {
	path, sum, _ := strings.Cut(s, "#")
	abs, err := filepath.Abs(path)
	if err == nil {
		_, err = os.Stat(abs)
	}
	if err != nil {
		return host.PluginSpec{}, err
	}
	return host.PluginSpec{Path: abs, SHA256: strings.ToLower(sum)}, nil
}

// newLogger builds the root logger on stderr.
func newLogger(level, format string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		return zerolog.Nop(), fmt.Errorf("--log-level %q: %w", level, err)
	}
	switch format {
	case "":
		if term.IsTerminal(int(os.Stderr.Fd())) {
			format = "console"
		} else {
			format = "json"
		}
	case "json", "console":
	default:
		return zerolog.Nop(), fmt.Errorf("--log-format %q: want json or console", format)
	}
	var log zerolog.Logger
	if format == "console" {
		log = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly})
	} else {
		log = zerolog.New(os.Stderr)
	}
	return log.Level(lvl).With().Timestamp().Logger(), nil
}

// defaultShell is $SHELL, else /bin/sh.
func defaultShell() string {
	if sh := os.Getenv("SHELL"); sh != "" {
		return sh
	}
	return "/bin/sh"
}

// sizeFlag is a byte size: a number of bytes, or with a KiB, MiB or GiB
// suffix, from 1 KiB up to most (0: 1 GiB).
type sizeFlag struct{ n, most int64 }

func (f *sizeFlag) String() string {
	switch {
	case f.n > 0 && f.n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", f.n>>30)
	case f.n > 0 && f.n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", f.n>>20)
	case f.n > 0 && f.n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", f.n>>10)
	}
	return fmt.Sprint(f.n)
}

// Set implements flag.Value.
func (f *sizeFlag) Set(s string) error {
	n, err := parseSize(s, cmp.Or(f.most, 1<<30))
	if err != nil {
		return err
	}
	f.n = n
	return nil
}

// parseSize parses "4096", "64KiB", "1MiB" or "2GiB": at least 1 KiB, at
// most most bytes.
func parseSize(s string, most int64) (int64, error) {
	mult := int64(1)
	num := s
	switch {
	case strings.HasSuffix(s, "GiB"):
		mult, num = 1<<30, strings.TrimSuffix(s, "GiB")
	case strings.HasSuffix(s, "MiB"):
		mult, num = 1<<20, strings.TrimSuffix(s, "MiB")
	case strings.HasSuffix(s, "KiB"):
		mult, num = 1<<10, strings.TrimSuffix(s, "KiB")
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > most/mult {
		return 0, fmt.Errorf("size %q: want bytes, or a number with KiB, MiB or GiB, up to %s", s, (&sizeFlag{n: most}).String())
	}
	if n*mult < 1<<10 {
		return 0, fmt.Errorf("size %q: at least 1KiB", s)
	}
	return n * mult, nil
}

// ptySize is --pty-max-size: COLSxROWS, each from 1 to 10000 (the
// largest a resize escape can ask for).
type ptySize struct{ cols, rows int }

func (f *ptySize) String() string { return fmt.Sprintf("%dx%d", f.cols, f.rows) }

// Set implements flag.Value.
func (f *ptySize) Set(s string) error {
	c, r, ok := strings.Cut(s, "x")
	cols, ok1 := sizeNumber(c)
	rows, ok2 := sizeNumber(r)
	if !ok || !ok1 || !ok2 {
		return fmt.Errorf("size %q: want COLSxROWS, each 1-10000 (e.g. 1000x1000)", s)
	}
	f.cols, f.rows = cols, rows
	return nil
}

// sizeNumber parses decimal digits as a number from 1 to 10000.
func sizeNumber(s string) (int, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 1 && n <= 10000
}

// scrollback is --pty-scrollback as the backend takes it: 0 is none.
func scrollback(lines int) int {
	if lines == 0 {
		return contract.NoScrollback
	}
	return lines
}
