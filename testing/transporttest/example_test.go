package transporttest_test

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
	"github.com/tether-agent/tether/testing/transporttest"
	"github.com/tether-agent/tether/wire"
)

// A Dialer's client sends and receives data messages and sees close
// codes; here the WebSocket one talks to the ws transport.
func ExampleWebSocketDialer() {
	ctx := context.Background()
	tr := ws.New(zerolog.Nop())
	resp, err := tr.Start(ctx, contract.StartRequest{Listen: "127.0.0.1:0"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer tr.Stop(ctx, contract.StopRequest{})
	opened := make(chan contract.Event, 1)
	go tr.Link(ctx, func(_ context.Context, evs []contract.Event) error {
		for _, e := range evs {
			if e.Kind == contract.EventOpened {
				opened <- e
			}
		}
		return nil
	})

	c, err := transporttest.WebSocketDialer.Dial(ctx, resp.Addr, "/api/ws", "token=t")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Drop()
	e := <-opened
	fmt.Println("opened", e.Path, e.Query)

	tr.Exec(ctx, []contract.Command{
		{Kind: contract.CommandAdmit, Conn: e.Conn},
		{Kind: contract.CommandSend, Conn: e.Conn, Data: []byte("hello")},
		{Kind: contract.CommandClose, Conn: e.Conn, Code: wire.CloseSuperseded, Reason: "elsewhere"},
	})
	m, _ := c.Receive(ctx)
	fmt.Println("received", m)
	_, err = c.Receive(ctx)
	fmt.Println(err)
	// Output:
	// opened /api/ws token=t
	// received text "hello"
	// connection closed with 4409 "elsewhere"
}
