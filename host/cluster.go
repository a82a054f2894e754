package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/acpgw"
	"github.com/tether-agent/tether/host/internal/cluster"
	"github.com/tether-agent/tether/host/internal/cluster/embedded"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/ownership"
	"github.com/tether-agent/tether/host/internal/ptyroute"
	"github.com/tether-agent/tether/host/internal/rpc"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/host/internal/supervise"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/internal/statedir"
	"github.com/tether-agent/tether/wire"
)

// ClusterConfig joins a host to a cluster of hosts sharing one session
// table on NATS JetStream (tether serve --cluster).
type ClusterConfig struct {
	// URLs are the NATS servers (nats://host:port) of a JetStream
	// cluster. Empty with Embedded.
	URLs []string
	// Embedded runs a NATS server with JetStream in the host process
	// (--cluster embedded), keeping its files in <state-dir>/nats.
	Embedded bool
	// EmbeddedListen is the embedded server's client address
	// (--cluster-listen; default 127.0.0.1 with a free port).
	EmbeddedListen string
	// EmbeddedRouteListen and EmbeddedRoutes route the embedded server
	// with others' (--cluster-route-listen, --cluster-routes).
	EmbeddedRouteListen string
	EmbeddedRoutes      []string
	// HostID names this host in the cluster; empty: the one kept in
	// <state-dir>/host-id (made once, at random).
	HostID string
	// TTL: a host whose heartbeat is older loses its sessions to the
	// others (default 10s).
	TTL time.Duration
	// Replicas of the buckets and streams when this host creates them
	// (0: 3 on a cluster of three servers or more, else 1).
	Replicas int
	// JoinTimeout bounds joining the cluster at start
	// (--cluster-join-timeout; 0: 60 s).
	JoinTimeout time.Duration

	// SecretFile holds the cluster's shared secret, at least 32 bytes
	// (--cluster-secret-file; `tether cluster secret` makes one),
	// required with Embedded: the embedded server accepts clients and
	// routes only with passwords derived from it. The file must be the
	// user's own and readable by nobody else.
	SecretFile string
	// TLSCA, TLSCert and TLSKey are the cluster's TLS files (PEM;
	// --cluster-tls-ca, --cluster-tls-cert, --cluster-tls-key). With
	// Embedded, all three or none: the embedded server then serves TLS to
	// clients and mutual TLS to routes, and it needs them to listen or
	// route off loopback. With URLs, TLSCA verifies the servers and
	// TLSCert with TLSKey is a client certificate.
	TLSCA, TLSCert, TLSKey string
	// CredsFile (a NATS .creds file), NkeyFile (an nkey seed), TokenFile,
	// or User with PasswordFile are what a host presents to an external
	// cluster (--cluster-creds, --cluster-nkey, --cluster-token-file,
	// --cluster-user with --cluster-password-file): one kind at most.
	CredsFile, NkeyFile, TokenFile string
	User, PasswordFile             string
}

// clusterAuth is what ClusterConfig's files hold.
type clusterAuth struct {
	secret []byte
	creds  embedded.Credentials
	tls    *embedded.TLSFiles
}

// makeSecret is the command that makes a cluster secret, for messages.
const makeSecret = "(umask 077; tether cluster secret > FILE)"

// Check checks the cluster's configuration and reads its credential
// files, as Run does before it joins: tether serve calls it first, so a
// mistake is refused before anything starts. No error quotes a secret.
func (c *ClusterConfig) Check() error {
	_, err := c.load()
	return err
}

// load checks c and reads its files.
func (c *ClusterConfig) load() (clusterAuth, error) {
	var a clusterAuth
	for _, raw := range c.URLs {
		u, err := url.Parse(raw)
		if err != nil {
			return a, fmt.Errorf("--cluster %s: not a URL", embedded.RedactURLs([]string{raw}))
		}
		if u.User != nil {
			return a, fmt.Errorf("--cluster %s: credentials in a URL are seen by every user of the machine (ps): put the credentials in a file (--cluster-creds, --cluster-nkey, --cluster-token-file, or --cluster-user with --cluster-password-file)", embedded.RedactURLs([]string{raw}))
		}
	}
	if c.TLSCA != "" || c.TLSCert != "" || c.TLSKey != "" {
		a.tls = &embedded.TLSFiles{CA: c.TLSCA, Cert: c.TLSCert, Key: c.TLSKey}
		for _, f := range []struct{ flag, path string }{
			{"--cluster-tls-ca", c.TLSCA}, {"--cluster-tls-cert", c.TLSCert}, {"--cluster-tls-key", c.TLSKey},
		} {
			if f.path == "" {
				continue
			}
			if _, err := os.ReadFile(f.path); err != nil {
				return a, fmt.Errorf("%s: %w", f.flag, err)
			}
		}
		if (c.TLSCert == "") != (c.TLSKey == "") {
			return a, errors.New("--cluster-tls-cert and --cluster-tls-key go together")
		}
	}
	external := []struct{ flag, value string }{
		{"--cluster-creds", c.CredsFile}, {"--cluster-nkey", c.NkeyFile}, {"--cluster-token-file", c.TokenFile},
		{"--cluster-user", c.User}, {"--cluster-password-file", c.PasswordFile},
	}
	if c.Embedded {
		for _, f := range external {
			if f.value != "" {
				return a, fmt.Errorf("%s goes with an external cluster (--cluster nats://…): the hosts of an embedded cluster authenticate with --cluster-secret-file", f.flag)
			}
		}
		if c.SecretFile == "" {
			return a, fmt.Errorf("--cluster embedded needs --cluster-secret-file FILE, the cluster's shared secret: make one with %s and give every host of the cluster the same", makeSecret)
		}
		var err error
		if a.secret, err = readSecretFile(c.SecretFile, os.Geteuid()); err != nil {
			return a, err
		}
		for _, r := range c.EmbeddedRoutes {
			if strings.Contains(r, "@") {
				return a, fmt.Errorf("--cluster-routes %s: no credentials in a route: the routes' credentials come from --cluster-secret-file", embedded.RedactURLs([]string{r}))
			}
		}
		if a.tls != nil && (c.TLSCA == "" || c.TLSCert == "" || c.TLSKey == "") {
			return a, errors.New("--cluster embedded with TLS needs all three of --cluster-tls-ca, --cluster-tls-cert and --cluster-tls-key (TLS for clients, mutual TLS for routes)")
		}
		if a.tls != nil {
			if _, _, err := a.tls.ServerConfigs(); err != nil {
				return a, fmt.Errorf("cluster TLS: %w", err)
			}
		} else {
			offLoopback := []struct{ flag, addr string }{{"--cluster-listen", c.EmbeddedListen}, {"--cluster-route-listen", c.EmbeddedRouteListen}}
			for _, r := range c.EmbeddedRoutes {
				offLoopback = append(offLoopback, struct{ flag, addr string }{"--cluster-routes", r})
			}
			for _, f := range offLoopback {
				if f.addr != "" && !embedded.Loopback(f.addr) {
					return a, fmt.Errorf("%s %s is not loopback: off loopback the cluster's bus needs --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca (TLS for clients, mutual TLS for routes)", f.flag, embedded.RedactURLs([]string{f.addr}))
				}
			}
		}
		return a, nil
	}
	if c.SecretFile != "" {
		return a, errors.New("--cluster-secret-file goes with --cluster embedded: an external cluster takes --cluster-creds, --cluster-nkey, --cluster-token-file, or --cluster-user with --cluster-password-file")
	}
	kinds := 0
	for _, v := range []string{c.CredsFile, c.NkeyFile, c.TokenFile, c.User + c.PasswordFile} {
		if v != "" {
			kinds++
		}
	}
	if kinds > 1 {
		return a, errors.New("give one of --cluster-creds, --cluster-nkey, --cluster-token-file, or --cluster-user with --cluster-password-file")
	}
	if (c.User == "") != (c.PasswordFile == "") {
		return a, errors.New("--cluster-user and --cluster-password-file go together")
	}
	switch {
	case c.CredsFile != "":
		b, err := os.ReadFile(c.CredsFile)
		if err != nil {
			return a, fmt.Errorf("--cluster-creds: %w", err)
		}
		kp, err := nkeys.ParseDecoratedUserNKey(b)
		if err != nil {
			return a, fmt.Errorf("--cluster-creds %s: not a NATS .creds file (a user JWT and its seed): %w", c.CredsFile, err)
		}
		kp.Wipe()
		a.creds.CredsFile = c.CredsFile
	case c.NkeyFile != "":
		if _, err := os.ReadFile(c.NkeyFile); err != nil {
			return a, fmt.Errorf("--cluster-nkey: %w", err)
		}
		if _, err := nats.NkeyOptionFromSeed(c.NkeyFile); err != nil {
			return a, fmt.Errorf("--cluster-nkey %s: not an nkey seed: %w", c.NkeyFile, err)
		}
		a.creds.NkeyFile = c.NkeyFile
	case c.TokenFile != "":
		b, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return a, fmt.Errorf("--cluster-token-file: %w", err)
		}
		if a.creds.Token = strings.TrimSpace(string(b)); a.creds.Token == "" {
			return a, fmt.Errorf("--cluster-token-file %s: empty", c.TokenFile)
		}
	case c.User != "":
		b, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return a, fmt.Errorf("--cluster-password-file: %w", err)
		}
		if a.creds.Password = strings.TrimRight(string(b), "\r\n"); a.creds.Password == "" {
			return a, fmt.Errorf("--cluster-password-file %s: empty", c.PasswordFile)
		}
		a.creds.User = c.User
	}
	if err := a.creds.Check(a.tls); err != nil {
		return a, fmt.Errorf("cluster TLS: %w", err)
	}
	return a, nil
}

// readSecretFile reads a cluster secret: a regular file of user uid's
// (this process's), readable and writable by nobody else, of at least
// embedded.MinSecretBytes (surrounding white space aside).
func readSecretFile(path string, uid int) ([]byte, error) {
	b, err := readOwnFile("--cluster-secret-file", path, uid)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w (make one with %s)", err, makeSecret)
	}
	if err != nil {
		return nil, err
	}
	if len(b) < embedded.MinSecretBytes {
		return nil, fmt.Errorf("--cluster-secret-file %s: %d bytes, want at least %d random bytes: make one with %s", path, len(b), embedded.MinSecretBytes, makeSecret)
	}
	return b, nil
}

// readOwnFile reads the secret file path given by flag: a regular file
// of user uid's (this process's), readable and writable by nobody else;
// surrounding white space is trimmed.
func readOwnFile(flag, path string, uid int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %s: not a regular file", flag, path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s %s: mode %04o lets other users read or change it: chmod 600 %s", flag, path, perm, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != uid {
		return nil, fmt.Errorf("%s %s: owned by uid %d, not by this user (uid %d)", flag, path, st.Uid, uid)
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return bytes.TrimSpace(b), nil
}

// DefaultClusterTTL is --cluster-ttl's default.
const DefaultClusterTTL = 10 * time.Second

// DefaultClusterJoinTimeout bounds joining the cluster at start unless
// --cluster-join-timeout says otherwise: servers of a cluster started
// together take a while to elect a leader.
const DefaultClusterJoinTimeout = 60 * time.Second

// hostIDFile is where a host keeps its cluster name when none is given.
const hostIDFile = "host-id"

// HostID returns the host id to use on stateDir: given when not empty,
// else the one kept in <stateDir>/host-id, made at random and kept there
// the first time. The file is never read or made through a symbolic
// link, and one of another user's, or one others can write, is refused.
func HostID(stateDir, given string) (string, error) {
	if given != "" {
		return given, nil
	}
	path := filepath.Join(stateDir, hostIDFile)
	for range 2 {
		b, err := statedir.ReadFile(path)
		flag := os.O_WRONLY | os.O_TRUNC // an empty one is filled
		switch id := strings.TrimSpace(string(b)); {
		case err == nil && id != "":
			return id, nil
		case errors.Is(err, os.ErrNotExist):
			flag = os.O_WRONLY | os.O_CREATE | os.O_EXCL
		case err != nil:
			return "", fmt.Errorf("host id: %w", err)
		}
		id := "host-" + contract.RandomHex(4)
		f, err := statedir.OpenFile(path, flag, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue // made meanwhile: read it
		}
		if err != nil {
			return "", fmt.Errorf("host id: %w", err)
		}
		_, err = f.WriteString(id + "\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return "", fmt.Errorf("host id: %w", err)
		}
		return id, nil
	}
	return "", fmt.Errorf("host id: %s appeared and vanished while tether made it", path)
}

// startCluster joins the cluster cfg.Cluster describes.
func startCluster(ctx context.Context, cfg Config) (*cluster.Node, error) {
	cc := cfg.Cluster
	auth, err := cc.load()
	if err != nil {
		return nil, err
	}
	id, err := HostID(cfg.StateDir, cc.HostID)
	if err != nil {
		return nil, err
	}
	ttl := cc.TTL
	if ttl <= 0 {
		ttl = DefaultClusterTTL
	}
	nc := cluster.NodeConfig{
		URLs:        cc.URLs,
		Credentials: auth.creds,
		TLS:         auth.tls,
		HostID:      id,
		Instance:    contract.RandomHex(8),
		TTL:         ttl,
		Replicas:    cc.Replicas,
		Listen:      cfg.Listen,
		Log:         cfg.Log.With().Str("host_id", id).Logger(),
	}
	if cc.Embedded {
		nc.Embedded = &embedded.Config{
			Name:          id,
			Listen:        cc.EmbeddedListen,
			StoreDir:      filepath.Join(cfg.StateDir, "nats"),
			ClusterListen: cc.EmbeddedRouteListen,
			Routes:        cc.EmbeddedRoutes,
			Secret:        auth.secret,
			TLS:           auth.tls,
			Log:           cfg.Log,
		}
	}
	join := cc.JoinTimeout
	if join <= 0 {
		join = DefaultClusterJoinTimeout
	}
	sctx, cancel := context.WithTimeout(ctx, join)
	defer cancel()
	n, err := cluster.StartNode(sctx, nc)
	if err != nil {
		return nil, listenFlagError(err)
	}
	ev := cfg.Log.Info().Str("host_id", id).Str("nats", n.NC.ConnectedUrlRedacted()).Str("ttl", ttl.String())
	if w := n.Waited(); w > 0 {
		ev = ev.Str("waited", w.Round(100*time.Millisecond).String())
	}
	ev.Msg("joined the cluster")
	return n, nil
}

// listenFlagError names the flag of an address the embedded NATS server
// could not listen on, and says when another process has it.
func listenFlagError(err error) error {
	var le *embedded.ListenError
	if !errors.As(err, &le) {
		return err
	}
	flag := "--cluster-listen"
	if le.Routes {
		flag = "--cluster-route-listen"
	}
	if errors.Is(le.Err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s %s is already in use (another process listens there; stop it or choose another port): %w", flag, le.Addr, err)
	}
	return fmt.Errorf("%s %s: %w", flag, le.Addr, err)
}

// clusterRemote is the gateway's view of the cluster (rpc.Remote).
type clusterRemote struct{ n *cluster.Node }

var _ rpc.Remote = clusterRemote{}

// Dial implements rpc.Remote.
func (r clusterRemote) Dial(ctx context.Context, host, inst string, who access.Identity, onCommand func(contract.Command)) (rpc.RemoteLeg, error) {
	l, err := r.n.Relay().Dial(ctx, host, inst, wire.PathRPC, "", who, onCommand)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// clusterACP is the /acp endpoint's view of the cluster (acpgw.Remote).
type clusterACP struct{ n *cluster.Node }

var _ acpgw.Remote = clusterACP{}

// Dial implements acpgw.Remote.
func (r clusterACP) Dial(ctx context.Context, host, inst string, who access.Identity, onCommand func(contract.Command)) (acpgw.RemoteLeg, error) {
	l, err := r.n.Relay().Dial(ctx, host, inst, wire.PathACP, "", who, onCommand)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Active implements rpc.Remote.
func (r clusterRemote) Active(ctx context.Context) []session.ActiveEntry {
	var all []session.ActiveEntry
	for _, b := range r.n.Active(ctx) {
		var es []session.ActiveEntry
		if json.Unmarshal(b, &es) == nil {
			all = append(all, es...)
		}
	}
	return all
}

// Hosts implements rpc.Remote.
func (r clusterRemote) Hosts() []wire.ClusterHost {
	var out []wire.ClusterHost
	for _, h := range r.n.Hosts() {
		out = append(out, wire.ClusterHost(h))
	}
	return out
}

// openStore opens the store of stored sessions: the cluster's when
// cfg.Cluster is set (node is then the host's membership), else state.db.
func openStore(ctx context.Context, cfg Config) (store.Backend, *cluster.Node, error) {
	if cfg.Cluster != nil {
		node, err := startCluster(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		return node.Store, node, nil
	}
	dbPath := filepath.Join(cfg.StateDir, "state.db")
	warnIfHistoryMissing(cfg, dbPath)
	st, err := store.Open(ctx, dbPath)
	if err != nil {
		return nil, nil, fmt.Errorf("open state: %w", err)
	}
	return st, nil, nil
}

func nodeOwners(n *cluster.Node) ownership.Store {
	if n == nil {
		return nil
	}
	return n.Owners
}

func nodeID(n *cluster.Node) string {
	if n == nil {
		return ""
	}
	id, _ := n.Registry.Self()
	return id
}

func nodeInstance(n *cluster.Node) string {
	if n == nil {
		return ""
	}
	_, inst := n.Registry.Self()
	return inst
}

// nodeOwnersTimeout bounds a call to the cluster's ownership store at a
// quarter of the TTL (0 on a single host: the table's default), so that a
// host cut off from NATS lets go of its sessions before the others may
// take them.
func nodeOwnersTimeout(n *cluster.Node) time.Duration {
	if n == nil {
		return 0
	}
	return min(n.TTL()/4, 5*time.Second)
}

// serveCluster makes the serving host a cluster member (its gateway and
// PTY router reach the other hosts already): the heartbeat carries the
// counts, a fenced host lets go of its sessions, and other hosts' legs
// reach endpoints.
func serveCluster(n *cluster.Node, m *metrics.Metrics, table *session.Table, backend *supervise.Backend, endpoints map[string]link.Endpoint, addr string) error {
	m.SetClusterSource(nodeID(n), n.Stats)
	n.SetListen(addr)
	n.SetHooks(cluster.Hooks{
		Stats: func() (int, int) {
			ptys := 0
			if backend != nil {
				ptys = max(backend.Stats().PTYs, 0)
			}
			return len(table.Active()), ptys
		},
		// Off the heartbeat's goroutine: letting go waits for binds in
		// flight, each bounded by the owners timeout.
		OnFenced: func() { go table.Fence() },
		Active:   func() []byte { return cluster.MarshalActive(table.Active()) },
	})
	return n.Serve(endpoints)
}

// leaveTimeout bounds removing this host's heartbeat entry when it stops:
// a cluster that lost its quorum cannot take the write, and the host must
// still exit in time (the others see it gone after the TTL instead).
const leaveTimeout = time.Second

// leaveCluster leaves the cluster at the end of Run, within ctx's
// deadline and at most leaveTimeout.
func leaveCluster(ctx context.Context, n *cluster.Node) {
	ctx, cancel := context.WithTimeout(ctx, leaveTimeout)
	defer cancel()
	n.Close(ctx)
}

// clusterPTYs is the PTY router's view of the cluster (ptyroute.Remote).
type clusterPTYs struct{ n *cluster.Node }

var _ ptyroute.Remote = clusterPTYs{}

// Locate implements ptyroute.Remote.
func (p clusterPTYs) Locate(ctx context.Context, token string) (string, string, error) {
	return p.n.PTYs.Locate(ctx, token)
}

// Dial implements ptyroute.Remote.
func (p clusterPTYs) Dial(ctx context.Context, host, inst, query string, who access.Identity, onCommand func(contract.Command)) (ptyroute.Leg, error) {
	l, err := p.n.Relay().Dial(ctx, host, inst, wire.PathPTY, query, who, onCommand)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// credentialsTimeout bounds reading the credentials at start.
const credentialsTimeout = 30 * time.Second

// openCredentials makes the book of the credentials the host accepts:
// state.db's on a single host, the cluster's (followed as other hosts
// change them) in a cluster; with the access token in it as "admin" (in
// a cluster "admin@HOST", so that each host's token is accepted by all).
func openCredentials(ctx context.Context, cfg Config, st store.Backend, node *cluster.Node) (*access.Book, error) {
	ctx, cancel := context.WithTimeout(ctx, credentialsTimeout)
	defer cancel()
	var book *access.Book
	id := access.AdminName
	if node != nil {
		book = access.NewBook(node.ClientCredentials, cfg.Log)
		if err := node.ClientCredentials.Watch(ctx, book.Apply); err != nil {
			return nil, err
		}
		id += "@" + nodeID(node)
	} else {
		cs, ok := st.(store.CredentialStore)
		if !ok {
			return nil, errors.New("credentials: the store keeps none")
		}
		book = access.NewBook(cs, cfg.Log)
		if err := book.Load(ctx); err != nil {
			return nil, err
		}
	}
	if err := book.SetAccessToken(ctx, id, cfg.Token); err != nil {
		cfg.Log.Warn().Err(err).Msg("the access token could not be stored: this host accepts it, other hosts of a cluster do not")
		return book, nil
	}
	if err := book.Prune(ctx); err != nil {
		cfg.Log.Warn().Err(err).Msg("old page sign-ins could not be removed")
	}
	return book, nil
}
