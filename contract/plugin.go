package contract

import (
	"context"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/tether-agent/tether/contract/proto/tetherv1"
)

// Plugin kinds, the keys of PluginMap.
const (
	// KindTransport is a network-facing transport plugin.
	KindTransport = "transport"
	// KindBackend is a PTY backend plugin.
	KindBackend = "backend"
)

// Handshake is the go-plugin handshake every tether plugin must answer:
// environment variable TETHER_PLUGIN with the magic value, protocol
// version 1.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "TETHER_PLUGIN",
	MagicCookieValue: "7f3d1c2a-tether-plugin-v1",
}

// PluginMap returns the plugins the host can dispense, by kind.
func PluginMap() map[string]plugin.Plugin {
	return map[string]plugin.Plugin{
		KindTransport: &TransportPlugin{},
		KindBackend:   &BackendPlugin{},
		KindNotify:    &NotifyPlugin{},
	}
}

// TransportPlugin is the go-plugin adapter for Transport. Impl is set on the
// plugin side only.
type TransportPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl Transport
}

var _ plugin.GRPCPlugin = (*TransportPlugin)(nil)

// GRPCServer registers Impl on s.
func (p *TransportPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	tetherv1.RegisterTransportServer(s, &TransportGRPCServer{Impl: p.Impl})
	return nil
}

// GRPCClient returns a *TransportGRPCClient. When the plugin process
// exits its streams (Link) end: that is the host's death signal.
func (p *TransportPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return NewTransportGRPCClient(tetherv1.NewTransportClient(c)), nil
}

// TransportServeConfig is the go-plugin ServeConfig for a transport; tests
// set its Test field to serve in-process.
func TransportServeConfig(impl Transport) *plugin.ServeConfig {
	return &plugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         map[string]plugin.Plugin{KindTransport: &TransportPlugin{Impl: impl}},
		GRPCServer:      grpcServer,
		Logger:          hclog.NewNullLogger(),
	}
}

// ServeTransport serves impl as a transport plugin on the go-plugin
// protocol and returns when the host ends it. A transport plugin's main is:
//
//	func main() { contract.ServeTransport(mytransport.New(logger)) }
func ServeTransport(impl Transport) {
	plugin.Serve(TransportServeConfig(impl))
}

// BackendPlugin is the go-plugin adapter for Backend. Impl is set on the
// plugin side only.
type BackendPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl Backend
}

var _ plugin.GRPCPlugin = (*BackendPlugin)(nil)

// GRPCServer registers Impl on s.
func (p *BackendPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	tetherv1.RegisterBackendServer(s, &BackendGRPCServer{Impl: p.Impl})
	return nil
}

// GRPCClient returns a *BackendGRPCClient. When the plugin process exits
// its Output stream ends: that is the host's death signal.
func (p *BackendPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return NewBackendGRPCClient(tetherv1.NewBackendClient(c)), nil
}

// BackendServeConfig is the go-plugin ServeConfig for a backend; tests set
// its Test field to serve in-process.
func BackendServeConfig(impl Backend) *plugin.ServeConfig {
	return &plugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         map[string]plugin.Plugin{KindBackend: &BackendPlugin{Impl: impl}},
		GRPCServer:      grpcServer,
		Logger:          hclog.NewNullLogger(),
	}
}

// ServeBackend serves impl as a PTY backend plugin on the go-plugin
// protocol and returns when the host ends it:
//
//	func main() { contract.ServeBackend(mybackend.New(logger)) }
func ServeBackend(impl Backend) {
	plugin.Serve(BackendServeConfig(impl))
}

// MaxMessageSize is the largest gRPC message a tether plugin accepts (the
// default of 4 MiB is too small for a big replay or a single large frame;
// the host also cuts its command batches well below it).
const MaxMessageSize = 64 << 20

// MaxFrameData is the largest frame the host hands a transport: half the
// gRPC limit, so one command with its envelope always fits in a message.
// A larger frame is never sent (it would break the plugin's stream and
// every connection on it); its connection is closed with 1013 instead.
const MaxFrameData = MaxMessageSize / 2

// grpcServer is go-plugin's server with tether's message size limits,
// codec and buffer pool.
func grpcServer(opts []grpc.ServerOption) *grpc.Server {
	opts = append(opts, grpc.MaxRecvMsgSize(MaxMessageSize), grpc.MaxSendMsgSize(MaxMessageSize))
	return grpc.NewServer(append(opts, serverOptions()...)...)
}
