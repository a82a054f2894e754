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

	"github.com/tether-agent/tether/contract"
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
	join        *time.Duration
	// the cluster's credentials, from files only
	secretFile, creds, nkey, tokenFile, user, passwordFile *string
	tlsCA, tlsCert, tlsKey                                 *string
}

// addClusterFlags defines the cluster flags on fs.
func addClusterFlags(fs *flag.FlagSet) *clusterFlags {
	f := &clusterFlags{
		hostID:      fs.String("host-id", "", "this host's name in a cluster (letters, digits, '_', '-'); default: a random one made once and kept in <state-dir>/host-id"),
		ttl:         fs.Duration("cluster-ttl", host.DefaultClusterTTL, "a cluster host whose heartbeat (every ttl/3) is older than this has lost its sessions to the others"),
		listen:      fs.String("cluster-listen", "", "with --cluster embedded: the embedded NATS server's client address (default 127.0.0.1 with a free port; off loopback it needs --cluster-tls-ca, --cluster-tls-cert and --cluster-tls-key)"),
		routeListen: fs.String("cluster-route-listen", "", "with --cluster embedded: the embedded NATS server's route address, to route with other hosts' (host:port; off loopback, or with routes off loopback, it needs --cluster-tls-ca, --cluster-tls-cert and --cluster-tls-key)"),
		replicas:    fs.Int("cluster-replicas", 0, "replicas of the cluster's buckets and streams when this host creates them (0: 3 on three NATS servers or more, else 1)"),
		join:        fs.Duration("cluster-join-timeout", host.DefaultClusterJoinTimeout, "how long a starting host waits to join the cluster (its servers to elect a leader) before it gives up, exit 1"),

		secretFile:   fs.String("cluster-secret-file", "", "with --cluster embedded (required): file holding the cluster's shared secret, the same on every host, mode 0600 (make one with: (umask 077; tether cluster secret > FILE)); clients and routes of the embedded NATS server need it"),
		creds:        fs.String("cluster-creds", "", "with --cluster nats://…: NATS .creds file (user JWT and seed) this host presents"),
		nkey:         fs.String("cluster-nkey", "", "with --cluster nats://…: file holding the nkey seed this host presents"),
		tokenFile:    fs.String("cluster-token-file", "", "with --cluster nats://…: file holding the NATS token this host presents"),
		user:         fs.String("cluster-user", "", "with --cluster nats://…: NATS user name this host presents (with --cluster-password-file)"),
		passwordFile: fs.String("cluster-password-file", "", "with --cluster-user: file holding that user's password"),
		tlsCA:        fs.String("cluster-tls-ca", "", "PEM CA that signs the cluster's certificates: verifies NATS servers (and, embedded, the routes' client certificates)"),
		tlsCert:      fs.String("cluster-tls-cert", "", "PEM certificate of this host: embedded, for TLS on the client port and mutual TLS on routes (with --cluster-tls-key and --cluster-tls-ca; needed off loopback); external, a client certificate"),
		tlsKey:       fs.String("cluster-tls-key", "", "PEM private key of --cluster-tls-cert"),
	}
	fs.Var(&f.urls, "cluster", "NATS URL (nats://HOST:PORT, repeatable or comma-separated) of a JetStream cluster to share one session table with other hosts, or \"embedded\" to run a NATS server in this process")
	fs.Var(&f.routes, "cluster-routes", "with --cluster embedded: route URLs (nats-route://HOST:PORT, no credentials: they come from --cluster-secret-file) of the other embedded servers (repeatable or comma-separated)")
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
		for _, c := range []struct{ flag, value string }{
			{"cluster-secret-file", *f.secretFile}, {"cluster-creds", *f.creds}, {"cluster-nkey", *f.nkey},
			{"cluster-token-file", *f.tokenFile}, {"cluster-user", *f.user}, {"cluster-password-file", *f.passwordFile},
			{"cluster-tls-ca", *f.tlsCA}, {"cluster-tls-cert", *f.tlsCert}, {"cluster-tls-key", *f.tlsKey},
		} {
			if c.value != "" {
				return nil, fmt.Errorf("--%s goes with --cluster", c.flag)
			}
		}
		return nil, nil
	}
	if *f.join <= 0 {
		return nil, fmt.Errorf("--cluster-join-timeout %v: want more than 0", *f.join)
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
	cc := &host.ClusterConfig{HostID: *f.hostID, TTL: *f.ttl, Replicas: *f.replicas, JoinTimeout: *f.join,
		SecretFile: *f.secretFile, TLSCA: *f.tlsCA, TLSCert: *f.tlsCert, TLSKey: *f.tlsKey,
		CredsFile: *f.creds, NkeyFile: *f.nkey, TokenFile: *f.tokenFile, User: *f.user, PasswordFile: *f.passwordFile}
	if len(urls) == 1 && urls[0] == "embedded" {
		cc.Embedded = true
		cc.EmbeddedListen = *f.listen
		cc.EmbeddedRouteListen = *f.routeListen
		cc.EmbeddedRoutes = routes
		if len(routes) > 0 && cc.EmbeddedRouteListen == "" {
			return nil, errors.New("--cluster-routes needs --cluster-route-listen")
		}
		if err := cc.Check(); err != nil {
			return nil, err
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
			return nil, fmt.Errorf("--cluster %s: want nats://HOST:PORT", redactURL(u))
		}
	}
	cc.URLs = urls
	if err := cc.Check(); err != nil {
		return nil, err
	}
	return cc, nil
}

// redactURL hides what may be credentials in a --cluster value that is
// not a URL, for an error message.
func redactURL(s string) string {
	if i := strings.LastIndex(s, "@"); i >= 0 {
		return "xxxxx" + s[i:]
	}
	return s
}

// clusterCmd lists the hosts of a running host's cluster; `tether
// cluster secret` makes a cluster's shared secret.
func clusterCmd(args []string) int {
	if len(args) > 0 && args[0] == "secret" {
		return clusterSecret(args[1:])
	}
	fs := flag.NewFlagSet("tether cluster", flag.ContinueOnError)
	tf := addTokenFlags(fs)
	asJSON := fs.Bool("json", false, "print the hosts as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: tether cluster [--json] [--url U]
       tether cluster secret > FILE

Lists the hosts of the cluster a running host belongs to, one line each:
id, listen address, live sessions, PTYs, and how long ago its last
heartbeat was seen. The access token is found as for tether sessions.
"tether cluster secret" prints a new shared secret for
--cluster-secret-file (see "tether cluster secret -h").

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

// secretBytes is how many random bytes `tether cluster secret` prints
// (in hex).
const secretBytes = 32

// clusterSecret prints a new cluster secret on stdout.
func clusterSecret(args []string) int {
	fs := flag.NewFlagSet("tether cluster secret", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: (umask 077; tether cluster secret > FILE)

Prints a new shared secret for a cluster of hosts with embedded NATS
servers: 32 random bytes as 64 hex digits. Give every host of the cluster
the same file with --cluster-secret-file FILE. Whoever can read it is a
host of the cluster (can read every session and reach every PTY): keep
the file mode 0600, owned by the user that runs tether serve; the umask
above makes it so (a file that group or others can read is refused, here
and by tether serve).
`)
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "tether cluster secret:", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "tether cluster secret: unexpected argument %q (the secret goes to stdout: tether cluster secret > FILE)\n", fs.Arg(0))
		return 2
	}
	if fi, err := os.Stdout.Stat(); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o077 != 0 {
		fmt.Fprintf(os.Stderr, "tether cluster secret: stdout is a file other users may read (mode %04o); nothing written: remove it and make it with (umask 077; tether cluster secret > FILE)\n", fi.Mode().Perm())
		return 1
	}
	if _, err := fmt.Println(contract.RandomHex(secretBytes)); err != nil {
		fmt.Fprintln(os.Stderr, "tether cluster secret:", err)
		return 1
	}
	return 0
}
