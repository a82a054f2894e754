package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/term"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/internal/bytesize"
	"github.com/tether-agent/tether/internal/umask"
)

// serve is tether serve: it parses and checks the flags (serveFlags),
// judges the state dir, reads or makes the token, and runs the host until
// SIGINT or SIGTERM, SIGHUP reloading the transports.
func serve(args []string) int {
	// Every file the host, its plugins and its libraries make is private
	// from birth (0600, directories 0700); the processes that run the
	// user's code get back the user's umask (internal/umask).
	umask.Restrict()
	fs := flag.NewFlagSet("tether serve", flag.ContinueOnError)
	f := newServeFlags(fs)
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
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether serve: finding own binary:", err)
		return 1
	}
	if err := f.validate(self); err != nil {
		fmt.Fprintln(os.Stderr, "tether serve:", err)
		return 2
	}
	log := f.log
	// The token file is made once every flag is known good: a start
	// refused for a bad flag leaves a fresh state dir as it was. Nothing
	// in the state dir is read before it is judged: a state dir (or a
	// file in it) of another user, or one others can write, or a link
	// anywhere in it, is refused before its token file could be printed.
	if err := host.PrepareStateDir(f.stateDir, log); err != nil {
		fmt.Fprintln(os.Stderr, "tether serve:", err)
		return 1
	}
	cfg := f.hostConfig()
	if cfg.Token == "" {
		t, created, err := loadOrCreateToken(f.stateDir, f.tokenFile, log)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tether serve:", err)
			return 1
		}
		cfg.Token, cfg.TokenCreated = t, created
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
	// No watchdog: host.Run's stop has one deadline for all its parts
	// (about 4 s), so it returns in time even when a step cannot finish.
	cfg.Reload, cfg.Stdout = reload, os.Stdout
	err = host.Run(ctx, cfg)
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

func (f *sizeFlag) String() string { return bytesize.Format(f.n) }

// Set implements flag.Value.
func (f *sizeFlag) Set(s string) error {
	n, err := bytesize.Parse(s, 1<<10, cmp.Or(f.most, 1<<30))
	if err != nil {
		return err
	}
	f.n = n
	return nil
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
