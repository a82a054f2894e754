package contract_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/contract/proto/tetherv1"
)

// rawPlugin serves a hand-written tetherv1.TransportServer, as a plugin
// in another language would: the host's client is the real one.
type rawPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	srv tetherv1.TransportServer
}

func (p *rawPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	tetherv1.RegisterTransportServer(s, p.srv)
	return nil
}

func (p *rawPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return contract.NewTransportGRPCClient(tetherv1.NewTransportClient(c)), nil
}

func newRawClient(t *testing.T, srv tetherv1.TransportServer) *contract.TransportGRPCClient {
	t.Helper()
	client, _ := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{contract.KindTransport: &rawPlugin{srv: srv}})
	t.Cleanup(func() { client.Close() })
	raw, err := client.Dispense(contract.KindTransport)
	if err != nil {
		t.Fatalf("Dispense: %v", err)
	}
	return raw.(*contract.TransportGRPCClient)
}

// offerPair makes a data plane and offers tc its host end; it returns
// the name offered and the plugin's end, open in this process.
func offerPair(t *testing.T, tc *contract.TransportGRPCClient, host net.Conn) (string, *os.File) {
	t.Helper()
	h, pf, err := contract.NewDataPlanePair()
	if err != nil {
		t.Fatalf("NewDataPlanePair: %v", err)
	}
	t.Cleanup(func() { pf.Close() })
	if host == nil {
		host = h
	} else {
		h.Close()
	}
	name := fmt.Sprintf("fd:%d", pf.Fd())
	tc.OfferDataPlane(host, name)
	return name, pf
}

// closeRecorder is a net.Conn that records its Close.
type closeRecorder struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *closeRecorder) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// ignoringServer is a plugin that knows nothing of the data plane: it
// answers Start without one (as a plugin in another language does) and
// echoes each command batch's sends back as frames on the gRPC stream.
type ignoringServer struct {
	tetherv1.UnimplementedTransportServer
	mu      sync.Mutex
	offered string
}

func (s *ignoringServer) Start(_ context.Context, req *tetherv1.StartRequest) (*tetherv1.StartResponse, error) {
	s.mu.Lock()
	s.offered = req.GetDataPlane()
	s.mu.Unlock()
	return &tetherv1.StartResponse{Addr: "127.0.0.1:1", Version: "ignoring/1"}, nil
}

func (s *ignoringServer) Link(stream tetherv1.Transport_LinkServer) error {
	for {
		b, err := stream.Recv()
		if err != nil {
			return nil
		}
		out := &tetherv1.EventBatch{}
		for _, c := range b.GetCommands() {
			out.Events = append(out.Events, &tetherv1.Event{Kind: tetherv1.Event_KIND_FRAME, Conn: c.GetConn(), Data: c.GetData()})
		}
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

// A plugin that ignores the offer keeps working on the gRPC stream, and
// the host closes its end of the unused data plane.
func TestDataPlaneIgnoredByPlugin(t *testing.T) {
	srv := &ignoringServer{}
	tc := newRawClient(t, srv)
	h, _, err := contract.NewDataPlanePair()
	if err != nil {
		t.Fatal(err)
	}
	rec := &closeRecorder{Conn: h, closed: make(chan struct{})}
	name, _ := offerPair(t, tc, rec)
	if _, err := tc.Start(context.Background(), contract.StartRequest{}); err != nil {
		t.Fatalf("Start: %v", err)
	}
	srv.mu.Lock()
	offered := srv.offered
	srv.mu.Unlock()
	if offered != name {
		t.Errorf("the plugin was offered %q, want %q", offered, name)
	}
	if got := tc.DataPlane(); got != "" {
		t.Errorf("DataPlane() = %q with a plugin that did not answer the offer, want \"\"", got)
	}
	select {
	case <-rec.closed:
	default:
		t.Error("the unused data plane's host end is still open after Start")
	}
	l := startLink(t, tc, nil)
	if err := tc.Exec(context.Background(), []contract.Command{{Kind: contract.CommandSend, Conn: 7, Data: []byte("over grpc")}}); err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if got := l.next(t); len(got) != 1 || got[0].Conn != 7 || string(got[0].Data) != "over grpc" {
		t.Errorf("the echo over gRPC = %+v", got)
	}
}

// framingServer speaks the data plane by hand, from a test: Start takes
// the offer, Link runs script on the plugin's end while the gRPC stream
// stays open and empty until script returns.
type framingServer struct {
	tetherv1.UnimplementedTransportServer
	t      *testing.T
	mu     sync.Mutex
	conn   net.Conn
	script func(conn net.Conn) error
	// returns: Link returns once script has (else it waits for the host
	// to end the stream).
	returns bool
}

func (s *framingServer) Start(_ context.Context, req *tetherv1.StartRequest) (*tetherv1.StartResponse, error) {
	var fd int
	if _, err := fmt.Sscanf(req.GetDataPlane(), "fd:%d", &fd); err != nil {
		return nil, err
	}
	dup, err := syscall.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dp")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.conn = c
	s.mu.Unlock()
	return &tetherv1.StartResponse{Addr: "127.0.0.1:1", DataPlane: contract.DataPlaneProtocol}, nil
}

func (s *framingServer) Link(stream tetherv1.Transport_LinkServer) error {
	s.mu.Lock()
	c := s.conn
	s.mu.Unlock()
	defer c.Close()
	if err := s.script(c); err != nil || s.returns {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func writeFrame(t *testing.T, w io.Writer, m proto.Message) {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(binary.BigEndian.AppendUint32(nil, uint32(len(b)))); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
}

func startFraming(t *testing.T, returns bool, script func(net.Conn) error) (*contract.TransportGRPCClient, *link) {
	t.Helper()
	srv := &framingServer{t: t, script: script, returns: returns}
	tc := newRawClient(t, srv)
	_, pf := offerPair(t, tc, nil)
	if _, err := tc.Start(context.Background(), contract.StartRequest{}); err != nil {
		t.Fatalf("Start: %v", err)
	}
	pf.Close() // as the host does once the child has its copy
	if tc.DataPlane() != contract.DataPlaneProtocol {
		t.Fatalf("DataPlane() = %q", tc.DataPlane())
	}
	return tc, startLink(t, tc, nil)
}

// A plugin whose end of the data plane closes without the last frame
// (the process died) ends the host's link with ErrUnavailable, after the
// events it did send.
func TestDataPlanePluginGone(t *testing.T) {
	_, l := startFraming(t, false, func(c net.Conn) error {
		writeFrame(t, c, &tetherv1.EventBatch{Events: []*tetherv1.Event{{Kind: tetherv1.Event_KIND_OPENED, Conn: 1, Path: "/api/ws"}}})
		return c.Close()
	})
	if got := l.next(t); len(got) != 1 || got[0].Kind != contract.EventOpened || got[0].Path != "/api/ws" {
		t.Errorf("first batch = %+v, want the opened event", got)
	}
	if err := l.result(t); !errors.Is(err, contract.ErrUnavailable) {
		t.Errorf("Link = %v, want an error matching ErrUnavailable", err)
	}
}

// Garbage on the data plane ends the link with ErrInvalidArgument, and a
// frame over the message limit is refused before it is read.
func TestDataPlaneMalformedFrames(t *testing.T) {
	for name, bad := range map[string][]byte{
		"not protobuf": append(binary.BigEndian.AppendUint32(nil, 3), 0xff, 0xff, 0xff),
		"too long":     binary.BigEndian.AppendUint32(nil, contract.MaxMessageSize+1),
	} {
		t.Run(name, func(t *testing.T) {
			_, l := startFraming(t, false, func(c net.Conn) error {
				_, err := c.Write(bad)
				return err
			})
			if err := l.result(t); !errors.Is(err, contract.ErrInvalidArgument) {
				t.Errorf("Link = %v, want an error matching ErrInvalidArgument", err)
			}
		})
	}
}

// The last frame ends the link with the stream's status: nil for a
// plugin whose link ended cleanly.
func TestDataPlaneEndOfLink(t *testing.T) {
	tc, l := startFraming(t, true, func(c net.Conn) error {
		writeFrame(t, c, &tetherv1.EventBatch{Events: []*tetherv1.Event{{Kind: tetherv1.Event_KIND_CLOSED, Conn: 1, Code: 1001}}})
		_, err := c.Write([]byte{0xff, 0xff, 0xff, 0xff})
		return err
	})
	if got := l.next(t); len(got) != 1 || got[0].Kind != contract.EventClosed || got[0].Code != 1001 {
		t.Errorf("batch = %+v, want the closed event", got)
	}
	if err := l.result(t); err != nil {
		t.Errorf("Link after the last frame = %v, want nil", err)
	}
	err := tc.Exec(context.Background(), []contract.Command{{Kind: contract.CommandAdmit, Conn: 1}})
	if !errors.Is(err, contract.ErrStopped) {
		t.Errorf("Exec after the link ended = %v, want ErrStopped", err)
	}
}
