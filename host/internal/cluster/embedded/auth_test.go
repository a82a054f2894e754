package embedded_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/cluster/clustertest"
	"github.com/tether-agent/tether/host/internal/cluster/embedded"
	"github.com/tether-agent/tether/testing/certtest"
)

// logBuffer keeps what a logger writes, for the servers' goroutines.
type logBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() zerolog.Logger { return zerolog.New(l) }

// waitFor polls cond until it holds, failing tb after clustertest.Timeout.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(clustertest.Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("no %s within %v", what, clustertest.Timeout)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition
	}
}

// dial connects as an outsider would, to url alone (not to the servers
// it tells of) and with no clustertest.Retry: its error is that server's answer.
func dial(url string, opts ...nats.Option) error {
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(5 * time.Second), nats.NoReconnect(), nats.IgnoreDiscoveredServers()}, opts...)...)
	if err == nil {
		nc.Close()
	}
	return err
}

// startRogue starts a nats-server with JetStream in this test, outside
// embedded.Start (which refuses what it does), that routes to route with
// the route options opts give it. It is shut down at the test's end.
func startRogue(tb testing.TB, route *url.URL, adjust func(*server.Options)) *server.Server {
	tb.Helper()
	opts := &server.Options{
		ServerName: "rogue",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   tb.TempDir(),
		NoSigs:     true,
		Cluster:    server.ClusterOpts{Name: "tether", Host: "127.0.0.1", Port: server.RANDOM_PORT},
		Routes:     []*url.URL{route},
	}
	if adjust != nil {
		adjust(opts)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("rogue server: %v", err)
	}
	srv.Start()
	tb.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	if !srv.ReadyForConnections(clustertest.Timeout) {
		tb.Fatal("rogue server not ready")
	}
	return srv
}

// routedTo reports whether srv has a route to the server called name.
func routedTo(tb testing.TB, srv *server.Server, name string) bool {
	tb.Helper()
	rz, err := srv.Routez(nil)
	if err != nil {
		tb.Fatal(err)
	}
	for _, r := range rz.Routes {
		if r.RemoteName == name {
			return true
		}
	}
	return false
}

// TestEmbeddedRefusesStrangers: on a routed server with a secret, a NATS
// client with no credential, a wrong token, a wrong password, or the
// route's password is refused on the client port with an authorization
// error (not a timeout), and so is every client on the route port, the
// client's password included; the host's own in-process connection, and
// a client with the client password, read and write the cluster's KV.
func TestEmbeddedRefusesStrangers(t *testing.T) {
	nodes := clustertest.StartCluster(t, 2)
	e := nodes[0]
	routePort := "nats://" + e.ClusterAddr().String()
	for _, tt := range []struct {
		name string
		url  string
		opts []nats.Option
	}{
		{"client port, no credential", e.ClientURL(), nil},
		{"client port, a token", e.ClientURL(), []nats.Option{nats.Token("guess")}},
		{"client port, a wrong password", e.ClientURL(), []nats.Option{nats.UserInfo(embedded.ClientUser, "guess")}},
		{"client port, the secret as password", e.ClientURL(), []nats.Option{nats.UserInfo(embedded.ClientUser, string(clustertest.Secret))}},
		{"client port, the route's password", e.ClientURL(), []nats.Option{nats.UserInfo(embedded.RouteUser, embedded.Derive(clustertest.Secret, "route"))}},
		{"route port, no credential", routePort, nil},
		{"route port, a token", routePort, []nats.Option{nats.Token("guess")}},
		{"route port, the client's password", routePort, []nats.Option{nats.UserInfo(embedded.ClientUser, embedded.ClientPass(e))}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := dial(tt.url, tt.opts...)
			if !errors.Is(err, nats.ErrAuthorization) {
				t.Fatalf("clustertest.Connect: %v, want %v", err, nats.ErrAuthorization)
			}
		})
	}
	ctx := t.Context()
	nc, err := e.Connect()
	if err != nil {
		t.Fatalf("in-process connection with the secret: %v", err)
	}
	defer nc.Close()
	for name, js := range map[string]jetstream.JetStream{"in-process": mustJS(t, nc), "client port": second(clustertest.ConnectNode(t, e))} {
		kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "tether_sessions"})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := kv.Put(ctx, "k", []byte(name)); err != nil {
			t.Fatalf("%s: put: %v", name, err)
		}
	}
}

func mustJS(tb testing.TB, nc *nats.Conn) jetstream.JetStream {
	tb.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return js
}

func second[A, B any](_ A, b B) B { return b }

// TestRoutesNeedTheSecret: a nats-server with no credential, and an
// embedded server with another secret, route to a cluster's server: the
// route is refused and logged, the stranger never sees the cluster's
// buckets, and no log line has the secret or a password derived from it.
func TestRoutesNeedTheSecret(t *testing.T) {
	logs := new(logBuffer)
	nodes := clustertest.StartClusterWith(t, 2, func(i int, cfg *embedded.Config) { cfg.Log = logs.logger() })
	nc, js := clustertest.ConnectNode(t, nodes[0])
	kv, err := js.CreateOrUpdateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "tether_sessions"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), "attach-token", []byte("the cluster's")); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	route := &url.URL{Scheme: "nats-route", Host: nodes[0].ClusterAddr().String()}

	otherSecret := []byte("another cluster's secret, 32 bytes or more")
	strangers := map[string]func(t *testing.T) (name, clientURL string, srv *server.Server){
		"no credential": func(t *testing.T) (string, string, *server.Server) {
			srv := startRogue(t, route, nil)
			return "rogue", srv.ClientURL(), srv
		},
		"another secret": func(t *testing.T) (string, string, *server.Server) {
			ctx, cancel := context.WithTimeout(t.Context(), clustertest.Timeout)
			defer cancel()
			e, err := embedded.Start(ctx, embedded.Config{Name: "other", StoreDir: t.TempDir(), ClusterListen: "127.0.0.1:0",
				Routes: []string{route.String()}, Secret: otherSecret, Log: zerolog.Nop()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(e.Shutdown)
			return "other", e.ClientURL(), e.Server()
		},
	}
	for name, start := range strangers {
		t.Run(name, func(t *testing.T) {
			before := strings.Count(logs.String(), "authentication error")
			sname, clientURL, srv := start(t)
			waitFor(t, "refused route logged", func() bool {
				return strings.Count(logs.String(), "authentication error") > before || routedTo(t, nodes[0].Server(), sname)
			})
			if routedTo(t, nodes[0].Server(), sname) || routedTo(t, nodes[1].Server(), sname) {
				t.Fatalf("a node routes the stranger")
			}
			// The stranger counts its route from the node's INFO until the
			// node's refusal arrives and closes it: it ends with none.
			waitFor(t, "the stranger's refused route closed", func() bool { return srv.NumRoutes() == 0 })
			// What the stranger's clients see: not the cluster's bucket.
			opts := []nats.Option{}
			if sname == "other" {
				opts = append(opts, nats.UserInfo(embedded.ClientUser, embedded.Derive(otherSecret, "client")))
			}
			snc, sjs := clustertest.Connect(t, clientURL, opts...)
			defer snc.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			if skv, err := sjs.KeyValue(ctx, "tether_sessions"); err == nil {
				e, err := skv.Get(ctx, "attach-token")
				t.Fatalf("the stranger's client reads the cluster's bucket: %v %v", e, err)
			}
		})
	}
	for _, secret := range []string{string(clustertest.Secret), embedded.Derive(clustertest.Secret, "client"), embedded.Derive(clustertest.Secret, "route"), embedded.Derive(otherSecret, "route")} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the log has a secret %q", secret)
		}
	}
	if !strings.Contains(logs.String(), "rid:") {
		t.Errorf("the refusals are not logged as routes' (rid):\n%s", logs.String())
	}
}

// TestRoutesMutualTLS: servers with TLS route with each other (mutual
// TLS, the cluster's CA); a server with the right route password but no
// client certificate, or one from another CA, is refused; clients must
// speak TLS, and one with the CA and the password gets in; the host's
// in-process connection needs no TLS and reaches a replicated bucket.
func TestRoutesMutualTLS(t *testing.T) {
	ca := certtest.NewCA(t, "cluster")
	logs := new(logBuffer)
	nodes := clustertest.StartClusterWith(t, 2, func(i int, cfg *embedded.Config) {
		cert, key := ca.Issue(t, fmt.Sprint("n", i))
		cfg.TLS = &embedded.TLSFiles{CA: ca.File, Cert: cert, Key: key}
		cfg.Log = logs.logger()
	})
	if !routedTo(t, nodes[0].Server(), "n1") {
		t.Fatal("n0 is not routed to n1")
	}
	routeWithPassword := &url.URL{Scheme: "nats-route", Host: nodes[0].ClusterAddr().String(),
		User: url.UserPassword(embedded.RouteUser, embedded.Derive(clustertest.Secret, "route"))}
	other := certtest.NewCA(t, "other")
	otherCert, otherKey := other.Issue(t, "rogue")
	otherPair, err := tls.LoadX509KeyPair(otherCert, otherKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, certs := range map[string][]tls.Certificate{"no client certificate": nil, "another CA's": {otherPair}} {
		t.Run(name, func(t *testing.T) {
			before := strings.Count(logs.String(), "TLS route handshake error")
			rogue := startRogue(t, routeWithPassword, func(o *server.Options) {
				o.Cluster.TLSConfig = &tls.Config{RootCAs: ca.Pool, Certificates: certs, MinVersion: tls.VersionTLS12}
			})
			waitFor(t, "refused TLS route logged", func() bool {
				return strings.Count(logs.String(), "TLS route handshake error") > before || rogue.NumRoutes() > 0
			})
			if routedTo(t, nodes[0].Server(), "rogue") || rogue.NumRoutes() != 0 {
				t.Fatal("the rogue is routed")
			}
		})
	}

	e := nodes[0]
	tlsURL := strings.Replace(e.ClientURL(), "nats://", "tls://", 1)
	if err := dial(e.ClientURL(), nats.UserInfo(embedded.ClientUser, embedded.ClientPass(e))); err == nil {
		t.Error("a client without TLS got in")
	}
	if err := dial(tlsURL, nats.RootCAs(ca.File)); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("a TLS client with no password: %v, want %v", err, nats.ErrAuthorization)
	}
	if err := dial(tlsURL, nats.RootCAs(other.File), nats.UserInfo(embedded.ClientUser, embedded.ClientPass(e))); err == nil {
		t.Error("a client that trusts another CA got in")
	}
	if err := dial(tlsURL, nats.RootCAs(ca.File), nats.UserInfo(embedded.ClientUser, embedded.ClientPass(e))); err != nil {
		t.Errorf("a TLS client with the CA and the password: %v", err)
	}
	// The host's own connection is in-process: no TLS, and it works.
	ctx, cancel := context.WithTimeout(t.Context(), clustertest.Timeout)
	defer cancel()
	nc, err := e.Connect(nats.Timeout(5 * time.Second))
	if err != nil {
		t.Fatalf("in-process connection to a TLS server: %v", err)
	}
	defer nc.Close()
	kv, err := mustJS(t, nc).CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "tether_sessions", Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

// TestStartEmbeddedRefusesAnOpenBus: routes need a secret of 32 bytes or
// more; an address off loopback needs TLS; credentials in a route URL are
// refused, and the error does not repeat them.
func TestStartEmbeddedRefusesAnOpenBus(t *testing.T) {
	ca := certtest.NewCA(t, "cluster")
	cert, key := ca.Issue(t, "n")
	tests := []struct {
		name string
		cfg  embedded.Config
		want error
	}{
		{"routes without a secret", embedded.Config{ClusterListen: "127.0.0.1:0"}, embedded.ErrNoSecret},
		{"a short secret", embedded.Config{Secret: []byte("short")}, embedded.ErrNoSecret},
		{"every interface", embedded.Config{Listen: "0.0.0.0:0", Secret: clustertest.Secret}, embedded.ErrNeedTLS},
		{"an empty host", embedded.Config{Listen: ":0", Secret: clustertest.Secret}, embedded.ErrNeedTLS},
		{"routes on every interface", embedded.Config{ClusterListen: "0.0.0.0:0", Secret: clustertest.Secret}, embedded.ErrNeedTLS},
		{"a route off loopback", embedded.Config{ClusterListen: "127.0.0.1:0", Routes: []string{"nats-route://192.0.2.1:6222"}, Secret: clustertest.Secret}, embedded.ErrNeedTLS},
		{"a route by name", embedded.Config{ClusterListen: "127.0.0.1:0", Routes: []string{"nats.example:6222"}, Secret: clustertest.Secret}, embedded.ErrNeedTLS},
		{"TLS without a CA", embedded.Config{Listen: "0.0.0.0:0", Secret: clustertest.Secret, TLS: &embedded.TLSFiles{Cert: cert, Key: key}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.StoreDir = t.TempDir()
			e, err := embedded.Start(t.Context(), tt.cfg)
			if err == nil {
				e.Shutdown()
				t.Fatal("started")
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("%v, want %v", err, tt.want)
			}
		})
	}
	_, err := embedded.Start(t.Context(), embedded.Config{StoreDir: t.TempDir(), ClusterListen: "127.0.0.1:0", Secret: clustertest.Secret,
		Routes: []string{"nats-route://u:hunter2hunter2@127.0.0.1:6222"}})
	if err == nil || !strings.Contains(err.Error(), "credentials in a route URL") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a route with credentials: %v, want it refused without them in the error", err)
	}
}

// TestDerive: the client and route passwords differ from each other, from
// the secret, and between secrets.
func TestDerive(t *testing.T) {
	a, b := embedded.Derive(clustertest.Secret, "client"), embedded.Derive(clustertest.Secret, "route")
	c := embedded.Derive([]byte("another cluster's secret, 32 bytes or more"), "client")
	if a == b || a == c || a == string(clustertest.Secret) || len(a) != 64 {
		t.Errorf("client %q, route %q, another secret's client %q", a, b, c)
	}
	if embedded.Derive(clustertest.Secret, "client") != a {
		t.Error("embedded.Derive is not a function of its arguments")
	}
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:4222":                      true,
		"127.3.2.1:4222":                      true,
		"[::1]:4222":                          true,
		"localhost:4222":                      true,
		"nats-route://127.0.0.1:6222":         true,
		"nats-route://[::1]:6222":             true,
		"0.0.0.0:4222":                        false,
		":4222":                               false,
		"[::]:4222":                           false,
		"10.0.0.1:4222":                       false,
		"nats.example:4222":                   false,
		"nats-route://10.0.0.2:6222":          false,
		"nats-route://localhost.example:6222": false,
		"":                                    false,
	} {
		if got := embedded.Loopback(addr); got != want {
			t.Errorf("embedded.Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestRedactURLs(t *testing.T) {
	got := embedded.RedactURLs([]string{"nats://a:4222", "nats://u:hunter2@a:4222", "tls://tok3n@b:4222", "u:hunter2@c:4222", "127.0.0.1:4222", "nats://%zz@a"})
	want := "nats://a:4222,nats://u:xxxxx@a:4222,tls://xxxxx@b:4222,xxxxx@c:4222,127.0.0.1:4222,(a URL that does not parse)"
	if got != want {
		t.Errorf("embedded.RedactURLs = %q, want %q", got, want)
	}
}

// writeFile writes a file of tb's with mode 0600 and returns its path.
func writeFile(tb testing.TB, name string, b []byte) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestCredentialsOptions: each kind of credential an external cluster
// takes gets a host in when it is the server's, and is refused with an
// authorization error when it is not; a TLS server is reached with its
// CA (and a client certificate when it asks for one), and not without.
func TestCredentialsOptions(t *testing.T) {
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	userSeed, _ := user.Seed()
	stranger, _ := nkeys.CreateUser()
	strangerSeed, _ := stranger.Seed()

	// Operator mode: an account the server trusts, a user it signed.
	operator, _ := nkeys.CreateOperator()
	opPub, _ := operator.PublicKey()
	opClaims := jwt.NewOperatorClaims(opPub)
	account, _ := nkeys.CreateAccount()
	accPub, _ := account.PublicKey()
	accJWT, err := jwt.NewAccountClaims(accPub).Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	creds := func(signer nkeys.KeyPair) []byte {
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		ujwt, err := jwt.NewUserClaims(pub).Encode(signer)
		if err != nil {
			t.Fatal(err)
		}
		b, err := jwt.FormatUserConfig(ujwt, seed)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	otherAccount, _ := nkeys.CreateAccount()

	tests := []struct {
		name        string
		server      func(*server.Options)
		good, wrong embedded.Credentials
	}{
		{"token", func(o *server.Options) { o.Authorization = "the-token" },
			embedded.Credentials{Token: "the-token"}, embedded.Credentials{Token: "a-guess"}},
		{"user and password", func(o *server.Options) { o.Username, o.Password = "host", "the-password" },
			embedded.Credentials{User: "host", Password: "the-password"}, embedded.Credentials{User: "host", Password: "a-guess"}},
		{"nkey", func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: userPub}} },
			embedded.Credentials{NkeyFile: writeFile(t, "user.nk", userSeed)}, embedded.Credentials{NkeyFile: writeFile(t, "stranger.nk", strangerSeed)}},
		{"creds", func(o *server.Options) {
			o.TrustedOperators = []*jwt.OperatorClaims{opClaims}
			r := &server.MemAccResolver{}
			if err := r.Store(accPub, accJWT); err != nil {
				t.Fatal(err)
			}
			o.AccountResolver = r
		}, embedded.Credentials{CredsFile: writeFile(t, "user.creds", creds(account))}, embedded.Credentials{CredsFile: writeFile(t, "stranger.creds", creds(otherAccount))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := clustertest.StartPlain(t, tt.server)
			opts, err := tt.good.Options(nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := dial(url, opts...); err != nil {
				t.Errorf("the server's credential: %v", err)
			}
			opts, err = tt.wrong.Options(nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := dial(url, opts...); !errors.Is(err, nats.ErrAuthorization) {
				t.Errorf("a wrong credential: %v, want %v", err, nats.ErrAuthorization)
			}
			if err := dial(url); !errors.Is(err, nats.ErrAuthorization) {
				t.Errorf("no credential: %v, want %v", err, nats.ErrAuthorization)
			}
		})
	}

	for _, bad := range []embedded.Credentials{{Token: "a", User: "u", Password: "p"}, {User: "u"}, {NkeyFile: writeFile(t, "not-a-seed", []byte("hello"))}} {
		if _, err := bad.Options(nil); err == nil {
			t.Errorf("Options(%+v): no error", bad)
		}
	}

	t.Run("TLS", func(t *testing.T) {
		ca := certtest.NewCA(t, "nats")
		cert, key := ca.Issue(t, "server")
		clientCert, clientKey := ca.Issue(t, "host")
		other := certtest.NewCA(t, "other")
		for _, verify := range []bool{false, true} {
			url := clustertest.StartPlain(t, func(o *server.Options) {
				tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cert, KeyFile: key, CaFile: ca.File, Verify: verify})
				if err != nil {
					t.Fatal(err)
				}
				o.TLSConfig, o.Authorization = tc, "the-token"
			})
			tok := embedded.Credentials{Token: "the-token"}
			try := func(files *embedded.TLSFiles) error {
				opts, err := tok.Options(files)
				if err != nil {
					return err
				}
				return dial(url, opts...)
			}
			withCert := &embedded.TLSFiles{CA: ca.File, Cert: clientCert, Key: clientKey}
			if err := try(withCert); err != nil {
				t.Errorf("verify %v: the CA and a client certificate: %v", verify, err)
			}
			if err := try(&embedded.TLSFiles{CA: ca.File}); (err == nil) == verify {
				t.Errorf("verify %v: no client certificate: %v", verify, err)
			}
			if err := try(&embedded.TLSFiles{CA: other.File, Cert: clientCert, Key: clientKey}); err == nil {
				t.Errorf("verify %v: trusting another CA: connected", verify)
			}
			if err := try(nil); err == nil {
				t.Errorf("verify %v: no TLS: connected", verify)
			}
		}
	})
}
