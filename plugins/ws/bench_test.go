package ws_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	gobws "github.com/gobwas/ws"

	"github.com/tether-agent/tether/contract"
)

// BenchmarkIdleConn reports the memory (heap and goroutine stacks) that
// idle connections add to the process: an upper bound for the server's
// share, since the in-process clients and the recorded Opened events
// count too. "admitted" minus "pending" is what admission costs: the
// reader goroutine and its frame reader.
func BenchmarkIdleConn(b *testing.B) {
	for _, admitted := range []bool{false, true} {
		name := "pending"
		if admitted {
			name = "admitted"
		}
		b.Run(name, func(b *testing.B) {
			const n = 500
			s, addr := startServer(b, contract.StartRequest{PingInterval: time.Hour, PeerTimeout: 2 * time.Hour})
			r := link(b, s)
			for range b.N {
				before := memInUse()
				clients := make([]*client, n)
				for i := range clients {
					clients[i] = dial(b, addr, "/api/ws", nil)
					id := r.opened(b, clients[i]).Conn
					if admitted {
						exec(b, s, admit(id))
					}
				}
				after := memInUse()
				b.ReportMetric(float64(after-before)/n, "B/conn")
				for _, c := range clients {
					c.nc.Close()
				}
			}
		})
	}
}

func memInUse() int64 {
	for range 3 {
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse + ms.StackInuse)
}

// BenchmarkRoundTrip is the event path of a JSON-RPC round trip: a
// client's message is read, queued, delivered by Link to the sink, whose
// Exec sends the answer, which the client reads; one at a time.
func BenchmarkRoundTrip(b *testing.B) {
	s, addr := startServer(b, contract.StartRequest{PingInterval: time.Hour, PeerTimeout: 2 * time.Hour})
	c := dial(b, addr, "/api/ws", nil)
	id := make(chan uint64, 1)
	errs := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.Link(ctx, func(ctx context.Context, evs []contract.Event) error {
			for _, e := range evs {
				switch e.Kind {
				case contract.EventOpened:
					id <- e.Conn
				case contract.EventFrame:
					if err := s.Exec(ctx, []contract.Command{{Kind: contract.CommandSend, Conn: e.Conn, Data: e.Data}}); err != nil {
						errs <- err
					}
				}
			}
			return nil
		})
	}()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("Link: %v", err)
		}
	})
	exec(b, s, admit(<-id))
	req := []byte(`{"jsonrpc":"2.0","id":1,"method":"session.list","params":{}}`)
	frame := maskedFrame(gobws.OpText, req)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.nc.Write(frame); err != nil {
			b.Fatalf("client write: %v", err)
		}
		if _, p := c.readMessage(); len(p) != len(req) {
			b.Fatalf("got %d bytes back, want %d", len(p), len(req))
		}
	}
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatalf("Exec: %v", err)
	default:
	}
}

// BenchmarkFanIn is the event path under load: 16 clients write 64-byte
// messages as fast as they can; Link delivers them in batches to a sink
// that only counts them. ns/op is per message.
func BenchmarkFanIn(b *testing.B) {
	const clients = 16
	s, addr := startServer(b, contract.StartRequest{PingInterval: time.Hour, PeerTimeout: 2 * time.Hour})
	var (
		mu      sync.Mutex // guards the fields below
		opened  []uint64
		frames  int
		batches int
		changed = make(chan struct{}, 1)
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.Link(ctx, func(_ context.Context, evs []contract.Event) error {
			mu.Lock()
			for _, e := range evs {
				switch e.Kind {
				case contract.EventOpened:
					opened = append(opened, e.Conn)
				case contract.EventFrame:
					frames++
				}
			}
			batches++
			mu.Unlock()
			select {
			case changed <- struct{}{}:
			default:
			}
			return nil
		})
	}()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("Link: %v", err)
		}
	})
	until := func(cond func() bool) {
		b.Helper()
		timeout := time.After(time.Minute)
		for {
			mu.Lock()
			ok := cond()
			mu.Unlock()
			if ok {
				return
			}
			select {
			case <-changed:
			case <-timeout:
				b.Fatal("timed out waiting for events")
			}
		}
	}
	cs := make([]*client, clients)
	for i := range cs {
		cs[i] = dial(b, addr, "/api/ws", nil)
	}
	until(func() bool { return len(opened) == clients })
	for _, id := range opened {
		exec(b, s, admit(id))
	}
	frame := maskedFrame(gobws.OpText, bytes.Repeat([]byte("m"), 64))
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i, c := range cs {
		n := b.N / clients
		if i < b.N%clients {
			n++
		}
		wg.Go(func() {
			buf := bytes.Repeat(frame, min(n, 256))
			for n > 0 {
				k := min(n, 256)
				if _, err := c.nc.Write(buf[:k*len(frame)]); err != nil {
					errs <- err
					return
				}
				n -= k
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("client write: %v", err)
	}
	until(func() bool { return frames == b.N })
	b.StopTimer()
	mu.Lock()
	b.ReportMetric(float64(frames)/float64(max(batches, 1)), "frames/batch")
	mu.Unlock()
}

// maskedFrame is one masked client frame with payload p.
func maskedFrame(op gobws.OpCode, p []byte) []byte {
	var buf bytes.Buffer
	f := gobws.MaskFrameInPlace(gobws.NewFrame(op, true, bytes.Clone(p)))
	if err := gobws.WriteFrame(&buf, f); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// BenchmarkFanOut is one event sent to 64 viewers: each op is one Exec
// with a send to every client, and every client reading it.
func BenchmarkFanOut(b *testing.B) {
	const clients = 64
	s, addr := startServer(b, contract.StartRequest{PingInterval: time.Hour, PeerTimeout: 2 * time.Hour})
	r := link(b, s)
	cs := make([]*client, clients)
	cmds := make([]contract.Command, clients)
	msg := []byte(`{"jsonrpc":"2.0","method":"event","params":{"type":"message.delta","session_id":"715a4d18","seq":42,"payload":{"text":"word "}}}`)
	for i := range cs {
		cs[i] = dial(b, addr, "/api/ws", nil)
		id := r.opened(b, cs[i]).Conn
		exec(b, s, admit(id))
		cmds[i] = contract.Command{Kind: contract.CommandSend, Conn: id, Data: msg}
	}
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for _, c := range cs {
		wg.Go(func() {
			for range b.N {
				h, err := gobws.ReadHeader(c.r)
				if err == nil && h.Length != int64(len(msg)) {
					err = fmt.Errorf("got a frame of %d bytes, want %d", h.Length, len(msg))
				}
				if err == nil {
					_, err = io.CopyN(io.Discard, c.r, h.Length)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for range b.N {
		exec(b, s, cmds...)
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatalf("client read: %v", err)
	}
}
