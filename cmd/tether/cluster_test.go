package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/tether-agent/tether/testing/certtest"
)

// TestClusterFlags: the cluster flags of tether serve become the host's
// cluster configuration, and each wrong combination, and each credential
// file that cannot be used, is refused with what is wrong (and never with
// a credential in the message).
func TestClusterFlags(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	secretHex := strings.Repeat("5e", 32)
	secret := file("secret", secretHex+"\n", 0o600)
	readable := file("secret-0644", secretHex, 0o644)
	groupWritable := file("secret-0620", secretHex, 0o620)
	short := file("secret-short", "0123456789abcdef\n", 0o600)
	missing := filepath.Join(dir, "no-such-secret")
	token := file("token", "the-token\n", 0o600)
	empty := file("empty", "\n", 0o600)
	password := file("password", "pass word\n", 0o600)
	user, _ := nkeys.CreateUser()
	seed, _ := user.Seed()
	nkey := file("user.nk", string(seed), 0o600)
	notSeed := file("not-a-seed", "hello", 0o600)
	ca := certtest.NewCA(t, "cluster")
	cert, key := ca.Issue(t, "h1")
	tlsFlags := []string{"--cluster-tls-ca", ca.File, "--cluster-tls-cert", cert, "--cluster-tls-key", key}
	embedded := []string{"--cluster", "embedded", "--cluster-secret-file", secret}
	with := func(base []string, more ...string) []string { return append(append([]string{}, base...), more...) }

	tests := []struct {
		args    []string
		wantErr string // "" for none
	}{
		{args: nil},
		{args: []string{"--cluster", "nats://a:4222,nats://b:4222", "--cluster", "nats://c:4222", "--host-id", "web-1"}},
		{args: with(embedded, "--cluster-listen", "127.0.0.1:4222", "--cluster-route-listen", "127.0.0.1:6222", "--cluster-routes", "nats-route://127.0.0.1:6222,nats-route://localhost:6223")},
		{args: []string{"--cluster-listen", "127.0.0.1:4222"}, wantErr: "go with --cluster embedded"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-routes", "nats-route://x:1"}, wantErr: "go with --cluster embedded"},
		{args: with(embedded, "--cluster-routes", "nats-route://x:1"), wantErr: "needs --cluster-route-listen"},
		{args: []string{"--cluster", "embedded,nats://a:4222"}, wantErr: "goes alone"},
		{args: []string{"--cluster", "a:4222"}, wantErr: "want nats://HOST:PORT"},
		{args: []string{"--cluster", "nats://a:4222", "--host-id", "a.b"}, wantErr: "letters, digits"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-ttl", "100ms"}, wantErr: "at least 300ms"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-replicas", "7"}, wantErr: "0 to 5"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-join-timeout", "0s"}, wantErr: "want more than 0"},

		// The embedded cluster's secret.
		{args: []string{"--cluster", "embedded"}, wantErr: "needs --cluster-secret-file FILE, the cluster's shared secret: make one with (umask 077; tether cluster secret > FILE)"},
		{args: []string{"--cluster", "embedded", "--cluster-secret-file", missing}, wantErr: "no such file or directory (make one with (umask 077; tether cluster secret > FILE))"},
		{args: []string{"--cluster", "embedded", "--cluster-secret-file", readable}, wantErr: "mode 0644 lets other users read or change it: chmod 600"},
		{args: []string{"--cluster", "embedded", "--cluster-secret-file", groupWritable}, wantErr: "mode 0620"},
		{args: []string{"--cluster", "embedded", "--cluster-secret-file", short}, wantErr: "16 bytes, want at least 32"},
		{args: []string{"--cluster", "embedded", "--cluster-secret-file", dir}, wantErr: "not a regular file"},
		{args: with(embedded, "--cluster-token-file", token), wantErr: "--cluster-token-file goes with an external cluster"},
		{args: with(embedded, "--cluster-user", "u", "--cluster-password-file", password), wantErr: "--cluster-user goes with an external cluster"},
		{args: with(embedded, "--cluster-creds", token), wantErr: "--cluster-creds goes with an external cluster"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-secret-file", secret}, wantErr: "--cluster-secret-file goes with --cluster embedded"},
		{args: []string{"--cluster-secret-file", secret}, wantErr: "--cluster-secret-file goes with --cluster"},
		{args: []string{"--cluster-tls-ca", ca.File}, wantErr: "--cluster-tls-ca goes with --cluster"},

		// Off loopback, TLS.
		{args: with(embedded, "--cluster-listen", "0.0.0.0:0"), wantErr: "--cluster-listen 0.0.0.0:0 is not loopback: off loopback the cluster's bus needs --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca"},
		{args: with(embedded, "--cluster-listen", ":4222"), wantErr: "is not loopback"},
		{args: with(embedded, "--cluster-route-listen", "0.0.0.0:6222"), wantErr: "--cluster-route-listen 0.0.0.0:6222 is not loopback"},
		{args: with(embedded, "--cluster-route-listen", "127.0.0.1:6222", "--cluster-routes", "nats-route://10.0.0.2:6222"), wantErr: "--cluster-routes nats-route://10.0.0.2:6222 is not loopback"},
		{args: with(embedded, "--cluster-route-listen", "127.0.0.1:6222", "--cluster-routes", "nats-route://u:hunter2@127.0.0.1:6222"), wantErr: "nats-route://u:xxxxx@127.0.0.1:6222: no credentials in a route"},
		{args: with(with(embedded, tlsFlags...), "--cluster-listen", "0.0.0.0:0", "--cluster-route-listen", "0.0.0.0:0")},
		{args: with(embedded, "--cluster-tls-cert", cert, "--cluster-tls-key", key, "--cluster-listen", "0.0.0.0:0"), wantErr: "needs all three of --cluster-tls-ca, --cluster-tls-cert and --cluster-tls-key"},
		{args: with(embedded, "--cluster-tls-ca", ca.File, "--cluster-tls-cert", cert, "--cluster-tls-key", ca.File), wantErr: "cluster TLS"},
		{args: with(embedded, "--cluster-tls-ca", missing, "--cluster-tls-cert", cert, "--cluster-tls-key", key), wantErr: "--cluster-tls-ca: open " + missing},

		// An external cluster's credentials: from files only.
		{args: []string{"--cluster", "nats://u:hunter2@127.0.0.1:4222"}, wantErr: "--cluster nats://u:xxxxx@127.0.0.1:4222: credentials in a URL are seen by every user of the machine (ps): put the credentials in a file"},
		{args: []string{"--cluster", "nats://127.0.0.1:4222,tls://tok3n@127.0.0.1:4223"}, wantErr: "put the credentials in a file"},
		{args: []string{"--cluster", "u:hunter2@127.0.0.1:4222"}, wantErr: "xxxxx@127.0.0.1:4222: want nats://HOST:PORT"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-token-file", token}},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-user", "host", "--cluster-password-file", password}},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-nkey", nkey}},
		{args: append([]string{"--cluster", "tls://a:4222", "--cluster-token-file", token}, tlsFlags...)},
		{args: []string{"--cluster", "tls://a:4222", "--cluster-tls-ca", ca.File}},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-token-file", missing}, wantErr: "--cluster-token-file: open " + missing},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-token-file", empty}, wantErr: "empty"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-user", "host", "--cluster-password-file", missing}, wantErr: "--cluster-password-file: open " + missing},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-user", "host"}, wantErr: "--cluster-user and --cluster-password-file go together"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-password-file", password}, wantErr: "go together"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-token-file", token, "--cluster-nkey", nkey}, wantErr: "give one of"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-nkey", notSeed}, wantErr: "--cluster-nkey " + notSeed + ": not an nkey seed"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-nkey", missing}, wantErr: "--cluster-nkey: open " + missing},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-creds", notSeed}, wantErr: "not a NATS .creds file"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-creds", missing}, wantErr: "--cluster-creds: open " + missing},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-tls-cert", cert}, wantErr: "--cluster-tls-cert and --cluster-tls-key go together"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-tls-ca", notSeed}, wantErr: "cluster TLS"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			f := addClusterFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			cc, err := f.config()
			switch {
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("config() error %v, want one saying %q", err, tt.wantErr)
				}
				for _, s := range []string{"hunter2", "tok3n", secretHex, "the-token", "pass word"} {
					if strings.Contains(err.Error(), s) {
						t.Errorf("the error quotes a credential %q: %v", s, err)
					}
				}
			case err != nil:
				t.Fatalf("config(): %v", err)
			case len(tt.args) == 0 && cc != nil:
				t.Fatalf("no flags: %+v, want no cluster", cc)
			case len(tt.args) > 0 && cc == nil:
				t.Fatal("cluster flags gave no cluster")
			}
		})
	}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	f := addClusterFlags(fs)
	_ = fs.Parse([]string{"--cluster", "nats://a:4222, nats://b:4222", "--cluster", "nats://c:4222", "--host-id", "web-1", "--cluster-ttl", "4s",
		"--cluster-user", "host", "--cluster-password-file", password, "--cluster-join-timeout", "7s"})
	cc, err := f.config()
	if err != nil || strings.Join(cc.URLs, " ") != "nats://a:4222 nats://b:4222 nats://c:4222" || cc.HostID != "web-1" || cc.TTL.String() != "4s" || cc.Embedded ||
		cc.User != "host" || cc.PasswordFile != password || cc.JoinTimeout.String() != "7s" {
		t.Errorf("config() = %+v, %v", cc, err)
	}
}
