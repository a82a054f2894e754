package contract

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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
	// The data plane: offered (until Start), then in use (dp set) or
	// closed.
	offer     net.Conn
	offerName string
	dp        *frameWriter
	dpConn    net.Conn
}

var (
	_ Transport     = (*TransportGRPCClient)(nil)
	_ StatsReporter = (*TransportGRPCClient)(nil)
)

// NewTransportGRPCClient wraps a generated client.
func NewTransportGRPCClient(c tetherv1.TransportClient) *TransportGRPCClient {
	return &TransportGRPCClient{client: c, ready: make(chan struct{})}
}

// OfferDataPlane offers the plugin a data plane for its link (see
// DataPlaneProtocol): conn is the host's end of a socket whose other end
// the plugin inherited, name says where ("fd:N"). Call it before Start.
// If the plugin answers the offer, Link's batches travel on conn;
// otherwise Start closes it and the link runs over gRPC. The client owns
// conn from now on.
func (c *TransportGRPCClient) OfferDataPlane(conn net.Conn, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.offer != nil {
		c.offer.Close()
	}
	c.offer, c.offerName = conn, name
}

// DataPlane returns the framing the link's batches travel in
// (DataPlaneProtocol), or "" when they travel on the gRPC stream.
func (c *TransportGRPCClient) DataPlane() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dp != nil {
		return DataPlaneProtocol
	}
	return ""
}

// Start implements Transport.
func (c *TransportGRPCClient) Start(ctx context.Context, req StartRequest) (StartResponse, error) {
	c.mu.Lock()
	offer, offerName := c.offer, c.offerName
	c.offer = nil
	c.mu.Unlock()
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
	if offer != nil {
		p.DataPlane = offerName
	}
	resp, err := c.client.Start(ctx, p)
	if err != nil {
		if offer != nil {
			offer.Close()
		}
		return StartResponse{}, FromGRPC(err)
	}
	if offer != nil {
		if resp.GetDataPlane() == DataPlaneProtocol {
			c.mu.Lock()
			c.dp, c.dpConn = &frameWriter{conn: offer}, offer
			c.mu.Unlock()
		} else {
			offer.Close() // a plugin that does not speak it: gRPC it is
		}
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
	dpConn := c.dpConn
	c.mu.Unlock()
	if dpConn != nil {
		return c.linkData(ctx, stream, dpConn, sink)
	}

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
	stream, dp := c.stream, c.dp
	c.mu.Unlock()
	batch := &tetherv1.CommandBatch{Commands: make([]*tetherv1.Command, 0, len(cmds))}
	for _, cmd := range cmds {
		batch.Commands = append(batch.Commands, commandToProto(cmd))
	}
	if dp != nil {
		if err := dp.write(batch); err != nil {
			if errors.Is(err, ErrInvalidArgument) {
				return err
			}
			return fmt.Errorf("exec: %w: %w", ErrStopped, err)
		}
		return nil
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

	mu sync.Mutex // guards dp
	dp net.Conn   // the data plane Start accepted, until a Link takes it
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
	out := &tetherv1.StartResponse{
		Addr:           resp.Addr,
		Version:        resp.Version,
		MaxConnections: int64(resp.MaxConnections),
	}
	if name := req.GetDataPlane(); name != "" {
		// A data plane that cannot be opened is no reason to fail: the
		// link runs over gRPC, as with a plugin that ignores the offer.
		if conn, err := openInheritedConn(name); err == nil {
			s.mu.Lock()
			if s.dp != nil {
				s.dp.Close()
			}
			s.dp = conn
			s.mu.Unlock()
			out.DataPlane = DataPlaneProtocol
		}
	}
	return out, nil
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
	exec := s.Impl.Exec
	if o, ok := s.Impl.(OwnedExecer); ok {
		exec = o.ExecOwned // the data was just unmarshalled: nobody else holds it
	}
	s.mu.Lock()
	dp := s.dp
	s.dp = nil // one link per data plane; a later one runs over gRPC
	s.mu.Unlock()
	if dp != nil {
		return s.linkData(ctx, cancel, dp, exec)
	}
	return ToGRPC(s.runLink(ctx, cancel, exec, stream.Recv, stream.Send))
}

// runLink runs the plugin's side of a link, whatever carries it: recv's
// command batches go to exec on a goroutine of their own, Impl.Link's
// events go out through send. recv's io.EOF is the host's end. It
// returns the link's status: Impl.Link's error, else the receiver's.
func (s *TransportGRPCServer) runLink(ctx context.Context, cancel context.CancelFunc, exec func(context.Context, []Command) error,
	recv func() (*tetherv1.CommandBatch, error), send func(*tetherv1.EventBatch) error) error {
	recvDone := make(chan error, 1)
	go func() {
		for {
			batch, err := recv()
			if err == nil {
				cmds := make([]Command, 0, len(batch.GetCommands()))
				for _, c := range batch.GetCommands() {
					cmds = append(cmds, commandFromProto(c))
				}
				err = exec(ctx, cmds)
			}
			if err != nil {
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
		return send(out)
	})
	cancel()
	// The receiver has already reported unless it is blocked in recv,
	// which returns only once this handler has returned (or the host
	// ends its side); it exits then. Waiting for it here would hang a
	// link the transport ended by itself, e.g. on Stop.
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
	return err
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
