package link

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/wire"
)

// openingTransport opens one connection per secret on Link, then waits;
// Exec reports every close command it is given.
type openingTransport struct {
	contract.Transport
	secrets []string
	closes  chan contract.Command
}

func (o *openingTransport) Link(ctx context.Context, handle contract.EventSink) error {
	var evs []contract.Event
	for i, s := range o.secrets {
		evs = append(evs, contract.Event{Kind: contract.EventOpened, Conn: uint64(i + 1), Path: "/api/ws",
			Query: "token=" + s, Host: "127.0.0.1:7717", Remote: "127.0.0.1:50000"})
	}
	if err := handle(ctx, evs); err != nil {
		return err
	}
	<-ctx.Done()
	return ctx.Err()
}

func (o *openingTransport) Exec(_ context.Context, cmds []contract.Command) error {
	for _, c := range cmds {
		if c.Kind == contract.CommandClose {
			o.closes <- c
		}
	}
	return nil
}

type admitAll struct{}

func (a *admitAll) Open(o Opening) Conn {
	o.Out.Send(contract.Command{Kind: contract.CommandAdmit, Conn: o.ID.Conn})
	return nopConn{}
}

type nopConn struct{}

func (nopConn) OnFrame([]byte, bool) {}
func (nopConn) OnClosed()            {}

// TestSweepCutsRevokedAndExpired: a connection opened with a credential
// is closed 4401 "credential revoked" within a second of its revocation,
// one whose credential expires is closed 4401 "credential expired" at
// its expiry, and the access token's connection stays open.
func TestSweepCutsRevokedAndExpired(t *testing.T) {
	ctx := context.Background()
	book := adminBook(t)
	phone, phoneCred, err := book.Create(ctx, "phone", access.KindMade, []string{"session:k1:view"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	short, _, err := book.Create(ctx, "short", access.KindMade, nil, 400*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	tr := &openingTransport{secrets: []string{"admintoken", phone, short}, closes: make(chan contract.Command, 16)}
	l := New(Config{Name: "ws", Instance: "ws-1", Transport: tr, Log: zerolog.Nop(),
		Endpoints: map[string]Endpoint{"/api/ws": &admitAll{}},
		Access:    &access.Access{Book: book, Bound: "127.0.0.1:7717"}})
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Run(lctx) }()
	t.Cleanup(func() { cancel(); <-done })

	waitClose := func(what string, within time.Duration) contract.Command {
		t.Helper()
		select {
		case c := <-tr.closes:
			return c
		case <-time.After(within):
			t.Fatalf("%s: no close within %v", what, within)
		}
		return contract.Command{}
	}
	start := time.Now()
	c := waitClose("the short credential's expiry", 3*time.Second)
	if c.Conn != 3 || c.Code != wire.CloseUnauthorized || c.Reason != access.ReasonExpired {
		t.Fatalf("at expiry: close %+v, want conn 3 4401 %q", c, access.ReasonExpired)
	}
	if took := time.Since(start); took > 1400*time.Millisecond {
		t.Errorf("expired connection closed after %v, want within 1 s of its 400 ms expiry", took)
	}

	revoked := time.Now()
	if _, err := book.Revoke(ctx, phoneCred.ID); err != nil {
		t.Fatal(err)
	}
	c = waitClose("the revoked credential", time.Second)
	if c.Conn != 2 || c.Code != wire.CloseUnauthorized || c.Reason != access.ReasonRevoked {
		t.Fatalf("after revoke: close %+v, want conn 2 4401 %q", c, access.ReasonRevoked)
	}
	t.Logf("revoked → closed in %v", time.Since(revoked))

	// The access token's connection is not cut by another change.
	if _, _, err := book.Create(ctx, "another", access.KindMade, nil, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-tr.closes:
		t.Fatalf("a change of another credential closed %+v", c)
	case <-time.After(200 * time.Millisecond):
	}
}
