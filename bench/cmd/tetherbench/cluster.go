package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/testing/hostproc"
	"github.com/tether-agent/tether/wire"
)

// clusterOpts configure the cluster rows (issue 16).
type clusterOpts struct {
	words     int           // cluster-relay: words per prompt (one message.delta each)
	prompts   int           // cluster-relay: measured prompts per repetition
	echoDelay time.Duration // cluster-relay: tether --echo-delay
	storm     int           // cluster-storm: sockets resuming one key at once
	ttl       time.Duration // cluster-failover: tether --cluster-ttl
	failovers int           // cluster-failover: kills per repetition
	ptySize   int64         // cluster-pty: bytes per stream
	reattach  int           // cluster-pty: attaches per host and kind per repetition
}

// clusterRows are the rows that start three hosts sharing one session
// table; "-rows cluster" selects them all.
var clusterRows = []string{"cluster-relay", "cluster-storm", "cluster-failover", "cluster-pty"}

// cluster is three `tether serve` processes, each with an embedded NATS
// server routed with the two others (--cluster embedded), as docs/CLUSTER.md's
// three-host set-up runs them.
type cluster struct {
	bin   string
	hosts []*server    // h1, h2, h3; nil while one is down
	opts  []tetherOpts // how each was started, to start it again in place
}

// startCluster starts three hosts with o (each its own state dir, token
// and host id h1..h3) at once — each waits for the others for its
// JetStream quorum before it prints its URL — and returns when all three
// serve.
func startCluster(bin string, o tetherOpts) (*cluster, error) {
	addrs, err := hostproc.FreeAddrs(6)
	if err != nil {
		return nil, err
	}
	clientAddrs, routeAddrs := addrs[:3], addrs[3:]
	var routes []string
	for _, r := range routeAddrs {
		routes = append(routes, "nats-route://"+r)
	}
	secret, err := clusterSecret(bin)
	if err != nil {
		return nil, err
	}
	c := &cluster{bin: bin, hosts: make([]*server, 3), opts: make([]tetherOpts, 3)}
	for i := range c.opts {
		d, err := os.MkdirTemp(tmpRoot, fmt.Sprintf("state-h%d-", i+1))
		if err != nil {
			return nil, err
		}
		h := o
		h.stateDir = d
		h.wait = 90 * time.Second
		h.extra = append(slices.Clone(o.extra),
			"--cluster", "embedded",
			"--cluster-secret-file", secret,
			"--cluster-listen", clientAddrs[i],
			"--cluster-route-listen", routeAddrs[i],
			"--cluster-routes", strings.Join(routes, ","),
			"--host-id", fmt.Sprintf("h%d", i+1))
		c.opts[i] = h
	}
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range c.hosts {
		wg.Go(func() { c.hosts[i], errs[i] = startTether(bin, c.opts[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.stop()
		return nil, fmt.Errorf("starting a 3-host cluster: %w", err)
	}
	return c, nil
}

// clusterSecret makes the cluster's shared secret as docs/CLUSTER.md does,
// (umask 077; tether cluster secret > FILE), in tmpRoot, and returns the
// file's path.
func clusterSecret(bin string) (string, error) {
	f, err := os.CreateTemp(tmpRoot, "cluster-secret-") // mode 0600
	if err != nil {
		return "", err
	}
	defer f.Close()
	cmd := exec.Command(bin, "cluster", "secret")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = f, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("tether cluster secret: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return f.Name(), nil
}

// restart starts host i again on its state dir and cluster addresses
// (after a kill): it rejoins the two others.
func (c *cluster) restart(i int) error {
	s, err := startTether(c.bin, c.opts[i])
	if err != nil {
		return fmt.Errorf("restarting h%d: %w", i+1, err)
	}
	c.hosts[i] = s
	return nil
}

// stop kills the three hosts at once: a graceful stop of the last two
// would wait for a quorum that left with the first.
func (c *cluster) stop() {
	var wg sync.WaitGroup
	for _, s := range c.hosts {
		if s != nil {
			wg.Go(s.kill)
		}
	}
	wg.Wait()
}

// state says, for an error message, whether each host still runs and
// what it last logged.
func (c *cluster) state() string {
	var b strings.Builder
	for i, s := range c.hosts {
		if s == nil {
			fmt.Fprintf(&b, "\nh%d: down", i+1)
			continue
		}
		st := "running"
		select {
		case <-s.exited:
			st = fmt.Sprintf("exited (%v)", s.waitErr)
		default:
		}
		log := s.stderr.all()
		fmt.Fprintf(&b, "\nh%d: %s; log tail:\n%s", i+1, st, log[max(0, len(log)-1500):])
	}
	return b.String()
}

// dialHost opens a JSON-RPC socket to s.
func dialHost(ctx context.Context, s *server, onEvent func(client.Event)) (*client.Conn, error) {
	return client.Dial(ctx, s.baseURL(), client.Options{Token: s.token, OnEvent: onEvent})
}

// retryable reports whether err is one a cluster answers while a
// session's owner or the storage is changing hands: 5002 (owner
// unreachable) or 5003 (storage unavailable).
func retryable(err error) bool {
	code := client.ErrorCode(err)
	return code == wire.CodeOwnerUnreachable || code == wire.CodeStorageUnavailable
}

// waitAlive waits until s reports n alive hosts in cluster.hosts.
func waitAlive(ctx context.Context, s *server, n int, d time.Duration) error {
	c, err := dialHost(ctx, s, nil)
	if err != nil {
		return fmt.Errorf("dial for cluster.hosts: %w", err)
	}
	defer c.Abort()
	deadline := time.Now().Add(d)
	for {
		hs, err := c.ClusterHosts(ctx)
		alive := 0
		for _, h := range hs.Hosts {
			if h.Alive {
				alive++
			}
		}
		if err == nil && alive >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d hosts alive after %v (%+v, %v)", alive, n, d, hs, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func fmtSorted(xs []float64) string {
	s := slices.Clone(xs)
	slices.Sort(s)
	var parts []string
	for _, x := range s {
		parts = append(parts, fmt.Sprintf("%.0f", x))
	}
	return strings.Join(parts, " ") + " ms"
}
