package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/cluster"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/metrics"
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
}

// DefaultClusterTTL is --cluster-ttl's default.
const DefaultClusterTTL = 10 * time.Second

// clusterJoinTimeout bounds joining the cluster at start: servers of a
// cluster started together take a while to elect a leader.
const clusterJoinTimeout = 60 * time.Second

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
	id, err := HostID(cfg.StateDir, cc.HostID)
	if err != nil {
		return nil, err
	}
	ttl := cc.TTL
	if ttl <= 0 {
		ttl = DefaultClusterTTL
	}
	nc := cluster.NodeConfig{
		URLs:     cc.URLs,
		HostID:   id,
		Instance: contract.RandomHex(8),
		TTL:      ttl,
		Replicas: cc.Replicas,
		Listen:   cfg.Listen,
		Log:      cfg.Log.With().Str("host_id", id).Logger(),
	}
	if cc.Embedded {
		nc.Embedded = &cluster.EmbeddedConfig{
			Name:          id,
			Listen:        cc.EmbeddedListen,
			StoreDir:      filepath.Join(cfg.StateDir, "nats"),
			ClusterListen: cc.EmbeddedRouteListen,
			Routes:        cc.EmbeddedRoutes,
			Log:           cfg.Log,
		}
	}
	sctx, cancel := context.WithTimeout(ctx, clusterJoinTimeout)
	defer cancel()
	n, err := cluster.StartNode(sctx, nc)
	if err != nil {
		return nil, err
	}
	cfg.Log.Info().Str("host_id", id).Str("nats", n.NC.ConnectedUrlRedacted()).Dur("ttl", ttl).Msg("joined the cluster")
	return n, nil
}

// clusterRemote is the gateway's view of the cluster (rpc.Remote).
type clusterRemote struct{ n *cluster.Node }

var _ rpc.Remote = clusterRemote{}

// Dial implements rpc.Remote.
func (r clusterRemote) Dial(ctx context.Context, host, inst string, onCommand func(contract.Command)) (rpc.RemoteLeg, error) {
	l, err := r.n.Relay().Dial(ctx, host, inst, wire.PathRPC, "", onCommand)
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

func nodeOwners(n *cluster.Node) session.Owners {
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

// leaveCluster leaves the cluster at the end of Run.
func leaveCluster(n *cluster.Node) {
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
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
func (p clusterPTYs) Dial(ctx context.Context, host, inst, query string, onCommand func(contract.Command)) (ptyroute.Leg, error) {
	l, err := p.n.Relay().Dial(ctx, host, inst, wire.PathPTY, query, onCommand)
	if err != nil {
		return nil, err
	}
	return l, nil
}
