package transportkit_test

import (
	"context"
	"fmt"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/contract/transportkit"
	"github.com/tether-agent/tether/wire"
)

// A transport pushes its connections' events and lets the Queue run Link
// and the end of Stop.
func ExampleQueue() {
	q := transportkit.NewQueue(0)
	q.Push(contract.Event{Kind: contract.EventOpened, Conn: 1, Path: "/api/ws"})
	q.PushFrame(contract.Event{Kind: contract.EventFrame, Conn: 1, Data: []byte("hello")}, func() bool { return true })

	// Stop's own work pushes the last Closed; Link delivers it and returns.
	_ = q.Stop(context.Background(), func(context.Context) {
		q.Push(contract.Event{Kind: contract.EventClosed, Conn: 1, Code: wire.CloseGoingAway})
	})
	err := q.Link(context.Background(), func(_ context.Context, evs []contract.Event) error {
		for _, e := range evs {
			fmt.Println(e.Kind, e.Conn, string(e.Data), e.Code)
		}
		return nil
	})
	fmt.Println("link:", err)
	// Output:
	// opened 1  0
	// frame 1 hello 0
	// closed 1  1001
	// link: <nil>
}
