package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tether-agent/tether/host"
)

// clusterFlags are tether serve's cluster flags.
type clusterFlags struct {
	urls        strList
	hostID      *string
	ttl         *time.Duration
	listen      *string
	routeListen *string
	routes      strList
	replicas    *int
}

// addClusterFlags defines the cluster flags on fs.
func addClusterFlags(fs *flag.FlagSet) *clusterFlags {
	f := &clusterFlags{
		hostID:      fs.String("host-id", "", "this host's name in a cluster (letters, digits, '_', '-'); default: a random one made once and kept in <state-dir>/host-id"),
		ttl:         fs.Duration("cluster-ttl", host.DefaultClusterTTL, "a cluster host whose heartbeat (every ttl/3) is older than this has lost its sessions to the others"),
		listen:      fs.String("cluster-listen", "", "with --cluster embedded: the embedded NATS server's client address (default 127.0.0.1 with a free port)"),
		routeListen: fs.String("cluster-route-listen", "", "with --cluster embedded: the embedded NATS server's route address, to route with other hosts' (host:port)"),
		replicas:    fs.Int("cluster-replicas", 0, "replicas of the cluster's buckets and streams when this host creates them (0: 3 on three NATS servers or more, else 1)"),
	}
	fs.Var(&f.urls, "cluster", "NATS URL (nats://HOST:PORT, repeatable or comma-separated) of a JetStream cluster to share one session table with other hosts, or \"embedded\" to run a NATS server in this process")
	fs.Var(&f.routes, "cluster-routes", "with --cluster embedded: route URLs (nats-route://HOST:PORT) of the other embedded servers (repeatable or comma-separated)")
	return f
}

// config returns the host's cluster configuration, nil for a single host.
func (f *clusterFlags) config() (*host.ClusterConfig, error) {
	var urls []string
	for _, u := range f.urls {
		for _, part := range strings.Split(u, ",") {
			if part = strings.TrimSpace(part); part != "" {
				urls = append(urls, part)
			}
		}
	}
	var routes []string
	for _, r := range f.routes {
		for _, part := range strings.Split(r, ",") {
			if part = strings.TrimSpace(part); part != "" {
				routes = append(routes, part)
			}
		}
	}
	embeddedOnly := *f.listen != "" || *f.routeListen != "" || len(routes) > 0
	if len(urls) == 0 {
		if embeddedOnly {
			return nil, errors.New("--cluster-listen, --cluster-route-listen and --cluster-routes go with --cluster embedded")
		}
		return nil, nil
	}
	if *f.ttl < 300*time.Millisecond {
		return nil, fmt.Errorf("--cluster-ttl %v: at least 300ms", *f.ttl)
	}
	if *f.replicas < 0 || *f.replicas > 5 {
		return nil, fmt.Errorf("--cluster-replicas %d: 0 to 5", *f.replicas)
	}
	for _, c := range *f.hostID {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return nil, fmt.Errorf("--host-id %q: letters, digits, '_' and '-' only", *f.hostID)
		}
	}
	cc := &host.ClusterConfig{HostID: *f.hostID, TTL: *f.ttl, Replicas: *f.replicas}
	if len(urls) == 1 && urls[0] == "embedded" {
		cc.Embedded = true
		cc.EmbeddedListen = *f.listen
		cc.EmbeddedRouteListen = *f.routeListen
		cc.EmbeddedRoutes = routes
		if len(routes) > 0 && cc.EmbeddedRouteListen == "" {
			return nil, errors.New("--cluster-routes needs --cluster-route-listen")
		}
		return cc, nil
	}
	if embeddedOnly {
		return nil, errors.New("--cluster-listen, --cluster-route-listen and --cluster-routes go with --cluster embedded")
	}
	for _, u := range urls {
		if u == "embedded" {
			return nil, errors.New("--cluster embedded goes alone")
		}
		if !strings.HasPrefix(u, "nats://") && !strings.HasPrefix(u, "tls://") {
			return nil, fmt.Errorf("--cluster %q: want nats://HOST:PORT", u)
		}
	}
	cc.URLs = urls
	return cc, nil
}

// clusterCmd lists the hosts of a running host's cluster.
func clusterCmd(args []string) int {
	fs := flag.NewFlagSet("tether cluster", flag.ContinueOnError)
	tf := addTokenFlags(fs)
	asJSON := fs.Bool("json", false, "print the hosts as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: tether cluster [--json] [--url U]

Lists the hosts of the cluster a running host belongs to, one line each:
id, listen address, live sessions, PTYs, and how long ago its last
heartbeat was seen. The access token is found as for tether sessions.

flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "tether cluster:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := tf.dial(ctx, "tether cluster")
	if c == nil {
		return 1
	}
	defer c.Close()
	hosts, err := c.ClusterHosts(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether cluster:", err)
		return 1
	}
	if *asJSON {
		b, err := json.MarshalIndent(hosts, "", "  ")
		if err != nil {
			return 1
		}
		fmt.Println(string(b))
		return 0
	}
	if !hosts.Cluster {
		fmt.Println("not in a cluster: this host serves alone (start it with --cluster)")
		return 0
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "HOST\tLISTEN\tSESSIONS\tPTYS\tHEARTBEAT")
	for _, h := range hosts.Hosts {
		id := h.ID
		if h.Self {
			id += " (this)"
		}
		beat := fmt.Sprintf("%.1fs ago", float64(h.HeartbeatAgeMS)/1000)
		if !h.Alive {
			beat += " (gone)"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", id, h.Listen, h.Sessions, h.PTYs, beat)
	}
	if err := w.Flush(); err != nil {
		return 1
	}
	return 0
}
