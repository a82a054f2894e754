package link

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
)

// admitRecorder opens its events' connections on Link, then waits;
// Exec reports every admit it is given.
type admitRecorder struct {
	contract.Transport
	evs    []contract.Event
	admits chan contract.Command
}

func (a *admitRecorder) Link(ctx context.Context, handle contract.EventSink) error {
	if err := handle(ctx, a.evs); err != nil {
		return err
	}
	<-ctx.Done()
	return ctx.Err()
}

func (a *admitRecorder) Exec(_ context.Context, cmds []contract.Command) error {
	for _, c := range cmds {
		if c.Kind == contract.CommandAdmit {
			a.admits <- c
		}
	}
	return nil
}

// TestAdmitCarriesProxyBinding: the Admit of a connection the reverse
// proxy's user header admitted names that header and the proxy's
// addresses (what binds the connection's later requests, for /acp over
// HTTP); the Admit of one a token admitted carries no header, also from
// the proxy's address.
func TestAdmitCarriesProxyBinding(t *testing.T) {
	ctx := context.Background()
	book := adminBook(t)
	proxy, err := access.NewProxy("X-Forwarded-User", []string{"127.0.0.1/32", "::1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := func(conn uint64, query string, hdr map[string][]string) contract.Event {
		return contract.Event{Kind: contract.EventOpened, Conn: conn, Path: "/acp", Query: query, Header: hdr,
			Host: "127.0.0.1:7717", Remote: "127.0.0.1:50000"}
	}
	tr := &admitRecorder{admits: make(chan contract.Command, 4), evs: []contract.Event{
		ev(1, "", map[string][]string{"X-Forwarded-User": {"alice"}}),
		ev(2, "token=admintoken", nil),
	}}
	l := New(Config{Name: "ws", Instance: "ws-1", Transport: tr, Log: zerolog.Nop(),
		Endpoints: map[string]Endpoint{"/acp": &admitAll{}},
		Access:    &access.Access{Book: book, Bound: "127.0.0.1:7717", Proxy: proxy}})
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Run(lctx) }()
	t.Cleanup(func() { cancel(); <-done })

	want := map[uint64]map[string][]string{
		1: {contract.AdmitBindHeader: {"X-Forwarded-User"}, contract.AdmitBindFrom: {"127.0.0.1/32", "::1/128"}},
		2: nil,
	}
	for range want {
		select {
		case c := <-tr.admits:
			if !reflect.DeepEqual(c.Header, want[c.Conn]) {
				t.Errorf("the Admit of conn %d: Header %v, want %v", c.Conn, c.Header, want[c.Conn])
			}
		case <-time.After(10 * time.Second):
			t.Fatal("an Admit did not come")
		}
	}
}
