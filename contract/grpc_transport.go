package contract

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-agent/tether/contract/proto/tetherv1"
)

// TransportGRPCClient is the host's side of a transport plugin: it
// implements Transport by calling the plugin over gRPC.
type TransportGRPCClient struct {
	client tetherv1.TransportClient

	mu     sync.Mutex // guards the fields below
	stream tetherv1.Transport_LinkClient
	ready  chan struct{} // closed once stream is set
	sendMu sync.Mutex    // serialises Send on stream
}

var (
	_ Transport     = (*TransportGRPCClient)(nil)
	_ StatsReporter = (*TransportGRPCClient)(nil)
)

// NewTransportGRPCClient wraps a generated client.
func NewTransportGRPCClient(c tetherv1.TransportClient) *TransportGRPCClient {
	return &TransportGRPCClient{client: c, ready: make(chan struct{})}
}

// Start implements Transport.
func (c *TransportGRPCClient) Start(ctx context.Context, req StartRequest) (StartResponse, error) {
	p := &tetherv1.StartRequest{
		Instance:        req.Instance,
		Listen:          req.Listen,
		PingIntervalMs:  req.PingInterval.Milliseconds(),
		PeerTimeoutMs:   req.PeerTimeout.Milliseconds(),
		MaxMessage:      req.MaxMessage,
		SendQueue:       req.SendQueue,
		MaxConnections:  int64(req.MaxConnections),
		HeaderTimeoutMs: req.HeaderTimeout.Milliseconds(),
		TlsCertFile:     req.TLSCertFile,
		TlsKeyFile:      req.TLSKeyFile,
		PageAuth:        req.PageAuth,
	}
	resp, err := c.client.Start(ctx, p)
	if err != nil {
		return StartResponse{}, FromGRPC(err)
	}
	return StartResponse{
		Addr:           resp.GetAddr(),
		Version:        resp.GetVersion(),
		MaxConnections: int(resp.GetMaxConnections()),
	}, nil
}

// Stats implements StatsReporter. A plugin whose transport reports no
// counters answers with an error matching errors.ErrUnsupported.
func (c *TransportGRPCClient) Stats(ctx context.Context) (TransportStats, error) {
	resp, err := c.client.Stats(ctx, &tetherv1.StatsRequest{})
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return TransportStats{}, fmt.Errorf("transport stats: %w", errors.ErrUnsupported)
		}
		return TransportStats{}, FromGRPC(err)
	}
	return TransportStats{Connections: resp.GetConnections(), Refused503: resp.GetRefused()}, nil
}

// Link implements Transport: it opens the one bidirectional stream and
// delivers its event batches to sink until the stream ends.
func (c *TransportGRPCClient) Link(ctx context.Context, sink EventSink) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream however Link returns
	c.mu.Lock()
	if c.stream != nil {
		c.mu.Unlock()
		return ErrAlreadyLinked
	}
	stream, err := c.client.Link(ctx)
	if err != nil {
		c.mu.Unlock()
		return FromGRPC(err)
	}
	c.stream = stream
	close(c.ready)
	c.mu.Unlock()

	var events []Event
	for {
		batch, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return FromGRPC(err)
		}
		events = events[:0]
		for _, e := range batch.GetEvents() {
			events = append(events, eventFromProto(e))
		}
		if err := sink(ctx, events); err != nil {
			return err
		}
	}
}

// Exec implements Transport: it sends cmds as one batch on the link
// stream, waiting for Link to have opened it.
func (c *TransportGRPCClient) Exec(ctx context.Context, cmds []Command) error {
	select {
	case <-c.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.mu.Lock()
	stream := c.stream
	c.mu.Unlock()
	batch := &tetherv1.CommandBatch{Commands: make([]*tetherv1.Command, 0, len(cmds))}
	for _, cmd := range cmds {
		batch.Commands = append(batch.Commands, commandToProto(cmd))
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := stream.Send(batch); err != nil {
		if errors.Is(err, io.EOF) {
			return ErrStopped
		}
		return FromGRPC(err)
	}
	return nil
}

// Stop implements Transport.
func (c *TransportGRPCClient) Stop(ctx context.Context, req StopRequest) error {
	_, err := c.client.Stop(ctx, &tetherv1.StopRequest{Code: int32(req.Code), Reason: req.Reason})
	return FromGRPC(err)
}

// TransportGRPCServer is the plugin's side: it serves a Transport
// implementation over gRPC.
type TransportGRPCServer struct {
	tetherv1.UnimplementedTransportServer
	Impl Transport
}

// Start implements tetherv1.TransportServer.
func (s *TransportGRPCServer) Start(ctx context.Context, req *tetherv1.StartRequest) (*tetherv1.StartResponse, error) {
	r := StartRequest{
		Instance:       req.GetInstance(),
		Listen:         req.GetListen(),
		PingInterval:   time.Duration(req.GetPingIntervalMs()) * time.Millisecond,
		PeerTimeout:    time.Duration(req.GetPeerTimeoutMs()) * time.Millisecond,
		MaxMessage:     req.GetMaxMessage(),
		SendQueue:      req.GetSendQueue(),
		MaxConnections: int(req.GetMaxConnections()),
		HeaderTimeout:  time.Duration(req.GetHeaderTimeoutMs()) * time.Millisecond,
		TLSCertFile:    req.GetTlsCertFile(),
		TLSKeyFile:     req.GetTlsKeyFile(),
		PageAuth:       req.GetPageAuth(),
	}
	resp, err := s.Impl.Start(ctx, r)
	if err != nil {
		return nil, ToGRPC(err)
	}
	return &tetherv1.StartResponse{
		Addr:           resp.Addr,
		Version:        resp.Version,
		MaxConnections: int64(resp.MaxConnections),
	}, nil
}

// Stats implements tetherv1.TransportServer: Impl's counters, or
// UNIMPLEMENTED when Impl is not a StatsReporter.
func (s *TransportGRPCServer) Stats(ctx context.Context, _ *tetherv1.StatsRequest) (*tetherv1.StatsResponse, error) {
	sr, ok := s.Impl.(StatsReporter)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this transport reports no stats")
	}
	st, err := sr.Stats(ctx)
	if err != nil {
		return nil, ToGRPC(err)
	}
	return &tetherv1.StatsResponse{Connections: st.Connections, Refused: st.Refused503}, nil
}

// Link implements tetherv1.TransportServer: commands read from the stream
// go to Impl.Exec; events from Impl.Link go out on the stream.
func (s *TransportGRPCServer) Link(stream tetherv1.Transport_LinkServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()

	recvDone := make(chan error, 1)
	go func() {
		for {
			batch, err := stream.Recv()
			if err != nil {
				recvDone <- err
				cancel()
				return
			}
			cmds := make([]Command, 0, len(batch.GetCommands()))
			for _, c := range batch.GetCommands() {
				cmds = append(cmds, commandFromProto(c))
			}
			exec := s.Impl.Exec
			if o, ok := s.Impl.(OwnedExecer); ok {
				exec = o.ExecOwned // the data was just unmarshalled: nobody else holds it
			}
			if err := exec(ctx, cmds); err != nil {
				recvDone <- err
				cancel()
				return
			}
		}
	}()

	out := &tetherv1.EventBatch{}
	err := s.Impl.Link(ctx, func(_ context.Context, events []Event) error {
		out.Events = out.Events[:0]
		for i := range events {
			out.Events = append(out.Events, eventToProto(&events[i]))
		}
		return stream.Send(out)
	})
	cancel()
	// The receiver has already reported unless it is blocked in
	// stream.Recv, which returns only once this handler has returned (or
	// the host ends its side); it exits then. Waiting for it here would
	// hang a link the transport ended by itself, e.g. on Stop.
	var rerr error
	select {
	case rerr = <-recvDone:
	default:
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	if err == nil && rerr != nil && !errors.Is(rerr, io.EOF) && !errors.Is(rerr, context.Canceled) {
		err = rerr
	}
	return ToGRPC(err)
}

// Stop implements tetherv1.TransportServer.
func (s *TransportGRPCServer) Stop(ctx context.Context, req *tetherv1.StopRequest) (*tetherv1.StopResponse, error) {
	if err := s.Impl.Stop(ctx, StopRequest{Code: int(req.GetCode()), Reason: req.GetReason()}); err != nil {
		return nil, ToGRPC(err)
	}
	return &tetherv1.StopResponse{}, nil
}

func eventToProto(e *Event) *tetherv1.Event {
	p := &tetherv1.Event{
		Kind:   tetherv1.Event_Kind(e.Kind),
		Conn:   e.Conn,
		Path:   e.Path,
		Query:  e.Query,
		Remote: e.Remote,
		Host:   e.Host,
		Binary: e.Binary,
		Data:   e.Data,
		Code:   int32(e.Code),
		Reason: e.Reason,
		Page:   e.Page,
	}
	p.Header = headersToProto(e.Header)
	return p
}

func headersToProto(h map[string][]string) []*tetherv1.Header {
	var out []*tetherv1.Header
	for k, v := range h {
		out = append(out, &tetherv1.Header{Name: k, Values: v})
	}
	return out
}

func headersFromProto(hs []*tetherv1.Header) map[string][]string {
	if len(hs) == 0 {
		return nil
	}
	h := make(map[string][]string, len(hs))
	for _, x := range hs {
		h[http.CanonicalHeaderKey(x.GetName())] = x.GetValues()
	}
	return h
}

func eventFromProto(p *tetherv1.Event) Event {
	e := Event{
		Kind:   EventKind(p.GetKind()),
		Conn:   p.GetConn(),
		Path:   p.GetPath(),
		Query:  p.GetQuery(),
		Remote: p.GetRemote(),
		Host:   p.GetHost(),
		Binary: p.GetBinary(),
		Data:   p.GetData(),
		Code:   int(p.GetCode()),
		Reason: p.GetReason(),
		Page:   p.GetPage(),
		Header: headersFromProto(p.GetHeader()),
	}
	return e
}

func commandToProto(c Command) *tetherv1.Command {
	return &tetherv1.Command{
		Kind:   tetherv1.Command_Kind(c.Kind),
		Conn:   c.Conn,
		Binary: c.Binary,
		Data:   c.Data,
		Code:   int32(c.Code),
		Reason: c.Reason,
		Header: headersToProto(c.Header),
	}
}

func commandFromProto(p *tetherv1.Command) Command {
	return Command{
		Kind:   CommandKind(p.GetKind()),
		Conn:   p.GetConn(),
		Binary: p.GetBinary(),
		Data:   p.GetData(),
		Code:   int(p.GetCode()),
		Reason: p.GetReason(),
		Header: headersFromProto(p.GetHeader()),
	}
}
