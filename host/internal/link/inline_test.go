package link

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/store"
)

// adminBook is a credential book on a fresh store whose access token is
// "admintoken".
func adminBook(t *testing.T) *access.Book {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	book := access.NewBook(st, zerolog.Nop())
	if err := book.SetAccessToken(ctx, "host-h1", "admintoken"); err != nil {
		t.Fatal(err)
	}
	return book
}

// execRecorder records every command it is given.
type execRecorder struct {
	contract.Transport
	mu   sync.Mutex
	cmds []contract.Command
}

func (e *execRecorder) Exec(_ context.Context, cmds []contract.Command) error {
	e.mu.Lock()
	e.cmds = append(e.cmds, cmds...)
	e.mu.Unlock()
	return nil
}

func (e *execRecorder) kinds() []contract.CommandKind {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []contract.CommandKind
	for _, c := range e.cmds {
		out = append(out, c.Kind)
	}
	return out
}

// echoEndpoint admits every connection; each frame is answered at once,
// from the handler, as an inline JSON-RPC method is.
type echoEndpoint struct{}

func (echoEndpoint) Open(o Opening) Conn {
	o.Out.Send(contract.Command{Kind: contract.CommandAdmit, Conn: o.ID.Conn})
	return echoConn{o}
}

type echoConn struct{ o Opening }

func (c echoConn) OnFrame(data []byte, binary bool) {
	c.o.Out.Send(contract.Command{Kind: contract.CommandSend, Conn: c.o.ID.Conn, Data: data, Binary: binary})
}
func (echoConn) OnClosed() {}

// TestInlineAnswerWakesNoSender: what the event handler queues (an admit,
// a request's answer) goes out in its own flush before it returns, and
// the sender goroutine is not woken for it; a Send from elsewhere still
// wakes it.
func TestInlineAnswerWakesNoSender(t *testing.T) {
	ctx := context.Background()
	book := adminBook(t)
	tr := &execRecorder{}
	l := New(Config{Name: "ws", Instance: "ws-1", Transport: tr, Log: zerolog.Nop(),
		Endpoints: map[string]Endpoint{"/api/ws": echoEndpoint{}},
		Access:    &access.Access{Book: book, Bound: "127.0.0.1:7717"}})
	// No Run: the sender goroutine is not there; l.notify is what would
	// wake it.
	err := l.handle(ctx, []contract.Event{{Kind: contract.EventOpened, Conn: 1, Path: "/api/ws",
		Query: "token=admintoken", Host: "127.0.0.1:7717", Remote: "127.0.0.1:50000"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.handle(ctx, []contract.Event{{Kind: contract.EventFrame, Conn: 1, Data: []byte(`{"ping":1}`)}}); err != nil {
		t.Fatal(err)
	}
	if got := tr.kinds(); len(got) != 2 || got[0] != contract.CommandAdmit || got[1] != contract.CommandSend {
		t.Fatalf("the transport got %v, want the admit and the answer, sent by the handler itself", got)
	}
	if n := len(l.notify); n != 0 {
		t.Errorf("the sender was woken for what the handler sent itself (%d wake-ups pending)", n)
	}
	// Outside the handler a Send is the sender's to send.
	l.Send(contract.Command{Kind: contract.CommandSend, Conn: 1, Data: []byte("later")})
	if n := len(l.notify); n != 1 {
		t.Errorf("a Send outside the handler left %d wake-ups, want 1", n)
	}
}
