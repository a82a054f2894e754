package contract

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-agent/tether/contract/proto/tetherv1"
)

// BackendGRPCClient is the host's side of a backend plugin: it implements
// Backend by calling the plugin over gRPC.
type BackendGRPCClient struct {
	client tetherv1.BackendClient
}

var _ Backend = (*BackendGRPCClient)(nil)
var _ ScreenRebuildCounter = (*BackendGRPCClient)(nil)

// NewBackendGRPCClient wraps a generated client.
func NewBackendGRPCClient(c tetherv1.BackendClient) *BackendGRPCClient {
	return &BackendGRPCClient{client: c}
}

func viewerToProto(v TransportID) *tetherv1.Viewer {
	if v.IsZero() {
		return nil
	}
	return &tetherv1.Viewer{Instance: v.Instance, Conn: v.Conn}
}

func viewerFromProto(v *tetherv1.Viewer) TransportID {
	return TransportID{Instance: v.GetInstance(), Conn: v.GetConn()}
}

func msToTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

func timeToMS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// Start implements Backend.
func (c *BackendGRPCClient) Start(ctx context.Context, cfg BackendConfig) (BackendInfo, error) {
	resp, err := c.client.Start(ctx, &tetherv1.BackendConfig{
		Argv:        cfg.Argv,
		TtlMs:       cfg.TTL.Milliseconds(),
		MaxSessions: int32(cfg.MaxSessions),
		Buffer:      cfg.Buffer,
		Instance:    cfg.Instance,
		Scrollback:  int32(cfg.Scrollback),
		Challenge:   cfg.Challenge,
		IdleExitMs:  cfg.IdleExit.Milliseconds(),
		MaxCols:     int32(cfg.MaxCols),
		MaxRows:     int32(cfg.MaxRows),
	})
	if err != nil {
		return BackendInfo{}, FromGRPC(err)
	}
	return BackendInfo{Version: resp.GetVersion(), Pid: int(resp.GetPid()), Proof: resp.GetProof()}, nil
}

// Attach implements Backend. With req.OnHeader and req.OnReplay set it
// streams the replay (AttachStream), falling back to one reply from a
// plugin that predates it.
func (c *BackendGRPCClient) Attach(ctx context.Context, req AttachRequest) (AttachResponse, error) {
	preq := &tetherv1.AttachRequest{
		Token:     req.Token,
		Viewer:    viewerToProto(req.Viewer),
		View:      req.View,
		HasCursor: req.HasCursor,
		Offset:    req.Offset,
		Epoch:     req.Epoch,
		Cols:      int32(req.Cols),
		Rows:      int32(req.Rows),
		Argv:      req.Argv,
	}
	if req.OnHeader != nil && req.OnReplay != nil {
		resp, err := c.attachStream(ctx, preq, req.OnHeader, req.OnReplay)
		if status.Code(err) != codes.Unimplemented {
			return resp, err
		}
	}
	resp, err := c.client.Attach(ctx, preq)
	if err != nil {
		return AttachResponse{}, FromGRPC(err)
	}
	return attachFromProto(resp), nil
}

// attachStream runs AttachStream. It returns the gRPC error unmapped
// when the plugin does not implement it (before any callback), else a
// mapped one.
func (c *BackendGRPCClient) attachStream(ctx context.Context, preq *tetherv1.AttachRequest, onHeader func(AttachResponse), onReplay func([]byte)) (AttachResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.client.AttachStream(ctx, preq)
	var first *tetherv1.AttachPiece
	if err == nil {
		first, err = stream.Recv()
	}
	switch {
	case status.Code(err) == codes.Unimplemented:
		return AttachResponse{}, err
	case err != nil:
		return AttachResponse{}, FromGRPC(err)
	case first.GetHeader() == nil:
		return AttachResponse{}, errors.New("attach stream: no header first")
	}
	resp := attachFromProto(first.GetHeader())
	resp.Replay = nil
	onHeader(resp)
	for {
		piece, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return resp, nil
		}
		if err != nil {
			return AttachResponse{}, fmt.Errorf("attach stream: %w", FromGRPC(err))
		}
		if p := piece.GetReplay(); len(p) > 0 {
			onReplay(p)
		}
	}
}

func attachFromProto(resp *tetherv1.AttachResponse) AttachResponse {
	return AttachResponse{
		Epoch:         resp.GetEpoch(),
		StartOffset:   resp.GetStartOffset(),
		ReplayEnd:     resp.GetReplayEnd(),
		Reset:         resp.GetReset_(),
		Reason:        resp.GetReason(),
		Replay:        resp.GetReplay(),
		Snapshot:      resp.GetSnapshot(),
		SnapshotBytes: resp.GetSnapshotBytes(),
		Cols:          int(resp.GetCols()),
		Rows:          int(resp.GetRows()),
		Superseded:    viewerFromProto(resp.GetSuperseded()),
		Spawned:       resp.GetSpawned(),
		Pid:           int(resp.GetPid()),
	}
}

// Detach implements Backend.
func (c *BackendGRPCClient) Detach(ctx context.Context, token string, viewer TransportID) error {
	_, err := c.client.Detach(ctx, &tetherv1.DetachRequest{Token: token, Viewer: viewerToProto(viewer)})
	return FromGRPC(err)
}

// Write implements Backend.
func (c *BackendGRPCClient) Write(ctx context.Context, token string, viewer TransportID, data []byte) error {
	_, err := c.client.Write(ctx, &tetherv1.WriteRequest{Token: token, Viewer: viewerToProto(viewer), Data: data})
	return FromGRPC(err)
}

// Resize implements Backend.
func (c *BackendGRPCClient) Resize(ctx context.Context, token string, viewer TransportID, cols, rows int) error {
	_, err := c.client.Resize(ctx, &tetherv1.ResizeRequest{Token: token, Viewer: viewerToProto(viewer), Cols: int32(cols), Rows: int32(rows)})
	return FromGRPC(err)
}

// Close implements Backend.
func (c *BackendGRPCClient) Close(ctx context.Context, token string) error {
	_, err := c.client.Close(ctx, &tetherv1.CloseRequest{Token: token})
	return FromGRPC(err)
}

// ScreenRebuilds implements ScreenRebuildCounter: the plugin's count
// (see BackendGRPCServer.List).
func (c *BackendGRPCClient) ScreenRebuilds(ctx context.Context) (int64, error) {
	resp, err := c.client.List(ctx, &tetherv1.Empty{})
	if err != nil {
		return 0, FromGRPC(err)
	}
	return resp.GetScreenRebuilds(), nil
}

// List implements Backend.
func (c *BackendGRPCClient) List(ctx context.Context) ([]PTYInfo, error) {
	resp, err := c.client.List(ctx, &tetherv1.Empty{})
	if err != nil {
		return nil, FromGRPC(err)
	}
	out := make([]PTYInfo, 0, len(resp.GetPtys()))
	for _, p := range resp.GetPtys() {
		out = append(out, PTYInfo{
			Token:       p.GetToken(),
			Epoch:       p.GetEpoch(),
			Pid:         int(p.GetPid()),
			StartOffset: p.GetStartOffset(),
			EndOffset:   p.GetEndOffset(),
			Writer:      viewerFromProto(p.GetWriter()),
			Viewers:     int(p.GetViewers()),
			Exited:      p.GetExited(),
			Created:     msToTime(p.GetCreatedUnixMs()),
			Detached:    msToTime(p.GetDetachedUnixMs()),
			Cols:        int(p.GetCols()),
			Rows:        int(p.GetRows()),

			ScreenRebuilds: p.GetScreenRebuilds(),
		})
	}
	return out, nil
}

// Output implements Backend: it opens the output stream and delivers its
// batches to sink until the stream ends.
func (c *BackendGRPCClient) Output(ctx context.Context, sink OutputSink) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.client.Output(ctx, &tetherv1.Empty{})
	if err != nil {
		return FromGRPC(err)
	}
	var out []Output
	for {
		batch, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return FromGRPC(err)
		}
		out = out[:0]
		for _, o := range batch.GetOutputs() {
			out = append(out, Output{
				Token:    o.GetToken(),
				Offset:   o.GetOffset(),
				Data:     o.GetData(),
				Exited:   o.GetExited(),
				ExitCode: int(o.GetExitCode()),
				Epoch:    o.GetEpoch(),
			})
		}
		if err := sink(ctx, out); err != nil {
			return err
		}
	}
}

// BackendGRPCServer is the plugin's side: it serves a Backend
// implementation over gRPC.
type BackendGRPCServer struct {
	tetherv1.UnimplementedBackendServer
	Impl Backend
}

// Start implements tetherv1.BackendServer.
func (s *BackendGRPCServer) Start(ctx context.Context, req *tetherv1.BackendConfig) (*tetherv1.BackendInfo, error) {
	info, err := s.Impl.Start(ctx, BackendConfig{
		Argv:        req.GetArgv(),
		TTL:         time.Duration(req.GetTtlMs()) * time.Millisecond,
		MaxSessions: int(req.GetMaxSessions()),
		Buffer:      req.GetBuffer(),
		Instance:    req.GetInstance(),
		Scrollback:  int(req.GetScrollback()),
		Challenge:   req.GetChallenge(),
		IdleExit:    time.Duration(req.GetIdleExitMs()) * time.Millisecond,
		MaxCols:     int(req.GetMaxCols()),
		MaxRows:     int(req.GetMaxRows()),
	})
	if err != nil {
		return nil, ToGRPC(err)
	}
	return &tetherv1.BackendInfo{Version: info.Version, Pid: int32(info.Pid), Proof: info.Proof}, nil
}

// Attach implements tetherv1.BackendServer.
func (s *BackendGRPCServer) Attach(ctx context.Context, req *tetherv1.AttachRequest) (*tetherv1.AttachResponse, error) {
	resp, err := s.attach(ctx, req)
	if err != nil {
		return nil, ToGRPC(err)
	}
	return attachToProto(resp), nil
}

// attachPiece bounds the replay bytes of one AttachStream message: a
// replay of any size goes in messages of gRPC's largest pooled buffer
// tier. (Smaller pieces pipeline the hops more but cost more CPU per
// byte; on a loaded machine the reattach row was no faster with 128 or
// 256 KiB pieces, and used 10-15 % more CPU.)
const attachPiece = 1 << 20

// AttachStream implements tetherv1.BackendServer: the response first,
// then its replay in pieces of at most attachPiece bytes.
func (s *BackendGRPCServer) AttachStream(req *tetherv1.AttachRequest, stream tetherv1.Backend_AttachStreamServer) error {
	resp, err := s.attach(stream.Context(), req)
	if err != nil {
		return ToGRPC(err)
	}
	replay := resp.Replay
	resp.Replay = nil
	if err := stream.Send(&tetherv1.AttachPiece{Header: attachToProto(resp)}); err != nil {
		return err
	}
	piece := &tetherv1.AttachPiece{}
	for len(replay) > 0 {
		n := min(len(replay), attachPiece)
		piece.Replay = replay[:n]
		if err := stream.Send(piece); err != nil {
			return err
		}
		replay = replay[n:]
	}
	return nil
}

func (s *BackendGRPCServer) attach(ctx context.Context, req *tetherv1.AttachRequest) (AttachResponse, error) {
	return s.Impl.Attach(ctx, AttachRequest{
		Token:     req.GetToken(),
		Viewer:    viewerFromProto(req.GetViewer()),
		View:      req.GetView(),
		HasCursor: req.GetHasCursor(),
		Offset:    req.GetOffset(),
		Epoch:     req.GetEpoch(),
		Cols:      int(req.GetCols()),
		Rows:      int(req.GetRows()),
		Argv:      req.GetArgv(),
	})
}

func attachToProto(resp AttachResponse) *tetherv1.AttachResponse {
	return &tetherv1.AttachResponse{
		Epoch:         resp.Epoch,
		StartOffset:   resp.StartOffset,
		ReplayEnd:     resp.ReplayEnd,
		Reset_:        resp.Reset,
		Reason:        resp.Reason,
		Replay:        resp.Replay,
		Snapshot:      resp.Snapshot,
		SnapshotBytes: resp.SnapshotBytes,
		Cols:          int32(resp.Cols),
		Rows:          int32(resp.Rows),
		Superseded:    viewerToProto(resp.Superseded),
		Spawned:       resp.Spawned,
		Pid:           int32(resp.Pid),
	}
}

// Detach implements tetherv1.BackendServer.
func (s *BackendGRPCServer) Detach(ctx context.Context, req *tetherv1.DetachRequest) (*tetherv1.Empty, error) {
	if err := s.Impl.Detach(ctx, req.GetToken(), viewerFromProto(req.GetViewer())); err != nil {
		return nil, ToGRPC(err)
	}
	return &tetherv1.Empty{}, nil
}

// Write implements tetherv1.BackendServer.
func (s *BackendGRPCServer) Write(ctx context.Context, req *tetherv1.WriteRequest) (*tetherv1.Empty, error) {
	if err := s.Impl.Write(ctx, req.GetToken(), viewerFromProto(req.GetViewer()), req.GetData()); err != nil {
		return nil, ToGRPC(err)
	}
	return &tetherv1.Empty{}, nil
}

// Resize implements tetherv1.BackendServer.
func (s *BackendGRPCServer) Resize(ctx context.Context, req *tetherv1.ResizeRequest) (*tetherv1.Empty, error) {
	if err := s.Impl.Resize(ctx, req.GetToken(), viewerFromProto(req.GetViewer()), int(req.GetCols()), int(req.GetRows())); err != nil {
		return nil, ToGRPC(err)
	}
	return &tetherv1.Empty{}, nil
}

// Close implements tetherv1.BackendServer.
func (s *BackendGRPCServer) Close(ctx context.Context, req *tetherv1.CloseRequest) (*tetherv1.Empty, error) {
	if err := s.Impl.Close(ctx, req.GetToken()); err != nil {
		return nil, ToGRPC(err)
	}
	return &tetherv1.Empty{}, nil
}

// List implements tetherv1.BackendServer. Its screen_rebuilds is the
// Impl's ScreenRebuildCounter's, else the sum over the live PTYs.
func (s *BackendGRPCServer) List(ctx context.Context, _ *tetherv1.Empty) (*tetherv1.PTYList, error) {
	ptys, err := s.Impl.List(ctx)
	if err != nil {
		return nil, ToGRPC(err)
	}
	out := &tetherv1.PTYList{}
	if c, ok := s.Impl.(ScreenRebuildCounter); ok {
		if out.ScreenRebuilds, err = c.ScreenRebuilds(ctx); err != nil {
			return nil, ToGRPC(err)
		}
	} else {
		for _, p := range ptys {
			out.ScreenRebuilds += p.ScreenRebuilds
		}
	}
	for _, p := range ptys {
		out.Ptys = append(out.Ptys, &tetherv1.PTYInfo{
			Token:          p.Token,
			Epoch:          p.Epoch,
			Pid:            int32(p.Pid),
			StartOffset:    p.StartOffset,
			EndOffset:      p.EndOffset,
			Writer:         viewerToProto(p.Writer),
			Viewers:        int32(p.Viewers),
			Exited:         p.Exited,
			CreatedUnixMs:  timeToMS(p.Created),
			DetachedUnixMs: timeToMS(p.Detached),
			Cols:           int32(p.Cols),
			Rows:           int32(p.Rows),
			ScreenRebuilds: p.ScreenRebuilds,
		})
	}
	return out, nil
}

// Output implements tetherv1.BackendServer.
func (s *BackendGRPCServer) Output(_ *tetherv1.Empty, stream tetherv1.Backend_OutputServer) error {
	batch := &tetherv1.OutputBatch{}
	err := s.Impl.Output(stream.Context(), func(_ context.Context, out []Output) error {
		batch.Outputs = batch.Outputs[:0]
		for i := range out {
			o := &out[i]
			batch.Outputs = append(batch.Outputs, &tetherv1.Output{
				Token:    o.Token,
				Offset:   o.Offset,
				Data:     o.Data,
				Exited:   o.Exited,
				ExitCode: int32(o.ExitCode),
				Epoch:    o.Epoch,
			})
		}
		return stream.Send(batch)
	})
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return ToGRPC(err)
}
