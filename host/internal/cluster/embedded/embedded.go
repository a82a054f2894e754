// Package embedded runs the cluster's NATS server with JetStream in the
// host's process (--cluster embedded), and holds who may use the
// cluster's bus: the embedded server's passwords derived from the
// cluster's secret, its TLS, the credentials a host of an external
// cluster presents, and the server's log turned into the host's with its
// repeats counted.
//
// # Who may use the bus
//
// Whoever can use the cluster's NATS is a host, so no one else can
// connect (auth.go). An embedded server with routes needs the cluster's
// shared secret (Config.Secret): clients and routes present
// passwords derived from it with HMAC-SHA256 (one for clients, one for
// routes), and the host's own connection is in-process (Server.Connect).
// An address off loopback needs TLS (Config.TLS: TLS on the
// client port, mutual TLS on routes). A host of an external cluster
// presents Credentials over TLSFiles (cluster.NodeConfig). nats-server and
// nats.go do all the checking (TestEmbeddedRefusesStrangers,
// TestRoutesNeedTheSecret, TestRoutesMutualTLS, TestCredentialsOptions).
package embedded

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// Server server errors.
var (
	// ErrNotReady: the embedded server did not become ready (listening,
	// and with JetStream current) in time.
	ErrNotReady = errors.New("embedded nats server not ready")
	// ErrStartFailed: the embedded server failed to start (it reported
	// a fatal error: a port it cannot listen on, JetStream that cannot
	// start).
	ErrStartFailed = errors.New("embedded nats server failed to start")
)

// ListenError is the embedded server failing to listen on one of its
// addresses; errors.Is(err, syscall.EADDRINUSE) tells a port that another
// process has. It wraps ErrStartFailed too.
type ListenError struct {
	// Routes is false for the client port (Config.Listen), true
	// for the route port (Config.ClusterListen).
	Routes bool
	// Addr is the address it was given.
	Addr string
	// Err is the listener's error.
	Err error
}

func (e *ListenError) Error() string {
	what := "client"
	if e.Routes {
		what = "route"
	}
	return fmt.Sprintf("embedded nats server: listen on %s for %s connections: %v", e.Addr, what, e.Err)
}

// Unwrap gives the listener's error and ErrStartFailed.
func (e *ListenError) Unwrap() []error { return []error{e.Err, ErrStartFailed} }

// Config configures an in-process NATS server with JetStream.
type Config struct {
	// Name is the server's name, unique in its cluster (JetStream
	// clustering requires one); "" lets the server pick one.
	Name string
	// Listen is the client address, host:port. Port 0 picks a free one
	// (unlike nats-server's own options, where 0 means 4222); "" is
	// 127.0.0.1 with a free port.
	Listen string
	// StoreDir is the directory JetStream keeps its files in; required.
	StoreDir string
	// ClusterName names the cluster this server routes with ("tether"
	// when ClusterListen is set and this is empty).
	ClusterName string
	// ClusterListen is the route address, host:port; "" runs a single
	// server. Port 0 picks a free one.
	ClusterListen string
	// Routes are the route URLs (nats-route://host:port, or host:port)
	// of the cluster's servers; this server's own may be among them.
	// JetStream clustering needs at least one.
	Routes []string
	// Secret is the cluster's shared secret (at least MinSecretBytes):
	// client connections and routes are accepted only with passwords
	// derived from it, and this server's routes present them. Required
	// with ClusterListen; a lone server without one accepts any client
	// (the host never runs one: tests do).
	Secret []byte
	// TLS, when set, serves TLS on the client port and mutual TLS on
	// routes (CA, Cert and Key all required). Without it, Listen,
	// ClusterListen and every route must be on loopback (ErrNeedTLS).
	TLS *TLSFiles
	// Log receives the server's log: its notices at debug level, its
	// warnings and errors as such.
	Log zerolog.Logger
}

// Server is a NATS server running in this process.
type Server struct {
	srv *server.Server
	// clientPass is the password of client connections, "" when the
	// server takes any.
	clientPass string
	// routes is how many routes it was given.
	routes   int
	stopOnce sync.Once
}

// Start starts a NATS server with JetStream in this process and
// returns once it accepts client (and route) connections, or when ctx is
// done (ErrNotReady). It does not wait for a JetStream cluster to form:
// that needs the other servers (see WaitJetStream).
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("embedded nats server: no store directory")
	}
	if len(cfg.Secret) > 0 && len(cfg.Secret) < MinSecretBytes {
		return nil, fmt.Errorf("embedded nats server: a secret of %d bytes, want at least %d: %w", len(cfg.Secret), MinSecretBytes, ErrNoSecret)
	}
	if cfg.ClusterListen != "" && len(cfg.Secret) == 0 {
		return nil, fmt.Errorf("embedded nats server: routes: %w", ErrNoSecret)
	}
	opts := &server.Options{
		ServerName: cfg.Name,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true, // the host handles signals
		MaxPayload: 1 << 20,
	}
	var err error
	listen := cfg.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	if opts.Host, opts.Port, err = hostPort(listen); err != nil {
		return nil, fmt.Errorf("embedded nats server: listen %q: %w", cfg.Listen, err)
	}
	offLoopback := !Loopback(listen)
	var clientPass, routePass string
	if len(cfg.Secret) > 0 {
		clientPass, routePass = derive(cfg.Secret, "client"), derive(cfg.Secret, "route")
		opts.Username, opts.Password = clientUser, clientPass
	}
	if cfg.ClusterListen != "" {
		opts.Cluster.Name = cfg.ClusterName
		if opts.Cluster.Name == "" {
			opts.Cluster.Name = "tether"
		}
		if opts.Cluster.Host, opts.Cluster.Port, err = hostPort(cfg.ClusterListen); err != nil {
			return nil, fmt.Errorf("embedded nats server: cluster listen %q: %w", cfg.ClusterListen, err)
		}
		offLoopback = offLoopback || !Loopback(cfg.ClusterListen)
		opts.Cluster.Username, opts.Cluster.Password = routeUser, routePass
		for _, r := range cfg.Routes {
			u, err := routeURL(r)
			if err != nil {
				return nil, fmt.Errorf("embedded nats server: route %s: %w", RedactURLs([]string{r}), err)
			}
			offLoopback = offLoopback || !Loopback(u.String())
			// A configured route presents the credentials of its URL.
			u.User = url.UserPassword(routeUser, routePass)
			opts.Routes = append(opts.Routes, u)
		}
	}
	if cfg.TLS != nil {
		if opts.TLSConfig, opts.Cluster.TLSConfig, err = cfg.TLS.ServerConfigs(); err != nil {
			return nil, fmt.Errorf("embedded nats server: %w", err)
		}
		if cfg.ClusterListen == "" {
			opts.Cluster.TLSConfig = nil
		}
	} else if offLoopback {
		return nil, fmt.Errorf("embedded nats server: %w", ErrNeedTLS)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats server: %w", err)
	}
	start := &startFatal{ch: make(chan fatal, 1)}
	start.on.Store(true)
	defer start.on.Store(false)
	srv.SetLoggerV2(natsLogger{log: cfg.Log.With().Str("component", "nats").Logger(), rep: newRepeats(repeatWindow, repeatGap, nil), start: start}, false, false, false)
	srv.Start()
	e := &Server{srv: srv, clientPass: clientPass, routes: len(opts.Routes)}
	for !srv.ReadyForConnections(50 * time.Millisecond) {
		select {
		case f := <-start.ch:
			// A port it cannot listen on stops it for good: say so now,
			// not after the join timeout.
			e.Shutdown()
			switch {
			case strings.HasPrefix(f.format, "Error listening on port") && f.cause != nil:
				return nil, &ListenError{Addr: listen, Err: f.cause}
			case strings.HasPrefix(f.format, "Error listening on router port") && f.cause != nil:
				return nil, &ListenError{Routes: true, Addr: cfg.ClusterListen, Err: f.cause}
			}
			return nil, fmt.Errorf("%w: %s", ErrStartFailed, f.line)
		default:
		}
		if ctx.Err() != nil {
			e.Shutdown()
			return nil, fmt.Errorf("embedded nats server on %s: %v: %w", listen, ctx.Err(), ErrNotReady)
		}
	}
	return e, nil
}

// startFatal takes the fatal errors the server reports while
// Start waits for it (on), for Start to return.
type startFatal struct {
	on atomic.Bool
	ch chan fatal
}

// fatal is one fatal error line of the server: its format, the line, and
// the error among its arguments.
type fatal struct {
	format, line string
	cause        error
}

// hostPort splits a host:port, mapping port 0 to the server's "any free
// port".
func hostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// routeURL parses a route given as a URL or as host:port. A route with
// credentials in it is refused: they come from the cluster's secret.
func routeURL(r string) (*url.URL, error) {
	if !strings.Contains(r, "://") {
		r = "nats-route://" + r
	}
	u, err := url.Parse(r)
	if err != nil {
		return nil, errors.New("not a URL")
	}
	if u.User != nil {
		return nil, errors.New("credentials in a route URL: they come from the cluster's secret")
	}
	if _, err := strconv.ParseUint(u.Port(), 10, 16); err != nil || u.Hostname() == "" {
		return nil, errors.New("want host:port")
	}
	return u, nil
}

// ClientOptions are the options that give a client connection the
// server's client credentials: none when the server takes any client.
func (e *Server) ClientOptions() []nats.Option {
	if e.clientPass == "" {
		return nil
	}
	return []nats.Option{nats.UserInfo(clientUser, e.clientPass)}
}

// ClientURL is the URL clients connect to (nats://host:port).
func (e *Server) ClientURL() string { return e.srv.ClientURL() }

// Connect opens a connection to the server in this process (no socket,
// so no TLS), with the server's client credentials; opts are added after
// them.
func (e *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	base := append([]nats.Option{nats.InProcessServer(e.srv)}, e.ClientOptions()...)
	// The URL only names the server: a tls:// one would ask for TLS.
	u := "nats://" + strings.TrimPrefix(strings.TrimPrefix(e.ClientURL(), "tls://"), "nats://")
	return nats.Connect(u, append(base, opts...)...)
}

// ClusterAddr is the address the server accepts routes on, or nil when
// it runs alone.
func (e *Server) ClusterAddr() net.Addr {
	if a := e.srv.ClusterAddr(); a != nil {
		return a
	}
	return nil
}

// Server is the nats-server itself, for what this type does not cover
// (tests step stream leaders down through it).
func (e *Server) Server() *server.Server { return e.srv }

// WaitJetStream waits until JetStream is current on this server: at once
// for a single server, once the cluster's meta group has a leader this
// server follows for a clustered one. It polls, as the server offers no
// notification; ctx bounds the wait (ErrNotReady).
func (e *Server) WaitJetStream(ctx context.Context) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !e.srv.JetStreamIsCurrent() {
		select {
		case <-ctx.Done():
			if e.routes > 0 && e.srv.NumRoutes() == 0 {
				return fmt.Errorf("jetstream on %s: %v: no route to another server was accepted (a refused route is logged above: do all hosts have the same --cluster-secret-file and --cluster-tls-ca?): %w", e.srv.Name(), ctx.Err(), ErrNotReady)
			}
			return fmt.Errorf("jetstream on %s: %v: %w", e.srv.Name(), ctx.Err(), ErrNotReady)
		case <-tick.C:
		}
	}
	return nil
}

// Shutdown stops the server and waits until it has stopped. The streams
// it led in a cluster elect new leaders among the other servers: until
// they have (a few seconds), calls on them fail, and the host answers
// them 5002 (a resume) or 5003 (retry). It is idempotent.
//
// (Lame duck mode would hand the leaderships over first, but it waits on
// the server's accept loops with no bound a host can give it.)
func (e *Server) Shutdown() {
	e.stopOnce.Do(func() {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	})
}

// natsLogger adapts zerolog to nats-server's logger: its notices at
// debug level, its warnings and errors as such, except that a warning or
// error said again and again is logged once and then summarised (see
// repeats), and a route that cannot be connected is a warning: the host
// keeps serving with the servers it reaches.
type natsLogger struct {
	log zerolog.Logger
	rep *repeats
	// start takes its fatal errors while the server starts.
	start *startFatal
}

// routeConnectErr starts nats-server's line for a failed attempt to
// connect a route (to a server that is gone, or not up yet).
const routeConnectErr = "Error trying to connect to route"

func (l natsLogger) Noticef(format string, v ...any) { l.log.Debug().Msgf(format, v...) }
func (l natsLogger) Warnf(format string, v ...any) {
	if strings.HasPrefix(format, "Plaintext passwords detected") {
		// The passwords are derived from the secret in memory, never
		// kept in a configuration file: nothing to act on.
		l.log.Debug().Msgf(format, v...)
		return
	}
	l.limited(zerolog.WarnLevel, format, v)
}

// Fatalf reports a fatal error: to Start while the server starts
// (it returns it; logged here at debug only), else at error level.
func (l natsLogger) Fatalf(format string, v ...any) {
	f := fatal{format: format, line: fmt.Sprintf(format, v...)}
	for _, a := range v {
		if err, ok := a.(error); ok {
			f.cause = err
		}
	}
	if l.start != nil && l.start.on.Load() {
		select {
		case l.start.ch <- f:
			l.log.Debug().Msg(f.line)
			return
		default: // one is reported already
		}
	}
	l.log.Error().Msg(f.line)
}
func (l natsLogger) Errorf(format string, v ...any) {
	level := zerolog.ErrorLevel
	if strings.HasPrefix(format, routeConnectErr) {
		level = zerolog.WarnLevel
	}
	l.limited(level, format, v)
}
func (l natsLogger) Debugf(format string, v ...any) { l.log.Debug().Msgf(format, v...) }
func (l natsLogger) Tracef(format string, v ...any) { l.log.Trace().Msgf(format, v...) }

// limited logs a line at level, or at debug when it repeats one logged
// at level less than a window ago.
func (l natsLogger) limited(level zerolog.Level, format string, v []any) {
	switch vd := l.rep.see(kindOf(format, v)); {
	case !vd.loud:
		l.log.Debug().Bool("repeat", true).Msgf(format, v...)
	case vd.repeated > 0:
		l.log.WithLevel(level).Int("repeats", vd.repeated).
			Msgf("%s (and %d more like it in %s, at debug level)", fmt.Sprintf(format, v...), vd.repeated, vd.since.Round(time.Second))
	default:
		l.log.WithLevel(level).Msgf(format, v...)
	}
}
