package ptyroute

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/metrics"
)

// farRemote places every PTY on host "far" and records the legs dialled.
type farRemote struct {
	mu    sync.Mutex
	query []string
	who   []access.Identity
	dials chan struct{}
}

func (f *farRemote) Locate(context.Context, string) (string, string, error) {
	return "far", "far-1", nil
}

func (f *farRemote) Dial(_ context.Context, _, _, query string, who access.Identity, _ func(contract.Command)) (Leg, error) {
	f.mu.Lock()
	f.query = append(f.query, query)
	f.who = append(f.who, who)
	f.mu.Unlock()
	f.dials <- struct{}{}
	return nopLeg{}, nil
}

type nopLeg struct{}

func (nopLeg) Send([]byte, bool) error { return nil }
func (nopLeg) Close()                  {}

// TestRelayedSocketCarriesIdentityNotToken: a socket whose PTY is on
// another host is relayed with the identity this host verified, and its
// query without the credential it came with (the far host must never
// receive this host's access token), its cursor kept.
func TestRelayedSocketCarriesIdentityNotToken(t *testing.T) {
	r := New(zerolog.Nop(), metrics.New(), 0, 0)
	rem := &farRemote{dials: make(chan struct{}, 1)}
	r.SetRemote(rem)
	tok := strings.Repeat("a", 16)
	who := access.Identity{Name: "alice", Scopes: []string{"pty:" + tok}, Credential: "c-1"}
	raw := "token=SECRET&attach=" + tok + "&offset=42&epoch=e1&view=1"
	c := r.Open(link.Opening{
		ID: contract.TransportID{Instance: "ws", Conn: 1}, Transport: "ws",
		Event: &contract.Event{Kind: contract.EventOpened, Path: "/api/pty", Query: raw},
		Out:   &stuckSender{}, Who: who,
	})
	if c == nil {
		t.Fatal("Open refused the socket")
	}
	select {
	case <-rem.dials:
	case <-time.After(10 * time.Second):
		t.Fatal("no leg dialled")
	}
	rem.mu.Lock()
	q, got := rem.query[0], rem.who[0]
	rem.mu.Unlock()
	if strings.Contains(q, "SECRET") || strings.Contains(q, "token") {
		t.Errorf("relayed query %q carries the credential", q)
	}
	v, _ := url.ParseQuery(q)
	if v.Get("attach") != tok || v.Get("offset") != "42" || v.Get("epoch") != "e1" || v.Get("view") != "1" {
		t.Errorf("relayed query %q lost the cursor or the view flag", q)
	}
	if got.Name != who.Name || got.Credential != who.Credential || len(got.Scopes) != 1 || got.Scopes[0] != who.Scopes[0] {
		t.Errorf("leg dialled as %+v, want %+v", got, who)
	}
	c.OnClosed()
	r.Wait()
}

// TestRelayedSocketCarriesSize: a writer's size goes along the leg to
// the PTY's host; one over this host's largest does not.
func TestRelayedSocketCarriesSize(t *testing.T) {
	tok := strings.Repeat("a", 16)
	for query, want := range map[string]string{
		"attach=" + tok + "&cols=100&rows=30":  "100x30",
		"attach=" + tok + "&cols=1001&rows=30": "x",
	} {
		r := New(zerolog.Nop(), metrics.New(), 0, 0)
		rem := &farRemote{dials: make(chan struct{}, 1)}
		r.SetRemote(rem)
		c := r.Open(link.Opening{
			ID: contract.TransportID{Instance: "ws", Conn: 1}, Transport: "ws",
			Event: &contract.Event{Kind: contract.EventOpened, Path: "/api/pty", Query: query},
			Out:   &stuckSender{}, Who: adminWho,
		})
		select {
		case <-rem.dials:
		case <-time.After(10 * time.Second):
			t.Fatal("no leg dialled")
		}
		rem.mu.Lock()
		v, _ := url.ParseQuery(rem.query[0])
		rem.mu.Unlock()
		if got := v.Get("cols") + "x" + v.Get("rows"); got != want {
			t.Errorf("%s: relayed query %s carries size %q, want %q", query, v.Encode(), got, want)
		}
		c.OnClosed()
		r.Wait()
	}
}
