package supervise

import (
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
)

// TestStartRequest: a transport process is started with the host's
// transport settings whole, page auth on, and TLS only on the primary
// transport (the public listener).
func TestStartRequest(t *testing.T) {
	s := TransportSettings{MaxConnections: 7, TLSCert: "c.pem", TLSKey: "k.pem", PingInterval: time.Second, PeerTimeout: 2 * time.Second}
	for _, tt := range []struct {
		name string
		want contract.StartRequest
	}{
		{PrimaryTransport, contract.StartRequest{Instance: "i1", Listen: "fd:3", PingInterval: time.Second, PeerTimeout: 2 * time.Second,
			MaxConnections: 7, TLSCertFile: "c.pem", TLSKeyFile: "k.pem", PageAuth: true}},
		{"side", contract.StartRequest{Instance: "i1", Listen: "fd:3", PingInterval: time.Second, PeerTimeout: 2 * time.Second,
			MaxConnections: 7, PageAuth: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := s.startRequest(tt.name, "i1", "fd:3"); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}
