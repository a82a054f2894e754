package main

// The baseline servers. Each runs as its own process (`tetherbench helper
// KIND`), listens on 127.0.0.1:0 and prints its address as its first
// stdout line, so that it is measured like tether: a separate process
// behind a loopback socket, driven by the same client.

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	coderws "github.com/coder/websocket"
	"github.com/creack/pty"
	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	gorillaws "github.com/gorilla/websocket"
)

// readyFrame is what every baseline sends first, as tether sends
// gateway.ready, so that clients wait for the same thing.
var readyFrame = []byte(`{"jsonrpc":"2.0","method":"event","params":{"type":"gateway.ready","payload":{"version":"baseline"}}}`)

func runHelper(args []string) int {
	if len(args) < 1 {
		fmt.Fprintln(os.Stderr, "helper: which?")
		return 2
	}
	if args[0] == "perfreport" {
		// Rewrite the tables of -perf recordings: perfreport FILE.data...
		for _, f := range args[1:] {
			if err := writePerfTables(f, strings.TrimSuffix(filepath.Base(f), ".data"), "", 0, 0); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		return 0
	}
	if args[0] == "relay-echo" {
		// The relay's second process: echo length-prefixed messages on a
		// unix socket.
		return relayEcho(args[1:])
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(ln.Addr().String())
	switch args[0] {
	case "ptydirect":
		if len(args) != 2 {
			fmt.Fprintln(os.Stderr, "helper ptydirect SCRIPT")
			return 2
		}
		serveGobwas(ln, func(c net.Conn, path string) { ptyDirect(c, path, args[1]) })
	case "echo":
		serveGobwas(ln, gobwasEcho)
	case "gobwas":
		serveGobwas(ln, gobwasEcho)
	case "fanout":
		serveFanout(ln)
	case "gobwas-http":
		// gobwas/ws upgraded through net/http (ws.HTTPUpgrader), as the
		// WS plugin does: what the net/http path costs per socket.
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, _, _, err := ws.HTTPUpgrader{}.Upgrade(r, w)
			if err != nil {
				return
			}
			go gobwasEcho(c, "")
		}))
	case "wsprobe":
		if len(args) != 2 {
			fmt.Fprintln(os.Stderr, "helper wsprobe STATSFILE")
			return 2
		}
		return runWSProbe(ln, args[1])
	case "relay":
		sock, stop, err := startRelayEcho()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer stop()
		serveGobwas(ln, func(c net.Conn, _ string) { relay(c, sock) })
	case "gorilla":
		serveGorilla(ln)
	case "coder":
		serveCoder(ln)
	default:
		fmt.Fprintln(os.Stderr, "helper: unknown kind", args[0])
		return 2
	}
	return 0
}

// serveGobwas is the gobwas/ws way: accept, zero-copy upgrade on the raw
// connection, one goroutine per connection.
func serveGobwas(ln net.Listener, handle func(net.Conn, string)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			var path string
			u := ws.Upgrader{OnRequest: func(uri []byte) error { path = string(uri); return nil }}
			if _, err := u.Upgrade(c); err != nil {
				c.Close()
				return
			}
			handle(c, path)
		}()
	}
}

// gobwasEcho sends the ready frame and echoes every message.
func gobwasEcho(c net.Conn, _ string) {
	defer c.Close()
	if err := wsutil.WriteServerText(c, readyFrame); err != nil {
		return
	}
	for {
		msg, op, err := wsutil.ReadClientData(c)
		if err != nil {
			return
		}
		if err := wsutil.WriteServerMessage(c, op, msg); err != nil {
			return
		}
	}
}

// lockedConn serialises writes of two goroutines.
type lockedConn struct {
	net.Conn
	mu *sync.Mutex
}

func (l lockedConn) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.Conn.Write(p)
}

// ptyDirect is the direct PTY baseline: the child on a creack/pty PTY,
// its output pumped straight into the socket as binary frames, input
// written to the PTY; a close frame 4410 after the last byte. Path
// /replay?n=N instead sends N bytes at once (a floor for a replay).
func ptyDirect(nc net.Conn, path, script string) {
	defer nc.Close()
	c := lockedConn{Conn: nc, mu: new(sync.Mutex)}
	if n, ok := strings.CutPrefix(path, "/replay?n="); ok {
		size, _ := strconv.Atoi(n)
		buf := make([]byte, size)
		for rest := buf; len(rest) > 0; {
			k := min(len(rest), 64<<10)
			if wsutil.WriteServerBinary(c, rest[:k]) != nil {
				return
			}
			rest = rest[k:]
		}
		_ = ws.WriteFrame(c, ws.NewCloseFrame(ws.NewCloseFrameBody(ws.StatusNormalClosure, "")))
		_, _ = io.Copy(io.Discard, nc)
		return
	}
	cmd := exec.Command("sh", "-c", script)
	ptmx, err := pty.Start(cmd)
	if err != nil {
		_ = ws.WriteFrame(c, ws.NewCloseFrame(ws.NewCloseFrameBody(ws.StatusInternalServerError, err.Error())))
		return
	}
	defer ptmx.Close()
	go func() {
		for {
			msg, _, err := wsutil.ReadClientData(c)
			if err != nil {
				return
			}
			_, _ = ptmx.Write(msg)
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := ptmx.Read(buf)
		if n > 0 {
			if werr := wsutil.WriteServerBinary(c, buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = cmd.Wait()
	_ = ws.WriteFrame(c, ws.NewCloseFrame(ws.NewCloseFrameBody(4410, "process exited")))
}

// serveGorilla is the idiomatic gorilla/websocket server: net/http, the
// default Upgrader, the handler goroutine reading in a loop.
func serveGorilla(ln net.Listener) {
	up := gorillaws.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		if err := c.WriteMessage(gorillaws.TextMessage, readyFrame); err != nil {
			return
		}
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	})
	_ = http.Serve(ln, h)
}

// serveCoder is the idiomatic coder/websocket server: net/http, Accept,
// the handler goroutine reading in a loop.
func serveCoder(ln net.Listener) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := coderws.Accept(w, r, &coderws.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := context.Background()
		if err := c.Write(ctx, coderws.MessageText, readyFrame); err != nil {
			return
		}
		for {
			if _, _, err := c.Read(ctx); err != nil {
				return
			}
		}
	})
	_ = http.Serve(ln, h)
}

// startRelayEcho starts `helper relay-echo SOCK` and waits for its socket.
func startRelayEcho() (string, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	// An abstract socket: nothing is left on disk when the helpers are
	// killed.
	sock := fmt.Sprintf("@tetherbench-relay-%d", os.Getpid())
	cmd := exec.Command(self, "helper", "relay-echo", sock)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		_ = cmd.Process.Kill()
		return "", nil, fmt.Errorf("relay-echo: %w", err)
	}
	return sock, func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }, nil
}

func relayEcho(args []string) int {
	if len(args) != 1 {
		return 2
	}
	ln, err := net.Listen("unix", args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(args[0])
	for {
		c, err := ln.Accept()
		if err != nil {
			return 1
		}
		go func() {
			defer c.Close()
			br := bufio.NewReader(c)
			var hdr [4]byte
			var buf []byte
			for {
				if _, err := io.ReadFull(br, hdr[:]); err != nil {
					return
				}
				n := binary.BigEndian.Uint32(hdr[:])
				if cap(buf) < int(n)+4 {
					buf = make([]byte, int(n)+4)
				}
				buf = buf[:int(n)+4]
				copy(buf, hdr[:])
				if _, err := io.ReadFull(br, buf[4:]); err != nil {
					return
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
}

// relay is the floor of tether's split for one request: the WebSocket
// server hands each message over a unix socket to another process and
// writes back what comes back (one IPC round trip, no gRPC, no
// multiplexing, no JSON).
func relay(c net.Conn, sock string) {
	defer c.Close()
	u, err := net.Dial("unix", sock)
	if err != nil {
		return
	}
	defer u.Close()
	ur := bufio.NewReader(u)
	if err := wsutil.WriteServerText(c, readyFrame); err != nil {
		return
	}
	var hdr [4]byte
	for {
		msg, op, err := wsutil.ReadClientData(c)
		if err != nil {
			return
		}
		out := make([]byte, 4+len(msg))
		binary.BigEndian.PutUint32(out, uint32(len(msg)))
		copy(out[4:], msg)
		if _, err := u.Write(out); err != nil {
			return
		}
		if _, err := io.ReadFull(ur, hdr[:]); err != nil {
			return
		}
		back := make([]byte, binary.BigEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(ur, back); err != nil {
			return
		}
		if err := wsutil.WriteServerMessage(c, op, back); err != nil {
			return
		}
	}
}
