package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/cluster/embedded"
	"github.com/tether-agent/tether/host/internal/cluster/jsstore"
	"github.com/tether-agent/tether/host/internal/cluster/owners"
	"github.com/tether-agent/tether/host/internal/cluster/relay"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/metrics"
)

// NodeConfig configures a host's membership of a cluster.
type NodeConfig struct {
	// URLs are the NATS servers to connect to (nats://host:port); with
	// Embedded, the host connects to its embedded server in-process.
	URLs []string
	// Credentials and TLS are what the host presents to the servers of
	// URLs (with Embedded, the embedded server's secret is used instead).
	Credentials embedded.Credentials
	TLS         *embedded.TLSFiles
	// Embedded, when set, runs a NATS server with JetStream in this
	// process first (--cluster embedded).
	Embedded *embedded.Config
	// HostID and Instance name this host and its process.
	HostID, Instance string
	// TTL: a host whose heartbeat is older is gone (--cluster-ttl).
	TTL time.Duration
	// Replicas of the buckets and streams the host creates when they do
	// not exist: 0 picks 3 when the cluster has three servers or more,
	// else 1.
	Replicas int
	// Listen is the address of this host's public listener, shown by
	// `tether cluster`.
	Listen string
	Log    zerolog.Logger
}

// Hooks are what the node needs of the host, given once the session
// table exists (SetHooks).
type Hooks struct {
	// Stats gives the live session and PTY counts for the heartbeat.
	Stats func() (sessions, ptys int)
	// OnFenced and OnRestored: see owners.RegistryConfig.
	OnFenced, OnRestored func()
	// Active answers another host asking for this host's live sessions
	// (JSON).
	Active func() []byte
}

// Node is one host's membership of a cluster: its NATS connection (and
// embedded server), the ownership store, the stored-session store, the
// host registry with its heartbeat, and the relay.
type Node struct {
	cfg NodeConfig
	emb *embedded.Server
	// NC is the node's NATS connection.
	NC *nats.Conn
	js jetstream.JetStream
	// Owners is the table's ownership store.
	Owners *owners.Takeover
	// Store keeps the stored sessions, messages and journal.
	Store *jsstore.Store
	// Registry is the heartbeat and the view of the other hosts.
	Registry *owners.Registry
	// PTYs places the cluster's PTYs on hosts.
	PTYs *owners.PTYPlaces
	// ClientCredentials are the credentials every host of the cluster
	// accepts from clients.
	ClientCredentials *jsstore.ClientCredentials
	relay             *relay.Relay

	// waited is how long StartNode waited for the other servers.
	waited time.Duration

	hooks     atomic.Pointer[Hooks]
	activeSub *nats.Subscription
	closeOnce sync.Once
}

func activeSubject(host string) string { return "tether.ctl." + host + ".active" }

// StartNode joins the cluster: it starts the embedded server (if any),
// connects, opens the buckets and streams (creating them when needed)
// and writes the first heartbeat. Serve starts the relay once the
// endpoints exist; Close leaves.
func StartNode(ctx context.Context, cfg NodeConfig) (_ *Node, err error) {
	n := &Node{cfg: cfg}
	defer func() {
		if err != nil {
			n.Close(context.Background())
		}
	}()
	opts := []nats.Option{
		nats.Name("tether host " + cfg.HostID),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.Timeout(5 * time.Second),
	}
	if cfg.Embedded != nil {
		n.emb, err = embedded.Start(ctx, *cfg.Embedded)
		if err != nil {
			return nil, err
		}
		n.NC, err = n.emb.Connect(opts...)
		if err != nil {
			return nil, fmt.Errorf("cluster: connect to the embedded server: %w", err)
		}
	} else {
		if len(cfg.URLs) == 0 {
			return nil, errors.New("cluster: no NATS server URL")
		}
		auth, err := cfg.Credentials.Options(cfg.TLS)
		if err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		n.NC, err = nats.Connect(joinURLs(cfg.URLs), append(opts, auth...)...)
		switch {
		case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
			return nil, fmt.Errorf("cluster: connect to %s: the NATS server refused this host's credentials: %w", embedded.RedactURLs(cfg.URLs), err)
		case err != nil:
			return nil, fmt.Errorf("cluster: connect to %s: %w", embedded.RedactURLs(cfg.URLs), err)
		}
		if !n.NC.AuthRequired() {
			cfg.Log.Warn().Str("nats", n.NC.ConnectedUrlRedacted()).Msg("the cluster's NATS server let this host in with no credential: whoever can reach it can read every session and reach every PTY of the cluster")
		}
	}
	n.js, err = jetstream.New(n.NC)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	wait := &joinWait{log: cfg.Log}
	if n.emb != nil {
		if !n.emb.Server().JetStreamIsCurrent() {
			wait.waiting("jetstream", nil)
		}
		if err := n.emb.WaitJetStream(ctx); err != nil {
			return nil, err
		}
	}
	replicas := cfg.Replicas
	if replicas == 0 {
		// Three servers or more: the ones this connection knows (given
		// and discovered), or the routes an embedded server was given
		// (it may not have heard of the others yet).
		replicas = 1
		if len(n.NC.Servers()) >= 3 || cfg.Embedded != nil && len(cfg.Embedded.Routes) >= 3 {
			replicas = 3
		}
	}
	// A cluster still forming (servers starting, a meta leader not yet
	// elected, peers offline for a replicated placement) refuses for a
	// while, and a request racing another host's creation of the same
	// stream may go unanswered: each step is tried again, each try
	// bounded, until ctx ends.
	var kv *owners.KV
	steps := []struct {
		what string
		do   func(context.Context) error
	}{
		{"ownership bucket", func(ctx context.Context) (err error) {
			kv, err = owners.NewKV(ctx, n.js, owners.KVConfig{Replicas: replicas})
			return err
		}},
		{"session store", func(ctx context.Context) (err error) {
			n.Store, err = jsstore.Open(ctx, n.js, jsstore.Config{Replicas: replicas})
			return err
		}},
		{"hosts registry", func(ctx context.Context) (err error) {
			n.Registry, err = owners.OpenRegistry(ctx, n.js, owners.RegistryConfig{
				Self:       owners.HostInfo{ID: cfg.HostID, Instance: cfg.Instance, Listen: cfg.Listen, Started: time.Now()},
				TTL:        cfg.TTL,
				Replicas:   replicas,
				Stats:      n.stats,
				OnFenced:   func() { n.call(func(h *Hooks) func() { return h.OnFenced }) },
				OnRestored: func() { n.call(func(h *Hooks) func() { return h.OnRestored }) },
				Log:        cfg.Log,
			})
			return err
		}},
		{"pty places", func(ctx context.Context) (err error) {
			n.PTYs, err = owners.OpenPTYPlaces(ctx, n.js, n.Registry, replicas)
			return err
		}},
		{"credentials", func(ctx context.Context) (err error) {
			n.ClientCredentials, err = jsstore.OpenClientCredentials(ctx, n.js, replicas, cfg.Log)
			return err
		}},
	}
	for _, st := range steps {
		if err := retryStep(ctx, wait, st.what, st.do); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
	}
	n.Owners = owners.NewTakeover(kv, n.Registry, cfg.Log)
	n.waited = wait.waited()
	return n, nil
}

// joinWait is what a host says while it waits to join: once at info
// that it waits for the other servers, every try after at debug.
type joinWait struct {
	log   zerolog.Logger
	since time.Time // the first wait; zero while none
}

// waiting records that step is not ready (err: why, if known).
func (w *joinWait) waiting(step string, err error) {
	if w.since.IsZero() {
		w.since = time.Now()
		w.log.Info().Err(err).Str("step", step).Msg("waiting for the cluster's other servers (quorum)…")
		return
	}
	w.log.Debug().Err(err).Str("step", step).Msg("cluster not ready; trying again")
}

// waited is how long the host waited (0 when it never did).
func (w *joinWait) waited() time.Duration {
	if w.since.IsZero() {
		return 0
	}
	return time.Since(w.since)
}

// Waited is how long StartNode waited for the cluster's other servers
// (0 when they answered at once).
func (n *Node) Waited() time.Duration { return n.waited }

// stepTimeout bounds one try of a step of joining the cluster.
const stepTimeout = 2 * time.Second

// retryStep runs do until it succeeds, each try bounded by stepTimeout,
// until ctx ends; each failure is said through w.
func retryStep(ctx context.Context, w *joinWait, what string, do func(context.Context) error) error {
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		sctx, cancel := context.WithTimeout(ctx, stepTimeout)
		err := do(sctx)
		cancel()
		if err == nil {
			return nil
		}
		w.waiting(what, err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, err)
		case <-time.After(wait):
		}
	}
}

func joinURLs(urls []string) string {
	s := ""
	for i, u := range urls {
		if i > 0 {
			s += ","
		}
		s += u
	}
	return s
}

func (n *Node) stats() (int, int) {
	if h := n.hooks.Load(); h != nil && h.Stats != nil {
		return h.Stats()
	}
	return 0, 0
}

func (n *Node) call(pick func(*Hooks) func()) {
	if h := n.hooks.Load(); h != nil {
		if f := pick(h); f != nil {
			f()
		}
	}
}

// TTL is the cluster TTL the node runs with.
func (n *Node) TTL() time.Duration { return n.cfg.TTL }

// SetHooks gives the node what it needs of the host.
func (n *Node) SetHooks(h Hooks) { n.hooks.Store(&h) }

// Serve starts serving the other hosts: legs relayed to this host reach
// endpoints, and asks for this host's live sessions are answered.
func (n *Node) Serve(endpoints map[string]link.Endpoint) error {
	r, err := relay.New(n.NC, n.Registry, endpoints, n.cfg.TTL, n.cfg.Log)
	if err != nil {
		return err
	}
	n.relay = r
	n.activeSub, err = n.NC.Subscribe(activeSubject(n.cfg.HostID), func(m *nats.Msg) {
		var b []byte
		if h := n.hooks.Load(); h != nil && h.Active != nil {
			b = h.Active()
		}
		_ = m.Respond(b)
	})
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return n.NC.Flush()
}

// Stats describes the node for the cluster gauges.
func (n *Node) Stats() metrics.ClusterStats {
	var st metrics.ClusterStats
	for _, h := range n.Registry.Hosts() {
		if h.Alive {
			st.HostsAlive++
		} else {
			st.HostsGone++
		}
	}
	st.Takeovers = n.Owners.Takeovers.Load()
	if n.relay != nil {
		st.LegsIn, st.LegsOut = n.relay.Legs()
	}
	st.Fenced = n.Registry.Fenced()
	return st
}

// Relay is the node's relay (nil before Serve).
func (n *Node) Relay() *relay.Relay { return n.relay }

// SetListen records the public listener's address for the registry.
func (n *Node) SetListen(addr string) { n.Registry.SetListen(addr) }

// Active asks every other live host for its live sessions and returns
// their answers (JSON, as their Hooks.Active made them). A host that does
// not answer within ctx is left out.
func (n *Node) Active(ctx context.Context) [][]byte {
	var out [][]byte
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, h := range n.Registry.Hosts() {
		if h.ID == n.cfg.HostID || !h.Alive {
			continue
		}
		wg.Go(func() {
			m, err := n.NC.RequestWithContext(ctx, activeSubject(h.ID), nil)
			if err != nil || len(m.Data) == 0 {
				return
			}
			mu.Lock()
			out = append(out, m.Data)
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// Hosts lists the cluster's hosts (see owners.Registry.Hosts), as JSON-ready
// rows.
func (n *Node) Hosts() []HostRow {
	var rows []HostRow
	for _, h := range n.Registry.Hosts() {
		rows = append(rows, HostRow{ID: h.ID, Listen: h.Listen, Sessions: h.Sessions, PTYs: h.PTYs,
			HeartbeatAgeMS: h.Age.Milliseconds(), Alive: h.Alive, Self: h.ID == n.cfg.HostID})
	}
	return rows
}

// HostRow is one line of `tether cluster`.
type HostRow struct {
	ID             string `json:"id"`
	Listen         string `json:"listen"`
	Sessions       int    `json:"sessions"`
	PTYs           int    `json:"ptys"`
	HeartbeatAgeMS int64  `json:"heartbeat_age_ms"`
	Alive          bool   `json:"alive"`
	Self           bool   `json:"self"`
}

// MarshalActive is a helper for Hooks.Active.
func MarshalActive(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// Drain closes the legs other hosts relayed here with code (a host's
// shutdown: their clients resume elsewhere).
func (n *Node) Drain(code int, reason string) {
	if n.relay != nil {
		n.relay.Drain(code, reason)
	}
}

// Close leaves the cluster: the relay stops, the heartbeat entry is
// removed (the others know at once), the connection is drained, and the
// embedded server stops.
func (n *Node) Close(ctx context.Context) {
	n.closeOnce.Do(func() {
		if n.relay != nil {
			n.relay.Close()
		}
		if n.activeSub != nil {
			_ = n.activeSub.Unsubscribe()
		}
		if n.ClientCredentials != nil {
			n.ClientCredentials.Close()
		}
		if n.Registry != nil {
			if err := n.Registry.Close(ctx); err != nil {
				n.cfg.Log.Warn().Err(err).Msg("leaving the cluster")
			}
		}
		if n.Store != nil {
			_ = n.Store.Close()
		}
		if n.NC != nil {
			n.NC.Close()
		}
		if n.emb != nil {
			n.emb.Shutdown()
		}
	})
}
