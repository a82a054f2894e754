package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// A session on a host: create it, submit a prompt, and read the events
// of the run until message.complete.
func ExampleDial() {
	host := startExampleHost()
	defer host.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The URL as tether serve prints it: its token goes in a header.
	c, err := client.Dial(ctx, host.url+"/?token=T", client.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	fmt.Println("host version", c.Version())

	snap, err := c.Create(ctx, wire.CreateParams{Title: "demo"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := c.Submit(ctx, snap.SessionID, "hello there"); err != nil {
		fmt.Println(err)
		return
	}
	for e := range c.Events() {
		switch e.Type {
		case wire.EventMessageDelta:
			var d wire.MessageDelta
			_ = e.Decode(&d)
			fmt.Printf("seq %d delta %q\n", e.Seq, d.Text)
		case wire.EventMessageComplete:
			var m wire.MessageComplete
			_ = e.Decode(&m)
			fmt.Printf("seq %d complete %q %s\n", e.Seq, m.Text, m.Status)
			_, err := c.Resume(ctx, wire.ResumeParams{SessionID: "no-such-key"})
			fmt.Println("resume unknown:", client.IsCode(err, wire.CodeStoredNotFound))
			return
		}
	}
	// Output:
	// host version example
	// seq 2 delta "hello "
	// seq 3 delta "there"
	// seq 4 complete "hello there" complete
	// resume unknown: true
}

// A PTY attachment that survives a dropped connection: the reattach asks
// for what follows the bytes already read, and the host sends only those.
func ExampleAttachPTY() {
	host := startExampleHost()
	defer host.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	token := "0123456789abcdef"
	p, err := client.AttachPTY(ctx, host.url, token, client.PTYOptions{Options: client.Options{Token: "T"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for {
		out, err := readAll(p)
		fmt.Printf("%s %q, offset %d\n", p.Replay().Reason, out, p.Offset())
		if !client.Retryable(err) {
			fmt.Println("ended:", err)
			return
		}
		next, err := p.Reattach(ctx, func(n int) (time.Duration, bool) { return 10 * time.Millisecond << n, n < 5 })
		if err != nil {
			fmt.Println(err)
			return
		}
		p = next
	}
	// Output:
	// initial "first ", offset 6
	// resume "second", offset 12
	// ended: connection closed with 4410 "exited"
}

func readAll(p *client.PTY) (string, error) {
	var b strings.Builder
	buf := make([]byte, 1024)
	for {
		n, err := p.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String(), err
		}
	}
}

func ExampleRetryable() {
	for _, err := range []error{
		&client.CloseError{Code: wire.CloseServiceRestart},
		&client.CloseError{Code: wire.CloseSuperseded},
		&client.DialError{URL: "ws://h/api/pty", Err: errors.New("connection refused")},
	} {
		fmt.Println(err, client.Retryable(err))
	}
	// Output:
	// connection closed with 1012 true
	// connection closed with 4409 false
	// dial ws://h/api/pty: connection refused true
}

// exampleHost is a tiny stand-in for a host: an echo gateway on /api/ws
// and, on /api/pty, a PTY that writes "first " and drops the connection,
// then on a reattach from offset 6 writes "second" and exits.
type exampleHost struct {
	url string
	ln  net.Listener
	wg  sync.WaitGroup
}

func startExampleHost() *exampleHost {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	h := &exampleHost{url: "http://" + ln.Addr().String(), ln: ln}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				defer nc.Close()
				var uri string
				if _, err := (ws.Upgrader{OnRequest: func(b []byte) error { uri = string(b); return nil }}).Upgrade(nc); err != nil {
					return
				}
				if strings.HasPrefix(uri, wire.PathPTY) {
					examplePTY(nc, uri)
				} else {
					exampleGateway(nc)
				}
			}()
		}
	}()
	return h
}

func (h *exampleHost) stop() {
	_ = h.ln.Close()
	h.wg.Wait()
}

func examplePTY(nc net.Conn, uri string) {
	send := func(v any) { b, _ := json.Marshal(v); _ = wsutil.WriteServerText(nc, b) }
	if strings.Contains(uri, "offset=6") {
		send(wire.Replay{Type: wire.ReplayType, Epoch: "e1", ReplayEndOffset: 6, Reason: wire.ReasonResume})
		_ = wsutil.WriteServerBinary(nc, []byte("second"))
		_ = ws.WriteFrame(nc, ws.NewCloseFrame(ws.NewCloseFrameBody(wire.CloseProcessExited, "exited")))
		_, _ = io.Copy(io.Discard, nc)
		return
	}
	send(wire.Replay{Type: wire.ReplayType, Epoch: "e1", Reset: true, Reason: wire.ReasonInitial})
	_ = wsutil.WriteServerBinary(nc, []byte("first "))
	// Dropped without a close frame (1006): the client reattaches.
}

func exampleGateway(nc net.Conn) {
	var wmu sync.Mutex
	send := func(v any) {
		b, _ := json.Marshal(v)
		wmu.Lock()
		defer wmu.Unlock()
		_ = wsutil.WriteServerText(nc, b)
	}
	event := func(e wire.Event) {
		b, _ := wire.NewEvent(e)
		wmu.Lock()
		defer wmu.Unlock()
		_ = wsutil.WriteServerText(nc, b)
	}
	event(wire.Event{Type: wire.EventReady, Payload: json.RawMessage(`{"version":"example"}`)})
	seq := uint64(0)
	for {
		msg, _, err := wsutil.ReadClientData(nc)
		if err != nil {
			return
		}
		var req wire.Request
		_ = json.Unmarshal(msg, &req)
		reply := func(result any) {
			b, _ := json.Marshal(result)
			send(wire.Response{JSONRPC: "2.0", ID: req.ID, Result: b})
		}
		switch req.Method {
		case wire.MethodCreate:
			reply(wire.Snapshot{SessionID: "0123abcd", SessionKey: "20250101_120000_abcdef", Title: "demo", Status: wire.StatusIdle, Epoch: "e"})
		case wire.MethodSubmit:
			var p wire.SubmitParams
			_ = json.Unmarshal(req.Params, &p)
			reply(wire.SubmitResult{Status: wire.SubmitStreaming, RunID: "r1"})
			emit := func(typ string, payload any) {
				seq++
				b, _ := json.Marshal(payload)
				event(wire.Event{Type: typ, SessionID: p.SessionID, Seq: seq, Payload: b})
			}
			emit(wire.EventMessageStart, wire.MessageStart{RunID: "r1"})
			words := strings.SplitAfter(p.Text, " ")
			for _, w := range words {
				emit(wire.EventMessageDelta, wire.MessageDelta{Text: w})
			}
			emit(wire.EventMessageComplete, wire.MessageComplete{Text: p.Text, Status: wire.RunComplete})
		default:
			send(wire.Response{JSONRPC: "2.0", ID: req.ID, Error: &wire.ErrorObject{Code: wire.CodeStoredNotFound, Message: "stored session not found"}})
		}
	}
}
