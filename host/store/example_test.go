package store_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/store"
)

func Example() {
	dir, err := os.MkdirTemp("", "tether-store-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(dir, "state.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()

	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	parent := store.Session{Key: store.NewKey(now), Title: "demo", StartedAt: now}
	if err := st.CreateSession(ctx, parent); err != nil {
		fmt.Println(err)
		return
	}
	if err := st.AppendMessages(ctx, parent.Key,
		agent.Message{Role: agent.RoleUser, Text: "hello"},
		agent.Message{Role: agent.RoleAssistant, Text: "hello"},
		agent.Message{Role: agent.RoleUser, Text: "again"},
	); err != nil {
		fmt.Println(err)
		return
	}

	// A branch that keeps the first two of the parent's rows.
	child := store.Session{Key: store.NewKey(now), Parent: parent.Key, ForkCount: 2, StartedAt: now}
	if err := st.CreateSession(ctx, child); err != nil {
		fmt.Println(err)
		return
	}
	if err := st.AppendMessages(ctx, child.Key, agent.Message{Role: agent.RoleUser, Text: "branched"}); err != nil {
		fmt.Println(err)
		return
	}

	msgs, err := st.DisplayMessages(ctx, child.Key)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range msgs {
		fmt.Printf("%s: %s\n", m.Role, m.Text)
	}
	// Output:
	// user: hello
	// assistant: hello
	// user: branched
}
