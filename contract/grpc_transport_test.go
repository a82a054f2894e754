package contract_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// wait bounds every wait in these tests; nothing should take close to it.
const wait = 10 * time.Second

// fakeTransport is an in-memory Transport. Its Link emits the batches the
// test sends on events until ctx is done, events is closed or Stop is
// called; Exec records commands.
type fakeTransport struct {
	events   chan []contract.Event
	startErr error // returned by Start
	execErr  error // returned by Exec

	stopOnce sync.Once
	stopped  chan struct{} // closed by Stop
	execd    chan struct{} // one value per Exec call
	linkDone chan error    // what each Link returned

	mu     sync.Mutex // guards the fields below
	linked bool
	starts []contract.StartRequest
	cmds   []contract.Command
	stops  []contract.StopRequest
}

var _ contract.Transport = (*fakeTransport)(nil)

func newFakeTransport() *fakeTransport {
	return &fakeTransport{
		events:   make(chan []contract.Event),
		stopped:  make(chan struct{}),
		execd:    make(chan struct{}, 1024),
		linkDone: make(chan error, 16),
	}
}

func (f *fakeTransport) Start(_ context.Context, req contract.StartRequest) (contract.StartResponse, error) {
	f.mu.Lock()
	f.starts = append(f.starts, req)
	f.mu.Unlock()
	if f.startErr != nil {
		return contract.StartResponse{}, f.startErr
	}
	return contract.StartResponse{Addr: "127.0.0.1:4242", Version: "fake/1", MaxConnections: 20000}, nil
}

func (f *fakeTransport) Link(ctx context.Context, sink contract.EventSink) (err error) {
	f.mu.Lock()
	if f.linked {
		f.mu.Unlock()
		return contract.ErrAlreadyLinked
	}
	f.linked = true
	f.mu.Unlock()
	defer func() { f.linkDone <- err }()

	for {
		select {
		case batch, ok := <-f.events:
			if !ok {
				return nil
			}
			if err := sink(ctx, batch); err != nil {
				return err
			}
		case <-f.stopped:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (f *fakeTransport) Exec(_ context.Context, cmds []contract.Command) error {
	f.mu.Lock()
	for _, c := range cmds {
		c.Data = bytes.Clone(c.Data)
		f.cmds = append(f.cmds, c)
	}
	f.mu.Unlock()
	f.execd <- struct{}{}
	return f.execErr
}

func (f *fakeTransport) Stop(_ context.Context, req contract.StopRequest) error {
	f.mu.Lock()
	f.stops = append(f.stops, req)
	f.mu.Unlock()
	f.stopOnce.Do(func() { close(f.stopped) })
	return nil
}

// commands returns a copy of the commands Exec has recorded.
func (f *fakeTransport) commands() []contract.Command {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]contract.Command(nil), f.cmds...)
}

// waitExec waits for n more Exec calls to have reached the fake.
func (f *fakeTransport) waitExec(t testing.TB, n int) {
	t.Helper()
	timeout := time.After(wait)
	for i := range n {
		select {
		case <-f.execd:
		case <-timeout:
			t.Fatalf("only %d of %d Exec calls reached the plugin", i, n)
		}
	}
}

// waitLinkDone waits for the fake's Link to return and returns its error.
func (f *fakeTransport) waitLinkDone(t testing.TB) error {
	t.Helper()
	select {
	case err := <-f.linkDone:
		return err
	case <-time.After(wait):
		t.Fatal("the plugin's Link did not return")
		return nil
	}
}

// newClient serves fake over an in-memory go-plugin gRPC connection and
// returns the host's client for it.
func newClient(t testing.TB, fake *fakeTransport) *contract.TransportGRPCClient {
	t.Helper()
	return newClientFor(t, fake)
}

// newClientFor serves impl over an in-memory gRPC connection and returns
// the host's client of it.
func newClientFor(t testing.TB, impl contract.Transport) *contract.TransportGRPCClient {
	t.Helper()
	// The client's Close stops the server too (go-plugin's controller
	// Shutdown); stopping the server here as well would race with that.
	client, _ := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		contract.KindTransport: &contract.TransportPlugin{Impl: impl},
	})
	t.Cleanup(func() { client.Close() })
	raw, err := client.Dispense(contract.KindTransport)
	if err != nil {
		t.Fatalf("Dispense(%q): %v", contract.KindTransport, err)
	}
	tc, ok := raw.(*contract.TransportGRPCClient)
	if !ok {
		t.Fatalf("Dispense(%q) = %T, want *contract.TransportGRPCClient", contract.KindTransport, raw)
	}
	return tc
}

// link runs tc.Link in the background. The sink copies each batch to
// batches and returns sinkErr.
type link struct {
	batches  <-chan []contract.Event
	cancel   context.CancelFunc
	finished chan struct{} // closed when Link has returned
	err      error         // what Link returned; read after finished
}

func startLink(t testing.TB, tc *contract.TransportGRPCClient, sinkErr error) *link {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	batches := make(chan []contract.Event, 64)
	l := &link{batches: batches, cancel: cancel, finished: make(chan struct{})}
	go func() {
		defer close(l.finished)
		l.err = tc.Link(ctx, func(_ context.Context, events []contract.Event) error {
			batches <- append([]contract.Event(nil), events...)
			return sinkErr
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-l.finished:
		case <-time.After(wait):
			t.Error("Link did not return after its context was cancelled")
		}
	})
	return l
}

// result waits for Link to return and returns its error.
func (l *link) result(t testing.TB) error {
	t.Helper()
	select {
	case <-l.finished:
		return l.err
	case <-time.After(wait):
		t.Fatal("Link did not return")
		return nil
	}
}

// next waits for the next batch at the sink.
func (l *link) next(t testing.TB) []contract.Event {
	t.Helper()
	select {
	case b := <-l.batches:
		return b
	case <-time.After(wait):
		t.Fatal("no event batch arrived at the sink")
		return nil
	}
}

// emit hands one batch to the fake's Link.
func emit(t testing.TB, fake *fakeTransport, batch []contract.Event) {
	t.Helper()
	select {
	case fake.events <- batch:
	case <-time.After(wait):
		t.Fatal("the plugin's Link did not take the batch")
	}
}

// normalEvent maps an empty payload to nil: protobuf does not tell them
// apart.
func normalEvent(e contract.Event) contract.Event {
	if len(e.Data) == 0 {
		e.Data = nil
	}
	return e
}

func normalCommand(c contract.Command) contract.Command {
	if len(c.Data) == 0 {
		c.Data = nil
	}
	return c
}

func TestGRPCTransportStart(t *testing.T) {
	fake := newFakeTransport()
	tc := newClient(t, fake)

	req := contract.StartRequest{
		Instance:     "0123456789abcdef",
		Listen:       "127.0.0.1:0",
		PingInterval: 20 * time.Second,
		PeerTimeout:  1500 * time.Millisecond,
		MaxMessage:   1 << 20,
		SendQueue:    8 << 20,

		MaxConnections: 50,
		HeaderTimeout:  300 * time.Millisecond,
		TLSCertFile:    "/etc/tether/cert.pem",
		TLSKeyFile:     "/etc/tether/key.pem",
		PageAuth:       true,
	}
	resp, err := tc.Start(context.Background(), req)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if want := (contract.StartResponse{Addr: "127.0.0.1:4242", Version: "fake/1", MaxConnections: 20000}); resp != want {
		t.Errorf("Start response = %+v, want %+v", resp, want)
	}
	fake.mu.Lock()
	starts := fake.starts
	fake.mu.Unlock()
	if len(starts) != 1 {
		t.Fatalf("plugin saw %d Start calls, want 1", len(starts))
	}
	if starts[0] != req {
		t.Errorf("plugin got StartRequest %+v, want %+v", starts[0], req)
	}
}

// TestGRPCTransportStartZero checks that a StartRequest with only the
// old fields set arrives with the new ones zero: no page gate, default
// limits.
func TestGRPCTransportStartZero(t *testing.T) {
	fake := newFakeTransport()
	tc := newClient(t, fake)
	req := contract.StartRequest{Instance: "i", Listen: "fd:3"}
	if _, err := tc.Start(context.Background(), req); err != nil {
		t.Fatalf("Start: %v", err)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.starts) != 1 || fake.starts[0] != req {
		t.Errorf("plugin got %+v, want [%+v]", fake.starts, req)
	}
}

// statsTransport is a fakeTransport that reports counters.
type statsTransport struct {
	*fakeTransport
	stats contract.TransportStats
	err   error
}

func (s *statsTransport) Stats(context.Context) (contract.TransportStats, error) {
	return s.stats, s.err
}

func TestGRPCTransportStats(t *testing.T) {
	t.Run("reported", func(t *testing.T) {
		want := contract.TransportStats{Connections: 49, Refused503: 1 << 40}
		tc := newClientFor(t, &statsTransport{fakeTransport: newFakeTransport(), stats: want})
		got, err := tc.Stats(context.Background())
		if err != nil {
			t.Fatalf("Stats: got error %v, want nil", err)
		}
		if got != want {
			t.Errorf("Stats: got %+v, want %+v", got, want)
		}
	})
	t.Run("error", func(t *testing.T) {
		tc := newClientFor(t, &statsTransport{
			fakeTransport: newFakeTransport(),
			err:           fmt.Errorf("stats: %w", contract.ErrNotStarted),
		})
		if _, err := tc.Stats(context.Background()); !errors.Is(err, contract.ErrNotStarted) {
			t.Errorf("Stats: got error %v, want one matching ErrNotStarted", err)
		}
	})
	t.Run("unsupported", func(t *testing.T) {
		tc := newClient(t, newFakeTransport()) // no Stats method
		_, err := tc.Stats(context.Background())
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("Stats: got error %v, want one matching errors.ErrUnsupported", err)
		}
	})
}

func TestGRPCTransportStartError(t *testing.T) {
	fake := newFakeTransport()
	fake.startErr = fmt.Errorf("bad listen: %w", contract.ErrInvalidArgument)
	tc := newClient(t, fake)

	_, err := tc.Start(context.Background(), contract.StartRequest{Listen: "nope"})
	if !errors.Is(err, contract.ErrInvalidArgument) {
		t.Fatalf("Start error = %v, want one matching ErrInvalidArgument", err)
	}
	if !strings.Contains(err.Error(), "bad listen") {
		t.Errorf("Start error = %q, want it to keep the plugin's message %q", err, "bad listen")
	}
}

func TestGRPCTransportEvents(t *testing.T) { bothLinks(t, testLinkEvents) }

func testLinkEvents(t *testing.T, newClient func(testing.TB, *fakeTransport) *contract.TransportGRPCClient) {
	fake := newFakeTransport()
	tc := newClient(t, fake)
	l := startLink(t, tc, nil)

	batches := [][]contract.Event{
		{{
			Kind:  contract.EventOpened,
			Conn:  1,
			Path:  "/api/ws",
			Query: "token=abc&x=%20y",
			Header: map[string][]string{
				"Origin":                 {"http://127.0.0.1:8080"},
				"Sec-Websocket-Protocol": {"a", "b"},
				"X-Empty":                {""},
			},
			Remote: "127.0.0.1:53412",
			Host:   "127.0.0.1:8080",
		}},
		{
			{Kind: contract.EventFrame, Conn: 1, Data: []byte(`{"jsonrpc":"2.0"}`)},
			{Kind: contract.EventFrame, Conn: 1, Binary: true, Data: []byte{0x00, 0xff, 0x00, 0x80, '\n'}},
			{Kind: contract.EventFrame, Conn: 1, Data: []byte{}},
			{Kind: contract.EventOpened, Conn: 2, Path: "/api/pty", Remote: "[::1]:1"},
			{Kind: contract.EventFrame, Conn: 2, Binary: true, Data: bytes.Repeat([]byte{0xab}, 64<<10)},
			{Kind: contract.EventOpened, Conn: 3, Path: "/", Query: "token=t", Remote: "127.0.0.1:2", Page: true},
		},
		{
			{Kind: contract.EventClosed, Conn: 1, Code: wire.CloseAbnormal},
			{Kind: contract.EventClosed, Conn: 2, Code: wire.CloseSuperseded, Reason: "superseded"},
		},
	}
	for _, b := range batches {
		emit(t, fake, b)
	}
	for i, want := range batches {
		got := l.next(t)
		if len(got) != len(want) {
			t.Fatalf("batch %d: got %d events, want %d", i, len(got), len(want))
		}
		for j := range want {
			if g, w := normalEvent(got[j]), normalEvent(want[j]); !reflect.DeepEqual(g, w) {
				t.Errorf("batch %d event %d:\ngot  %+v\nwant %+v", i, j, g, w)
			}
		}
	}
}

func TestGRPCTransportHeaderKeysCanonical(t *testing.T) { bothLinks(t, testLinkHeaderKeysCanonical) }

func testLinkHeaderKeysCanonical(t *testing.T, newClient func(testing.TB, *fakeTransport) *contract.TransportGRPCClient) {
	fake := newFakeTransport()
	tc := newClient(t, fake)
	l := startLink(t, tc, nil)

	emit(t, fake, []contract.Event{{
		Kind:   contract.EventOpened,
		Conn:   1,
		Header: map[string][]string{"x-forwarded-for": {"10.0.0.1"}},
	}})
	got := l.next(t)
	want := map[string][]string{"X-Forwarded-For": {"10.0.0.1"}}
	if len(got) != 1 || !reflect.DeepEqual(got[0].Header, want) {
		t.Errorf("got events %+v, want one with Header %v", got, want)
	}
}

func TestGRPCTransportCommands(t *testing.T) { bothLinks(t, testLinkCommands) }

func testLinkCommands(t *testing.T, newClient func(testing.TB, *fakeTransport) *contract.TransportGRPCClient) {
	fake := newFakeTransport()
	tc := newClient(t, fake)
	startLink(t, tc, nil)

	batches := [][]contract.Command{
		{{Kind: contract.CommandAdmit, Conn: 1}},
		{
			{Kind: contract.CommandSend, Conn: 1, Data: []byte(`{"id":1}`)},
			{Kind: contract.CommandSend, Conn: 1, Binary: true, Data: []byte{0x00, 0xff, 0x01}},
			{Kind: contract.CommandSend, Conn: 1, Data: []byte{}},
			{Kind: contract.CommandAdmit, Conn: 1<<64 - 1},
		},
		{{Kind: contract.CommandClose, Conn: 1, Code: wire.CloseServiceRestart, Reason: "plugin swap"}},
		{{Kind: contract.CommandAdmit, Conn: 3, Header: map[string][]string{"Set-Cookie": {"a=b; Path=/", "c=; Max-Age=0"}}}},
	}
	var want []contract.Command
	for _, b := range batches {
		if err := tc.Exec(context.Background(), b); err != nil {
			t.Fatalf("Exec(%+v): %v", b, err)
		}
		want = append(want, b...)
	}
	fake.waitExec(t, len(batches))

	got := fake.commands()
	if len(got) != len(want) {
		t.Fatalf("plugin got %d commands, want %d", len(got), len(want))
	}
	for i := range want {
		if g, w := normalCommand(got[i]), normalCommand(want[i]); !reflect.DeepEqual(g, w) {
			t.Errorf("command %d:\ngot  %+v\nwant %+v", i, g, w)
		}
	}
}

func TestGRPCTransportConcurrentExec(t *testing.T) { bothLinks(t, testLinkConcurrentExec) }

func testLinkConcurrentExec(t *testing.T, newClient func(testing.TB, *fakeTransport) *contract.TransportGRPCClient) {
	// Exec is called from many goroutines; each one's commands arrive in
	// the order it sent them.
	fake := newFakeTransport()
	tc := newClient(t, fake)
	startLink(t, tc, nil)

	const senders, perSender = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, senders*perSender)
	for conn := range uint64(senders) {
		wg.Go(func() {
			for i := range perSender {
				cmd := contract.Command{Kind: contract.CommandSend, Conn: conn, Data: []byte(fmt.Sprint(i))}
				if err := tc.Exec(context.Background(), []contract.Command{cmd}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Exec: %v", err)
	}
	fake.waitExec(t, senders*perSender)

	next := make(map[uint64]int)
	for _, c := range fake.commands() {
		if want := fmt.Sprint(next[c.Conn]); string(c.Data) != want {
			t.Errorf("conn %d: got command %q, want %q", c.Conn, c.Data, want)
		}
		next[c.Conn]++
	}
	for conn := range uint64(senders) {
		if next[conn] != perSender {
			t.Errorf("conn %d: plugin got %d commands, want %d", conn, next[conn], perSender)
		}
	}
}

func TestGRPCTransportExecWaitsForLink(t *testing.T) { bothLinks(t, testLinkExecWaitsForLink) }

func testLinkExecWaitsForLink(t *testing.T, newClient func(testing.TB, *fakeTransport) *contract.TransportGRPCClient) {
	fake := newFakeTransport()
	tc := newClient(t, fake)

	cmd := contract.Command{Kind: contract.CommandAdmit, Conn: 7}
	execDone := make(chan error, 1)
	go func() { execDone <- tc.Exec(context.Background(), []contract.Command{cmd}) }()

	select {
	case err := <-execDone:
		t.Fatalf("Exec before Link returned %v, want it to wait for Link", err)
	case <-time.After(50 * time.Millisecond):
	}

	startLink(t, tc, nil)
	select {
	case err := <-execDone:
		if err != nil {
			t.Fatalf("Exec: %v", err)
		}
	case <-time.After(wait):
		t.Fatal("Exec did not return after Link started")
	}
	fake.waitExec(t, 1)
	if got := fake.commands(); len(got) != 1 || !reflect.DeepEqual(got[0], cmd) {
		t.Errorf("plugin got commands %+v, want [%+v]", got, cmd)
	}
}

func TestGRPCTransportExecContextEndsBeforeLink(t *testing.T) {
	bothLinks(t, testLinkExecContextEndsBeforeLink)
}

func testLinkExecContextEndsBeforeLink(t *testing.T, newClient func(testing.TB, *fakeTransport) *contract.TransportGRPCClient) {
	fake := newFakeTransport()
	tc := newClient(t, fake)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := tc.Exec(ctx, []contract.Command{{Kind: contract.CommandAdmit, Conn: 1}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Exec with no Link = %v, want context.DeadlineExceeded", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	err = tc.Exec(ctx, []contract.Command{{Kind: contract.CommandAdmit, Conn: 1}})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Exec with no Link and a cancelled context = %v, want context.Canceled", err)
	}
	if got := fake.commands(); len(got) != 0 {
		t.Errorf("plugin got commands %+v, want none", got)
	}
}

func TestGRPCTransportSecondLink(t *testing.T) { bothLinks(t, testLinkSecondLink) }

func testLinkSecondLink(t *testing.T, newClient func(testing.TB, *fakeTransport) *contract.TransportGRPCClient) {
	fake := newFakeTransport()
	tc := newClient(t, fake)
	l := startLink(t, tc, nil)

	// Once an Exec has gone out, the first link's stream is open.
	if err := tc.Exec(context.Background(), []contract.Command{{Kind: contract.CommandAdmit, Conn: 1}}); err != nil {
		t.Fatalf("Exec: %v", err)
	}
	err := tc.Link(context.Background(), func(context.Context, []contract.Event) error { return nil })
	if !errors.Is(err, contract.ErrAlreadyLinked) {
		t.Errorf("second Link = %v, want ErrAlreadyLinked", err)
	}

	// The first link still works.
	emit(t, fake, []contract.Event{{Kind: contract.EventOpened, Conn: 1}})
	if got := l.next(t); len(got) != 1 || got[0].Conn != 1 {
		t.Errorf("first link got %+v after a second Link, want the opened event", got)
	}
}

func TestGRPCTransportStop(t *testing.T) { bothLinks(t, testLinkStop) }

func testLinkStop(t *testing.T, newClient func(testing.TB, *fakeTransport) *contract.TransportGRPCClient) {
	fake := newFakeTransport()
	tc := newClient(t, fake)
	l := startLink(t, tc, nil)

	req := contract.StopRequest{Code: wire.CloseServiceRestart, Reason: "plugin swap"}
	if err := tc.Stop(context.Background(), req); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	fake.mu.Lock()
	stops := fake.stops
	fake.mu.Unlock()
	if len(stops) != 1 || stops[0] != req {
		t.Errorf("plugin got Stop calls %+v, want [%+v]", stops, req)
	}

	// A stopped transport ends its link, and the host's Link returns.
	if err := fake.waitLinkDone(t); err != nil {
		t.Errorf("plugin's Link = %v, want nil", err)
	}
	if err := l.result(t); err != nil {
		t.Errorf("Link after Stop = %v, want nil", err)
	}
	err := tc.Exec(context.Background(), []contract.Command{{Kind: contract.CommandAdmit, Conn: 1}})
	if !errors.Is(err, contract.ErrStopped) {
		t.Errorf("Exec after the link ended = %v, want ErrStopped", err)
	}
}

func TestGRPCTransportLinkCancel(t *testing.T) { bothLinks(t, testLinkLinkCancel) }

func testLinkLinkCancel(t *testing.T, newClient func(testing.TB, *fakeTransport) *contract.TransportGRPCClient) {
	fake := newFakeTransport()
	tc := newClient(t, fake)
	l := startLink(t, tc, nil)

	emit(t, fake, []contract.Event{{Kind: contract.EventOpened, Conn: 1}})
	l.next(t)

	l.cancel()
	if err := l.result(t); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Link after cancel = %v, want nil or context.Canceled", err)
	}
	// The plugin's Link sees the end of the stream too.
	if err := fake.waitLinkDone(t); !errors.Is(err, context.Canceled) {
		t.Errorf("plugin's Link = %v, want context.Canceled", err)
	}
}

func TestGRPCTransportSinkError(t *testing.T) { bothLinks(t, testLinkSinkError) }

func testLinkSinkError(t *testing.T, newClient func(testing.TB, *fakeTransport) *contract.TransportGRPCClient) {
	fake := newFakeTransport()
	tc := newClient(t, fake)
	errSink := errors.New("sink full")
	l := startLink(t, tc, errSink)

	emit(t, fake, []contract.Event{{Kind: contract.EventOpened, Conn: 1}})
	if err := l.result(t); !errors.Is(err, errSink) {
		t.Errorf("Link = %v, want the sink's error %v", err, errSink)
	}
	// The host gave up on the link, so the stream ends and the plugin's
	// Link returns, without waiting for the host's context.
	if err := fake.waitLinkDone(t); !errors.Is(err, context.Canceled) {
		t.Errorf("plugin's Link = %v, want context.Canceled", err)
	}
}

func TestGRPCTransportExecError(t *testing.T) { bothLinks(t, testLinkExecError) }

func testLinkExecError(t *testing.T, newClient func(testing.TB, *fakeTransport) *contract.TransportGRPCClient) {
	// An Exec failure inside the plugin ends the link with that error's
	// class.
	fake := newFakeTransport()
	fake.execErr = fmt.Errorf("conn 1: %w", contract.ErrStaleTransport)
	tc := newClient(t, fake)
	l := startLink(t, tc, nil)

	if err := tc.Exec(context.Background(), []contract.Command{{Kind: contract.CommandAdmit, Conn: 1}}); err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if err := l.result(t); !errors.Is(err, contract.ErrStaleTransport) {
		t.Errorf("Link = %v, want an error matching ErrStaleTransport", err)
	}
}

// bothLinks runs a link test twice: with the batches on the gRPC Link
// stream, and on a data plane the client offers and the server takes.
func bothLinks(t *testing.T, test func(*testing.T, func(testing.TB, *fakeTransport) *contract.TransportGRPCClient)) {
	t.Run("grpc", func(t *testing.T) { test(t, newClient) })
	t.Run("data-plane", func(t *testing.T) {
		test(t, func(t testing.TB, fake *fakeTransport) *contract.TransportGRPCClient {
			t.Helper()
			tc := newClientFor(t, fake)
			startWithDataPlane(t, tc)
			fake.mu.Lock()
			fake.starts = nil
			fake.mu.Unlock()
			return tc
		})
	})
}

// startWithDataPlane offers tc a data plane and starts it; the plugin,
// in this process, opens the offer by its descriptor as a child would.
func startWithDataPlane(t testing.TB, tc *contract.TransportGRPCClient) {
	t.Helper()
	host, pf, err := contract.NewDataPlanePair()
	if err != nil {
		t.Fatalf("NewDataPlanePair: %v", err)
	}
	fd, err := syscall.Dup(int(pf.Fd())) // the server takes this one over
	pf.Close()
	if err != nil {
		t.Fatalf("dup: %v", err)
	}
	tc.OfferDataPlane(host, fmt.Sprintf("fd:%d", fd))
	if _, err := tc.Start(context.Background(), contract.StartRequest{Instance: "dp"}); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if got := tc.DataPlane(); got != contract.DataPlaneProtocol {
		t.Fatalf("DataPlane() = %q after Start, want %q", got, contract.DataPlaneProtocol)
	}
}
