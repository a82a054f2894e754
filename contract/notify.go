package contract

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// KindNotify is a notifier plugin (--plugin notify:NAME=PATH).
const KindNotify = "notify"

// Notifier is what a notifier plugin implements: it delivers one
// notification somewhere (a push service, a chat) — translation only:
// the host keeps the outbox, the retries and the deduplication id.
type Notifier interface {
	// Notify delivers body, the JSON of the event whose id is id
	// (docs/PROTOCOL.md §19), within ctx. It returns the receiver's
	// answer (for tether notify test) and nil once delivered; any error
	// makes the host retry later, with the same id and body.
	Notify(ctx context.Context, id string, body []byte) (answer string, err error)
}

// The notifier service on the wire. Its messages are protobuf's
// well-known wrappers, so a plugin in any language needs no generated
// code of ours: service tether.v1.Notifier, method
// Notify(google.protobuf.BytesValue body) returns
// (google.protobuf.StringValue answer), the event's id in the request
// metadata under NotifyIDKey.
const (
	notifyService = "tether.v1.Notifier"
	notifyMethod  = "/" + notifyService + "/Notify"
	// NotifyIDKey is the gRPC metadata key of the event's id.
	NotifyIDKey = "tether-event-id"
)

// notifyServer is the service's handler type (grpc.ServiceDesc wants
// an interface).
type notifyServer interface {
	notify(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.StringValue, error)
}

var notifyServiceDesc = grpc.ServiceDesc{
	ServiceName: notifyService,
	HandlerType: (*notifyServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Notify",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			s := srv.(notifyServer)
			if icpt == nil {
				return s.notify(ctx, in)
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: notifyMethod}
			return icpt(ctx, in, info, func(ctx context.Context, req any) (any, error) {
				return s.notify(ctx, req.(*wrapperspb.BytesValue))
			})
		},
	}},
	Metadata: "tether/v1/notify",
}

// NotifyGRPCServer serves Impl on the notifier service.
type NotifyGRPCServer struct{ Impl Notifier }

func (s *NotifyGRPCServer) notify(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.StringValue, error) {
	var id string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(NotifyIDKey); len(v) > 0 {
			id = v[0]
		}
	}
	answer, err := s.Impl.Notify(ctx, id, in.GetValue())
	if err != nil {
		return nil, ToGRPC(err)
	}
	return wrapperspb.String(answer), nil
}

// NotifyGRPCClient is the host's side of a notifier plugin.
type NotifyGRPCClient struct {
	cc *grpc.ClientConn
	// exited is go-plugin's context of the plugin: done once the plugin
	// process exited.
	exited context.Context
}

var _ Notifier = (*NotifyGRPCClient)(nil)

// Notify implements Notifier over gRPC.
func (c *NotifyGRPCClient) Notify(ctx context.Context, id string, body []byte) (string, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, NotifyIDKey, id)
	out := new(wrapperspb.StringValue)
	if err := c.cc.Invoke(ctx, notifyMethod, wrapperspb.Bytes(body), out); err != nil {
		return "", fmt.Errorf("notify: %w", FromGRPC(err))
	}
	return out.GetValue(), nil
}

// Exited is closed once the plugin process exited.
func (c *NotifyGRPCClient) Exited() <-chan struct{} { return c.exited.Done() }

// NotifyPlugin is the go-plugin adapter for Notifier. Impl is set on the
// plugin side only.
type NotifyPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl Notifier
}

var _ plugin.GRPCPlugin = (*NotifyPlugin)(nil)

// GRPCServer registers Impl on s.
func (p *NotifyPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	s.RegisterService(&notifyServiceDesc, &NotifyGRPCServer{Impl: p.Impl})
	return nil
}

// GRPCClient returns a *NotifyGRPCClient; ctx, cancelled when the plugin
// exits, is its death signal (Exited).
func (p *NotifyPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return &NotifyGRPCClient{cc: c, exited: ctx}, nil
}

// NotifyServeConfig is the go-plugin ServeConfig for a notifier; tests
// set its Test field to serve in-process.
func NotifyServeConfig(impl Notifier) *plugin.ServeConfig {
	return &plugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         map[string]plugin.Plugin{KindNotify: &NotifyPlugin{Impl: impl}},
		GRPCServer:      grpcServer,
		Logger:          hclog.NewNullLogger(),
	}
}

// ServeNotifier serves impl as a notifier plugin on the go-plugin
// protocol and returns when the host ends it. A notifier plugin's main
// is:
//
//	func main() { contract.ServeNotifier(mynotifier.New()) }
func ServeNotifier(impl Notifier) {
	plugin.Serve(NotifyServeConfig(impl))
}
