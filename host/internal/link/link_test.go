package link

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

func TestBatchCut(t *testing.T) {
	mk := func(sizes ...int) []contract.Command {
		var out []contract.Command
		for _, n := range sizes {
			out = append(out, contract.Command{Kind: contract.CommandSend, Data: make([]byte, n)})
		}
		return out
	}
	tests := []struct {
		name   string
		cmds   []contract.Command
		budget int
		want   int
	}{
		{"all fit", mk(10, 10, 10), 1000, 3},
		{"cut before the one that overflows", mk(400, 400, 400), 1000, 2},
		{"a single big command still goes", mk(5000, 10), 1000, 1},
		{"empty", nil, 1000, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := batchCut(tt.cmds, tt.budget); got != tt.want {
				t.Errorf("batchCut = %d, want %d", got, tt.want)
			}
		})
	}
}

// blockingTransport is a contract.Transport whose Exec waits for release.
type blockingTransport struct {
	contract.Transport
	release chan struct{}
}

func (b *blockingTransport) Exec(ctx context.Context, _ []contract.Command) error {
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestLinkWaitRoom: waitRoom waits while more than linkHighWater bytes are
// queued or in flight, gives up after its bound, and returns once the
// transport has taken enough.
func TestLinkWaitRoom(t *testing.T) {
	tr := &blockingTransport{release: make(chan struct{})}
	l := New(Config{Name: "ws", Instance: "ws-1", Transport: tr, Log: zerolog.Nop()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.sendLoop(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	if !l.WaitRoom(ctx, time.Millisecond) {
		t.Fatal("waitRoom on an empty link: got false, want true")
	}
	for range 5 {
		l.Send(contract.Command{Kind: contract.CommandSend, Conn: 1, Data: make([]byte, 1<<20)})
	}
	if l.WaitRoom(ctx, 10*time.Millisecond) {
		t.Fatal("waitRoom with 5 MiB queued and the transport stuck: got true, want false after the bound")
	}
	got := make(chan bool, 1)
	go func() { got <- l.WaitRoom(ctx, time.Minute) }()
	close(tr.release)
	select {
	case ok := <-got:
		if !ok {
			t.Fatal("waitRoom after the transport took the queue: got false, want true")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waitRoom still waiting after the transport took the queue")
	}
	l.mu.Lock()
	queued := l.queued
	l.mu.Unlock()
	if queued > linkHighWater {
		t.Fatalf("queued %d after waitRoom returned, want <= %d", queued, linkHighWater)
	}
}
