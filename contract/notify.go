package contract

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/tether-agent/tether/contract/proto/tetherv1"
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

// NotifyGRPCServer serves Impl on the notifier service
// (contract/proto/tetherv1/notify.proto: tether.v1.Notifier).
type NotifyGRPCServer struct {
	tetherv1.UnimplementedNotifierServer
	Impl Notifier
}

// Notify implements tetherv1.NotifierServer.
func (s *NotifyGRPCServer) Notify(ctx context.Context, in *tetherv1.NotifyRequest) (*tetherv1.NotifyResponse, error) {
	answer, err := s.Impl.Notify(ctx, in.GetId(), in.GetBody())
	if err != nil {
		return nil, ToGRPC(err)
	}
	return &tetherv1.NotifyResponse{Answer: answer}, nil
}

// NotifyGRPCClient is the host's side of a notifier plugin.
type NotifyGRPCClient struct {
	client tetherv1.NotifierClient
	// exited is go-plugin's context of the plugin: done once the plugin
	// process exited.
	exited context.Context
}

var _ Notifier = (*NotifyGRPCClient)(nil)

// Notify implements Notifier over gRPC.
func (c *NotifyGRPCClient) Notify(ctx context.Context, id string, body []byte) (string, error) {
	out, err := c.client.Notify(ctx, &tetherv1.NotifyRequest{Id: id, Body: body})
	if err != nil {
		return "", fmt.Errorf("notify: %w", FromGRPC(err))
	}
	return out.GetAnswer(), nil
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
	tetherv1.RegisterNotifierServer(s, &NotifyGRPCServer{Impl: p.Impl})
	return nil
}

// GRPCClient returns a *NotifyGRPCClient; ctx, cancelled when the plugin
// exits, is its death signal (Exited).
func (p *NotifyPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return &NotifyGRPCClient{client: tetherv1.NewNotifierClient(c), exited: ctx}, nil
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
