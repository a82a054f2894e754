package ws_test

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
)

// A transport answers health checks as soon as it is started.
func Example() {
	ctx := context.Background()
	s := ws.New(zerolog.Nop())
	resp, err := s.Start(ctx, contract.StartRequest{Listen: "127.0.0.1:0"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Stop(ctx, contract.StopRequest{})

	cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := cl.Get("http://" + resp.Addr + "/healthz")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	fmt.Println(res.StatusCode, string(body), resp.Version)
	// Output: 200 ok 0.1.0
}
