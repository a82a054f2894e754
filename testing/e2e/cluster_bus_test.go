package e2e_test

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tether-agent/tether/testing/certtest"
	"github.com/tether-agent/tether/testing/e2e"
)

// The attacker of these tests is another local user: they can reach every
// loopback port (the embedded NATS server's client and route ports are
// found with ss -ltn), run a NATS client or a nats-server of their own,
// and start a tether host of their own; they cannot read the hosts' files.

// attackerDial connects to url as a stranger would, to that server alone
// and with no retry: its error is the server's answer.
func attackerDial(url string, opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect(url, append([]nats.Option{nats.Timeout(5 * time.Second), nats.NoReconnect(), nats.IgnoreDiscoveredServers()}, opts...)...)
}

// waitLog waits until the host's stderr has a line with every one of
// words, or fails the test after 15 s.
func waitLog(tb testing.TB, s *e2e.Server, words ...string) string {
	tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		for _, line := range strings.Split(s.Stderr.String(), "\n") {
			if !slices.ContainsFunc(words, func(w string) bool { return !strings.Contains(line, w) }) {
				return line
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("no log line with %q within 15s:\n%s", words, s.Stderr.Tail(40))
		}
		time.Sleep(50 * time.Millisecond) // polling the log
	}
}

// startRogueServer starts, in this test, a nats-server with JetStream of
// the attacker's that routes to route; adjust sets more options. It is
// shut down at the test's end.
func startRogueServer(tb testing.TB, route *url.URL, adjust func(*server.Options)) *server.Server {
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
	if !srv.ReadyForConnections(10 * time.Second) {
		tb.Fatal("rogue server not ready")
	}
	return srv
}

// cannotReadSessions fails tb if a client of srv can read the KV bucket
// tether_sessions.
func cannotReadSessions(tb testing.TB, srv *server.Server) {
	tb.Helper()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		tb.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if kv, err := js.KeyValue(ctx, "tether_sessions"); err == nil {
		keys, err := kv.ListKeys(ctx)
		tb.Fatalf("a client of the rogue server opens tether_sessions (keys %v, %v)", keys, err)
	}
}

// hostIDs lists the hosts cluster.hosts on h shows.
func hostIDs(tb testing.TB, h *clusterHost) []string {
	tb.Helper()
	var ids []string
	for _, row := range clusterHostsOf(tb, h.Dial(tb)).Hosts {
		ids = append(ids, row.ID)
	}
	slices.Sort(ids)
	return ids
}

// TestClusterBusRefusesStrangers: on a three-host cluster with a secret,
// with a session in tether_sessions: a NATS client with no credential, a
// guessed token or a guessed password is refused with an authorization
// error on a host's client port and on its route port (so it can neither
// read a bucket nor publish on tether.relay.<host>.in); a nats-server of
// the attacker's routed to a host's route port is refused, logged by the
// host, and its clients never see tether_sessions; a tether host with
// another secret never joins: it gives up at its join timeout, exit 1,
// saying why, and the cluster still has its three hosts.
func TestClusterBusRefusesStrangers(t *testing.T) {
	hosts := startCluster3(t)
	c := hosts[0].Dial(t)
	var created snapshot
	call(t, c, "session.create", map[string]any{"title": "secret prompt"}, &created)

	t.Run("client and route ports", func(t *testing.T) {
		for _, h := range hosts[:2] {
			for port, addr := range map[string]string{"client": h.Client, "route": h.Route} {
				for name, opts := range map[string][]nats.Option{
					"no credential":     nil,
					"a guessed token":   {nats.Token("guess")},
					"a guessed user":    {nats.UserInfo("tether-host", "guess")},
					"a route's user":    {nats.UserInfo("tether-route", "guess")},
					"the host id token": {nats.Token(h.ID)},
				} {
					nc, err := attackerDial("nats://"+addr, opts...)
					if err == nil {
						// What the attacker did on an open bus.
						perr := nc.Publish("tether.relay."+h.ID+".in", []byte("{}"))
						nc.Close()
						t.Fatalf("%s: %s port %s with %s: connected (publish: %v)", h.ID, port, addr, name, perr)
					}
					if !errors.Is(err, nats.ErrAuthorization) {
						t.Errorf("%s: %s port with %s: %v, want %v (not a timeout)", h.ID, port, name, err, nats.ErrAuthorization)
					}
				}
			}
		}
	})

	t.Run("rogue route", func(t *testing.T) {
		rogue := startRogueServer(t, &url.URL{Scheme: "nats-route", Host: hosts[0].Route}, nil)
		line := waitLog(t, hosts[0].Server, `"component":"nats"`, "rid:", "authentication error")
		t.Logf("h1 logged: %s", line)
		if n := rogue.NumRoutes(); n != 0 {
			t.Fatalf("the rogue server has %d routes", n)
		}
		cannotReadSessions(t, rogue)
	})

	t.Run("another secret", func(t *testing.T) {
		routes := []string{"nats-route://" + hosts[0].Route, "nats-route://" + hosts[1].Route, "nats-route://" + hosts[2].Route}
		own := freeAddrs(t, 1)[0]
		before := strings.Count(hosts[1].Stderr.String(), "authentication error")
		start := time.Now()
		_, stderr, code := e2e.Tether(t, "serve", "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--pty-command", "", "--log-format", "json",
			"--cluster", "embedded", "--cluster-secret-file", clusterSecret(t), "--host-id", "h4",
			"--cluster-route-listen", own, "--cluster-routes", strings.Join(append(routes, "nats-route://"+own), ","),
			"--cluster-join-timeout", "3s")
		took := time.Since(start)
		if code != 1 || !strings.Contains(stderr, "no route to another server was accepted") || !strings.Contains(stderr, "--cluster-secret-file") {
			t.Fatalf("a host with another secret: exit %d after %v, want 1 and why:\n%s", code, took, stderr)
		}
		if took > 20*time.Second {
			t.Errorf("a host with another secret gave up after %v, want about its 3 s join timeout", took)
		}
		if after := strings.Count(hosts[1].Stderr.String(), "authentication error"); after == before {
			t.Errorf("h2 logged no refused route of h4")
		}
		for _, h := range hosts {
			if ids := hostIDs(t, h); !slices.Equal(ids, []string{"h1", "h2", "h3"}) {
				t.Errorf("%s lists hosts %v, want h1 h2 h3", h.ID, ids)
			}
		}
	})

	// The cluster serves on: the session is still there, from h2.
	var resumed snapshot
	call(t, hosts[1].Dial(t), "session.resume", map[string]any{"session_id": created.SessionKey}, &resumed)
	if resumed.SessionID != created.SessionID {
		t.Fatalf("resume on h2: %s, want %s", resumed.SessionID, created.SessionID)
	}
	for _, h := range hosts {
		if secret, err := os.ReadFile(h.Args[slices.Index(h.Args, "--cluster-secret-file")+1]); err != nil || strings.Contains(h.Stderr.String(), strings.TrimSpace(string(secret))) {
			t.Errorf("%s: the log has the cluster secret (%v)", h.ID, err)
		}
	}
}

// TestClusterBusTLS: two hosts given the cluster's CA and a certificate
// each route with mutual TLS on loopback and share one table (a session
// made on h1 resumes on h2); their client ports speak TLS only and still
// need the secret's password; a nats-server that trusts the CA but has
// no client certificate, or one from another CA, is refused as a route
// (logged by the host).
func TestClusterBusTLS(t *testing.T) {
	ca := certtest.NewCA(t, "cluster")
	hosts := startClusterOf(t, 2, clusterSecret(t), func(i int) []string {
		cert, key := ca.Issue(t, fmt.Sprint("h", i+1))
		return []string{"--cluster-tls-ca", ca.File, "--cluster-tls-cert", cert, "--cluster-tls-key", key}
	})
	for _, h := range hosts {
		if ids := hostIDs(t, h); !slices.Equal(ids, []string{"h1", "h2"}) {
			t.Fatalf("%s lists hosts %v, want h1 h2", h.ID, ids)
		}
	}
	var created, resumed snapshot
	call(t, hosts[0].Dial(t), "session.create", map[string]any{"title": "over tls"}, &created)
	call(t, hosts[1].Dial(t), "session.resume", map[string]any{"session_id": created.SessionKey}, &resumed)
	if resumed.SessionID != created.SessionID {
		t.Fatalf("resume on h2: %s, want the live %s of h1", resumed.SessionID, created.SessionID)
	}

	// The client port: TLS only, and the password still.
	if nc, err := attackerDial("nats://" + hosts[0].Client); err == nil {
		nc.Close()
		t.Error("a client without TLS got in")
	}
	if nc, err := attackerDial("tls://"+hosts[0].Client, nats.RootCAs(ca.File)); !errors.Is(err, nats.ErrAuthorization) {
		if err == nil {
			nc.Close()
		}
		t.Errorf("a TLS client with no credential: %v, want %v", err, nats.ErrAuthorization)
	}

	other := certtest.NewCA(t, "other")
	otherCert, otherKey := other.Issue(t, "rogue")
	pair, err := tls.LoadX509KeyPair(otherCert, otherKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, certs := range map[string][]tls.Certificate{"no client certificate": nil, "another CA's": {pair}} {
		t.Run(name, func(t *testing.T) {
			before := strings.Count(hosts[0].Stderr.String(), "TLS route handshake error")
			rogue := startRogueServer(t, &url.URL{Scheme: "nats-route", Host: hosts[0].Route}, func(o *server.Options) {
				o.Cluster.TLSConfig = &tls.Config{RootCAs: ca.Pool, Certificates: certs, MinVersion: tls.VersionTLS12}
			})
			deadline := time.Now().Add(15 * time.Second)
			for strings.Count(hosts[0].Stderr.String(), "TLS route handshake error") == before {
				if time.Now().After(deadline) {
					t.Fatalf("h1 logged no refused TLS route:\n%s", hosts[0].Stderr.Tail(20))
				}
				time.Sleep(50 * time.Millisecond) // polling the log
			}
			if n := rogue.NumRoutes(); n != 0 {
				t.Fatalf("the rogue server has %d routes", n)
			}
			cannotReadSessions(t, rogue)
		})
	}
}

// TestClusterBusFlagsRefused: tether serve refuses, with exit 2 and a
// one-line reason, an embedded cluster with no secret file (saying how
// to make one), a secret file others may read, a client or route address
// off loopback without TLS, a --cluster URL with credentials (saying to
// put them in a file, without repeating them), and a credential file
// that is not there (naming it); a refused start leaves the state dir as
// it was.
func TestClusterBusFlagsRefused(t *testing.T) {
	secret := clusterSecret(t)
	readable := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(readable, []byte(strings.Repeat("ab", 32)), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "no-such-token")
	embedded := []string{"--cluster", "embedded", "--cluster-secret-file", secret}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no secret", []string{"--cluster", "embedded"}, "--cluster embedded needs --cluster-secret-file FILE, the cluster's shared secret: make one with (umask 077; tether cluster secret > FILE)"},
		{"a secret others may read", []string{"--cluster", "embedded", "--cluster-secret-file", readable}, "mode 0644 lets other users read or change it: chmod 600 " + readable},
		{"clients on every interface", slices.Concat(embedded, []string{"--cluster-listen", "0.0.0.0:0"}), "--cluster-listen 0.0.0.0:0 is not loopback: off loopback the cluster's bus needs --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca"},
		{"routes on every interface", slices.Concat(embedded, []string{"--cluster-route-listen", "0.0.0.0:0"}), "--cluster-route-listen 0.0.0.0:0 is not loopback"},
		{"credentials in the URL", []string{"--cluster", "nats://u:hunter2@127.0.0.1:4222"}, "put the credentials in a file"},
		{"a token file that is not there", []string{"--cluster", "nats://127.0.0.1:4222", "--cluster-token-file", missing}, "--cluster-token-file: open " + missing + ": no such file or directory"},
		{"a secret for an external cluster", []string{"--cluster", "nats://127.0.0.1:4222", "--cluster-secret-file", secret}, "--cluster-secret-file goes with --cluster embedded"},
		{"a token for an embedded cluster", slices.Concat(embedded, []string{"--cluster-token-file", secret}), "--cluster-token-file goes with an external cluster"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := t.TempDir()
			_, stderr, code := e2e.Tether(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", state}, tt.args...)...)
			if code != 2 || !strings.Contains(stderr, tt.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
				t.Fatalf("exit %d, stderr %q; want 2 and one line saying %q", code, stderr, tt.want)
			}
			if strings.Contains(stderr, "hunter2") {
				t.Errorf("the error repeats the password: %q", stderr)
			}
			if left, _ := os.ReadDir(state); len(left) != 0 {
				t.Errorf("a refused start left %v in the state dir", left)
			}
		})
	}
}

// TestClusterSecretCommand: tether cluster secret prints 64 hex digits
// (32 random bytes), a new one each run; into a file others may read it
// writes nothing and exits 1 saying how to make the file.
func TestClusterSecretCommand(t *testing.T) {
	seen := map[string]bool{}
	for range 3 {
		out, stderr, code := e2e.Tether(t, "cluster", "secret")
		s := strings.TrimSuffix(out, "\n")
		if b, err := hex.DecodeString(s); code != 0 || err != nil || len(b) != 32 || stderr != "" {
			t.Fatalf("tether cluster secret: exit %d, stdout %q, stderr %q; want 64 hex digits", code, out, stderr)
		}
		if seen[s] {
			t.Fatalf("tether cluster secret printed %s twice", s)
		}
		seen[s] = true
	}
	path := filepath.Join(t.TempDir(), "secret")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Chmod(0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	cmd := exec.Command(e2e.Build(t), "cluster", "secret")
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = f, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), "(umask 077; tether cluster secret > FILE)") {
		t.Fatalf("into a file of mode 0644: %v, stderr %q; want exit 1 saying how", err, stderr.String())
	}
	if b, _ := os.ReadFile(path); len(b) != 0 {
		t.Errorf("wrote %q into a file others may read", b)
	}
}

// startExternalNATS starts, in this test, a JetStream nats-server with
// the authorization adjust sets, for hosts of an external cluster, and
// returns its URL.
func startExternalNATS(tb testing.TB, adjust func(*server.Options)) string {
	tb.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: tb.TempDir(), NoSigs: true}
	adjust(opts)
	srv, err := server.NewServer(opts)
	if err != nil {
		tb.Fatal(err)
	}
	srv.Start()
	tb.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	if !srv.ReadyForConnections(10 * time.Second) {
		tb.Fatal("nats server not ready")
	}
	return srv.ClientURL()
}

// TestClusterExternalCredentials: a host of an external cluster whose
// NATS server takes a token, or a user and password, joins with them from
// files (and never logs them); with a wrong one, or none, it fails at
// once (exit 1) saying its credentials were refused. A server that takes
// anyone is joined with a warning that says what that means.
func TestClusterExternalCredentials(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name        string
		server      func(*server.Options)
		good, wrong []string
		secret      string
	}{
		{"token", func(o *server.Options) { o.Authorization = "the-token-42" },
			[]string{"--cluster-token-file", file("token", "the-token-42")}, []string{"--cluster-token-file", file("guess", "a-guess")}, "the-token-42"},
		{"user and password", func(o *server.Options) { o.Username, o.Password = "tether", "the-password-42" },
			[]string{"--cluster-user", "tether", "--cluster-password-file", file("password", "the-password-42")},
			[]string{"--cluster-user", "tether", "--cluster-password-file", file("guessed-password", "a-guess")}, "the-password-42"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := startExternalNATS(t, tt.server)
			base := []string{"--cluster", url, "--host-id", "x1", "--pty-command", ""}
			s := e2e.Start(t, e2e.Config{Args: slices.Concat(base, tt.good)})
			hs := clusterHostsOf(t, s.Dial(t))
			if !hs.Cluster || len(hs.Hosts) != 1 || hs.Hosts[0].ID != "x1" {
				t.Fatalf("cluster.hosts %+v, want x1 in a cluster", hs)
			}
			if strings.Contains(s.Stderr.String(), tt.secret) || strings.Contains(s.Stderr.String(), "no credential") {
				t.Errorf("the log has the credential, or says there is none:\n%s", s.Stderr.Tail(40))
			}
			for name, args := range map[string][]string{"a wrong credential": tt.wrong, "no credential": nil} {
				start := time.Now()
				_, stderr, code := e2e.Tether(t, slices.Concat([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--log-format", "json"}, base, args)...)
				if code != 1 || !strings.Contains(stderr, "the NATS server refused this host's credentials") || !strings.Contains(strings.ToLower(stderr), "authorization violation") {
					t.Errorf("%s: exit %d, stderr:\n%s\nwant 1 and the refusal", name, code, stderr)
				}
				if took := time.Since(start); took > 15*time.Second {
					t.Errorf("%s: refused after %v, want at once", name, took)
				}
			}
		})
	}
	t.Run("a server that takes anyone", func(t *testing.T) {
		url := startExternalNATS(t, func(*server.Options) {})
		s := e2e.Start(t, e2e.Config{Args: []string{"--cluster", url, "--pty-command", ""}})
		waitLog(t, s, `"level":"warn"`, "with no credential: whoever can reach it can read every session and reach every PTY")
	})
}
