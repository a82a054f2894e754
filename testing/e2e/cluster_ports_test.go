package e2e_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
)

// TestClusterPortInUse: the embedded NATS server's client or route
// address taken by another process makes tether serve exit at once, with
// status 1 and one line that names the flag and the address and says it
// is in use, not after the 60 s join timeout; nats-server's own fatal
// line is not said as well.
func TestClusterPortInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	secret := clusterSecret(t)
	tests := []struct {
		name string
		args []string
		flag string
	}{
		{"client port", []string{"--cluster-listen", addr}, "--cluster-listen"},
		{"route port", []string{"--cluster-route-listen", addr, "--cluster-routes", "nats-route://" + addr}, "--cluster-route-listen"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			began := time.Now()
			_, stderr, code := e2e.Tether(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(),
				"--log-format", "json", "--cluster", "embedded", "--cluster-secret-file", secret}, tt.args...)...)
			took := time.Since(began)
			want := tt.flag + " " + addr + " is already in use"
			if code != 1 || took > 5*time.Second {
				t.Fatalf("exit %d after %v, want 1 within 5 s; stderr:\n%s", code, took, stderr)
			}
			var said []string
			for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
				if strings.Contains(line, `"level":"error"`) || strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"fatal"`) {
					said = append(said, line)
				}
			}
			if len(said) != 1 || !strings.Contains(said[0], want) || !strings.Contains(said[0], "address already in use") {
				t.Errorf("warnings and errors:\n%s\nwant one line saying %q", strings.Join(said, "\n"), want)
			}
			t.Logf("exit %d after %v: %s", code, took.Round(time.Millisecond), said)
		})
	}
}
