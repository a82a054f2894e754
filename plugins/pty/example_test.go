package pty_test

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/pty"
)

// A client that reattaches with the cursor it got resumes where it was; a
// cursor of another PTY instance gets the whole window again.
func ExampleBackend_Attach() {
	ctx := context.Background()
	b := pty.New(zerolog.Nop())
	defer b.Shutdown()
	if _, err := b.Start(ctx, contract.BackendConfig{Argv: []string{"/bin/sh", "-c", "read x"}}); err != nil {
		fmt.Println(err)
		return
	}
	const token = "example-token-0123456789"
	first, err := b.Attach(ctx, contract.AttachRequest{Token: token, Viewer: contract.TransportID{Instance: "a", Conn: 1}})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(first.Reason, first.Reset, first.Spawned)

	again, _ := b.Attach(ctx, contract.AttachRequest{Token: token, Viewer: contract.TransportID{Instance: "a", Conn: 2},
		HasCursor: true, Epoch: first.Epoch, Offset: first.ReplayEnd})
	fmt.Println(again.Reason, again.Reset, again.Superseded)

	other, _ := b.Attach(ctx, contract.AttachRequest{Token: token, Viewer: contract.TransportID{Instance: "a", Conn: 3},
		View: true, HasCursor: true, Epoch: "0000000000000000", Offset: 0})
	fmt.Println(other.Reason, other.Reset, other.Superseded)
	// Output:
	// initial true true
	// resume false a/1
	// epoch_mismatch true -
}
