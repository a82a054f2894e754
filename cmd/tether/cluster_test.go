package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// TestClusterFlags: the cluster flags of tether serve become the host's
// cluster configuration, and each wrong combination is refused with what
// is wrong.
func TestClusterFlags(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string // "" for none
		check   func(t *testing.T, f *clusterFlags)
	}{
		{args: nil},
		{args: []string{"--cluster", "nats://a:4222,nats://b:4222", "--cluster", "nats://c:4222", "--host-id", "web-1"}},
		{args: []string{"--cluster", "embedded", "--cluster-listen", "127.0.0.1:4222", "--cluster-route-listen", "127.0.0.1:6222", "--cluster-routes", "nats-route://127.0.0.1:6222,nats-route://127.0.0.1:6223"}},
		{args: []string{"--cluster-listen", "127.0.0.1:4222"}, wantErr: "go with --cluster embedded"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-routes", "nats-route://x:1"}, wantErr: "go with --cluster embedded"},
		{args: []string{"--cluster", "embedded", "--cluster-routes", "nats-route://x:1"}, wantErr: "needs --cluster-route-listen"},
		{args: []string{"--cluster", "embedded,nats://a:4222"}, wantErr: "goes alone"},
		{args: []string{"--cluster", "a:4222"}, wantErr: "want nats://HOST:PORT"},
		{args: []string{"--cluster", "nats://a:4222", "--host-id", "a.b"}, wantErr: "letters, digits"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-ttl", "100ms"}, wantErr: "at least 300ms"},
		{args: []string{"--cluster", "nats://a:4222", "--cluster-replicas", "7"}, wantErr: "0 to 5"},
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
	_ = fs.Parse([]string{"--cluster", "nats://a:4222, nats://b:4222", "--cluster", "nats://c:4222", "--host-id", "web-1", "--cluster-ttl", "4s"})
	cc, err := f.config()
	if err != nil || strings.Join(cc.URLs, " ") != "nats://a:4222 nats://b:4222 nats://c:4222" || cc.HostID != "web-1" || cc.TTL.String() != "4s" || cc.Embedded {
		t.Errorf("config() = %+v, %v", cc, err)
	}
}
