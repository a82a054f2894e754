package supervise

import (
	"context"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/tether-agent/tether/contract"
)

// fakePluginEnv makes the test binary serve a minimal transport plugin
// instead of running the tests (the helper-process pattern).
const fakePluginEnv = "TETHER_TEST_FAKE_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(fakePluginEnv) != "" {
		contract.ServeTransport(idleTransport{})
		return
	}
	goleak.VerifyTestMain(m)
}

// idleTransport is a transport that starts and does nothing.
type idleTransport struct{}

func (idleTransport) Start(context.Context, contract.StartRequest) (contract.StartResponse, error) {
	return contract.StartResponse{Addr: "idle:nowhere", Version: "idle-1"}, nil
}

func (idleTransport) Link(ctx context.Context, _ contract.EventSink) error {
	<-ctx.Done()
	return ctx.Err()
}

func (idleTransport) Exec(context.Context, []contract.Command) error { return nil }

func (idleTransport) Stop(context.Context, contract.StopRequest) error { return nil }
