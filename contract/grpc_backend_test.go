package contract_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/contract/proto/tetherv1"
	"github.com/tether-agent/tether/wire"
)

// replayBackend is a Backend whose Attach answers with a fixed response.
type replayBackend struct {
	contract.Backend
	resp contract.AttachResponse
	err  error
}

func (b *replayBackend) Attach(context.Context, contract.AttachRequest) (contract.AttachResponse, error) {
	return b.resp, b.err
}

// unaryOnly is a backend server from before AttachStream.
type unaryOnly struct {
	*contract.BackendGRPCServer
}

func (unaryOnly) AttachStream(*tetherv1.AttachRequest, tetherv1.Backend_AttachStreamServer) error {
	return status.Error(codes.Unimplemented, "method AttachStream not implemented")
}

// backendConn serves srv in memory and returns a client for it.
func backendConn(t *testing.T, srv tetherv1.BackendServer) *contract.BackendGRPCClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	tetherv1.RegisterBackendServer(s, srv)
	served := make(chan struct{})
	go func() { defer close(served); _ = s.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		s.Stop()
		<-served
	})
	return contract.NewBackendGRPCClient(tetherv1.NewBackendClient(cc))
}

// TestAttachStream: with OnHeader and OnReplay the replay comes streamed —
// the header first, then the replay in order, in several pieces — and
// from a plugin without AttachStream in one reply.
func TestAttachStream(t *testing.T) {
	replay := make([]byte, 5<<19) // 2.5 MiB: several pieces
	for i := range replay {
		replay[i] = byte(i * 7)
	}
	want := contract.AttachResponse{Epoch: "e1", StartOffset: 5, ReplayEnd: 5, Reset: true,
		Reason: wire.ReasonInitial, Replay: replay, Pid: 42, Superseded: contract.TransportID{Instance: "ws", Conn: 3},
		Snapshot: true, SnapshotBytes: int64(len(replay)), Cols: 120, Rows: 40}
	impl := &contract.BackendGRPCServer{Impl: &replayBackend{resp: want}}
	tests := []struct {
		name       string
		srv        tetherv1.BackendServer
		wantStream bool
	}{
		{"streamed", impl, true},
		{"plugin without AttachStream", unaryOnly{impl}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := backendConn(t, tt.srv)
			var header *contract.AttachResponse
			var pieces [][]byte
			resp, err := c.Attach(context.Background(), contract.AttachRequest{
				Token:  "tok_0123456789abcdef",
				Viewer: contract.TransportID{Instance: "ws", Conn: 1},
				OnHeader: func(r contract.AttachResponse) {
					if header != nil || len(pieces) > 0 {
						t.Error("OnHeader called twice or after OnReplay")
					}
					header = &r
				},
				OnReplay: func(p []byte) {
					if header == nil {
						t.Error("OnReplay called before OnHeader")
					}
					pieces = append(pieces, p)
				},
			})
			if err != nil {
				t.Fatalf("Attach: got error %v, want nil", err)
			}
			got := resp
			if tt.wantStream {
				if header == nil || len(pieces) < 2 || len(resp.Replay) != 0 {
					t.Fatalf("got header %v, %d pieces, %d bytes in the response; want a header, then several pieces", header != nil, len(pieces), len(resp.Replay))
				}
				got.Replay = bytes.Join(pieces, nil)
				if h := *header; h.Epoch != want.Epoch || h.ReplayEnd != want.ReplayEnd || h.Superseded != want.Superseded ||
					!h.Snapshot || h.SnapshotBytes != want.SnapshotBytes || h.Cols != want.Cols || h.Rows != want.Rows {
					t.Errorf("header %+v, want the response's fields, snapshot_bytes before the bytes", h)
				}
			} else if header != nil || pieces != nil {
				t.Fatal("a plugin without AttachStream: callbacks called, want the whole replay in the response")
			}
			if !bytes.Equal(got.Replay, want.Replay) || got.Epoch != want.Epoch || got.StartOffset != want.StartOffset ||
				got.ReplayEnd != want.ReplayEnd || got.Reset != want.Reset || got.Reason != want.Reason ||
				got.Pid != want.Pid || got.Superseded != want.Superseded || got.Snapshot != want.Snapshot ||
				got.SnapshotBytes != want.SnapshotBytes || got.Cols != want.Cols || got.Rows != want.Rows {
				got.Replay = nil
				t.Fatalf("got %+v (replay %d bytes), want the fields of %+v", got, len(resp.Replay), want.Epoch)
			}
		})
	}
}

// TestAttachStreamError: an attach that fails keeps its error class
// across the streamed call, and calls neither callback.
func TestAttachStreamError(t *testing.T) {
	c := backendConn(t, &contract.BackendGRPCServer{Impl: &replayBackend{err: fmt.Errorf("attach: %w", contract.ErrRegistryFull)}})
	called := false
	_, err := c.Attach(context.Background(), contract.AttachRequest{
		Token:    "tok_0123456789abcdef",
		Viewer:   contract.TransportID{Instance: "ws", Conn: 1},
		OnHeader: func(contract.AttachResponse) { called = true },
		OnReplay: func([]byte) { called = true },
	})
	if !errors.Is(err, contract.ErrRegistryFull) {
		t.Errorf("Attach: got error %v, want ErrRegistryFull", err)
	}
	if called {
		t.Error("a callback was called for a failed attach")
	}
}

// fieldsBackend records the configuration it was started with and lists
// one PTY.
type fieldsBackend struct {
	contract.Backend
	cfg  contract.BackendConfig
	info contract.PTYInfo
}

func (b *fieldsBackend) Start(_ context.Context, cfg contract.BackendConfig) (contract.BackendInfo, error) {
	b.cfg = cfg
	return contract.BackendInfo{Version: "v", Pid: 1}, nil
}

func (b *fieldsBackend) List(context.Context) ([]contract.PTYInfo, error) {
	return []contract.PTYInfo{b.info}, nil
}

// TestBackendFieldsCrossGRPC: the scrollback and size bound settings and
// a PTY's size and screen rebuilds survive the gRPC shims.
func TestBackendFieldsCrossGRPC(t *testing.T) {
	impl := &fieldsBackend{info: contract.PTYInfo{Token: "tok", Epoch: "e", Pid: 7, Cols: 132, Rows: 43, ScreenRebuilds: 3}}
	c := backendConn(t, &contract.BackendGRPCServer{Impl: impl})
	if _, err := c.Start(context.Background(), contract.BackendConfig{Scrollback: 2500, Buffer: 64, MaxCols: 300, MaxRows: 7000}); err != nil {
		t.Fatalf("Start: got error %v, want nil", err)
	}
	if impl.cfg.Scrollback != 2500 || impl.cfg.Buffer != 64 || impl.cfg.MaxCols != 300 || impl.cfg.MaxRows != 7000 {
		t.Errorf("Start: backend got scrollback %d buffer %d max size %dx%d, want 2500 64 300x7000",
			impl.cfg.Scrollback, impl.cfg.Buffer, impl.cfg.MaxCols, impl.cfg.MaxRows)
	}
	infos, err := c.List(context.Background())
	if err != nil || len(infos) != 1 {
		t.Fatalf("List: got %d PTYs (error %v), want 1", len(infos), err)
	}
	if got := infos[0]; got.Cols != 132 || got.Rows != 43 || got.ScreenRebuilds != 3 || got.Pid != 7 {
		t.Errorf("List: got %+v, want size 132x43, 3 rebuilds, pid 7", got)
	}
}

// countingBackend counts its screen rebuilds beyond its live PTYs'.
type countingBackend struct {
	fieldsBackend
	total int64
}

func (b *countingBackend) ScreenRebuilds(context.Context) (int64, error) { return b.total, nil }

// TestScreenRebuildsCrossGRPC: the backend's own count crosses the gRPC
// shims; a backend without one is reported as the sum over its live
// PTYs.
func TestScreenRebuildsCrossGRPC(t *testing.T) {
	live := contract.PTYInfo{Token: "tok", Epoch: "e", ScreenRebuilds: 3}
	for _, tt := range []struct {
		name string
		impl contract.Backend
		want int64
	}{
		{"counted", &countingBackend{fieldsBackend: fieldsBackend{info: live}, total: 10}, 10},
		{"summed", &fieldsBackend{info: live}, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := backendConn(t, &contract.BackendGRPCServer{Impl: tt.impl})
			got, err := c.ScreenRebuilds(context.Background())
			if err != nil || got != tt.want {
				t.Errorf("ScreenRebuilds: got %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

// requestBackend records the attach requests it gets.
type requestBackend struct {
	contract.Backend
	reqs []contract.AttachRequest
}

func (b *requestBackend) Attach(_ context.Context, req contract.AttachRequest) (contract.AttachResponse, error) {
	b.reqs = append(b.reqs, req)
	return contract.AttachResponse{Epoch: "e", Reset: true, Reason: wire.ReasonInitial, Snapshot: true, Cols: req.Cols, Rows: req.Rows}, nil
}

// TestAttachRequestCrossesGRPC: every field of an attach request — the
// writer's size among them, which a live PTY takes before its snapshot —
// reaches the backend across the gRPC shims, streamed and in one reply.
func TestAttachRequestCrossesGRPC(t *testing.T) {
	want := contract.AttachRequest{Token: "tok_size_0123456789", Viewer: contract.TransportID{Instance: "ws", Conn: 9},
		HasCursor: true, Offset: 42, Epoch: "e1", Cols: 100, Rows: 30, Argv: []string{"/bin/sh", "-c", "true"}}
	for _, streamed := range []bool{true, false} {
		t.Run(fmt.Sprintf("streamed=%v", streamed), func(t *testing.T) {
			impl := &requestBackend{}
			c := backendConn(t, &contract.BackendGRPCServer{Impl: impl})
			req := want
			if streamed {
				req.OnHeader, req.OnReplay = func(contract.AttachResponse) {}, func([]byte) {}
			}
			resp, err := c.Attach(context.Background(), req)
			if err != nil {
				t.Fatalf("Attach: got error %v, want nil", err)
			}
			if len(impl.reqs) != 1 {
				t.Fatalf("the backend got %d attaches, want 1", len(impl.reqs))
			}
			got := impl.reqs[0]
			if got.Token != want.Token || got.Viewer != want.Viewer || got.View != want.View || got.HasCursor != want.HasCursor ||
				got.Offset != want.Offset || got.Epoch != want.Epoch || got.Cols != want.Cols || got.Rows != want.Rows ||
				fmt.Sprint(got.Argv) != fmt.Sprint(want.Argv) {
				t.Errorf("the backend got %+v, want %+v", got, want)
			}
			if resp.Cols != 100 || resp.Rows != 30 {
				t.Errorf("response: snapshot of %dx%d, want 100x30", resp.Cols, resp.Rows)
			}
		})
	}
}
