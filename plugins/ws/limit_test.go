package ws_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	osexec "os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
	"github.com/tether-agent/tether/wire"
)

// rawDial opens a TCP connection to addr and sends nothing.
func rawDial(t testing.TB, addr string) net.Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, waitTimeout)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// readAll reads nc until the server closes it and returns what came.
func readAll(t testing.TB, nc net.Conn) (string, error) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(waitTimeout))
	b, err := io.ReadAll(nc)
	if errors.Is(err, syscall.ECONNRESET) {
		err = nil // closed: what matters is what arrived before
	}
	return string(b), err
}

// want503 checks that resp is the connection limit's response.
func want503(t testing.TB, resp string) {
	t.Helper()
	r, err := http.ReadResponse(bufio.NewReader(strings.NewReader(resp)), nil)
	if err != nil {
		t.Fatalf("reading the response %q: %v", resp, err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status: got %d, want 503", r.StatusCode)
	}
	if !r.Close || !strings.Contains(resp, "\r\nConnection: close\r\n") {
		t.Errorf("response %q: want Connection: close", resp)
	}
	if !strings.Contains(string(body), "too many open connections") {
		t.Errorf("body: got %q, want it to say why", body)
	}
}

// waitFor polls cond until it holds, failing after waitTimeout. It is for
// state another process or the kernel changes, with no event to wait on.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: timed out after %v", what, waitTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func stats(t testing.TB, s contract.StatsReporter) contract.TransportStats {
	t.Helper()
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return st
}

// TestMaxConnections fills the bound with every kind of connection that
// counts (TCP connections that sent nothing, an idle HTTP keep-alive
// connection, an upgraded WebSocket), then checks that the next one gets
// a 503 and is counted, and that a closed connection frees its place.
func TestMaxConnections(t *testing.T) {
	const max = 50
	s, addr := startServer(t, contract.StartRequest{MaxConnections: max})
	r := link(t, s)

	wsc := dial(t, addr, "/api/ws", nil)
	wsID := r.opened(t, wsc).Conn
	keepAlive := rawDial(t, addr)
	if _, err := io.WriteString(keepAlive, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(keepAlive), nil)
	if err != nil {
		t.Fatalf("keep-alive request: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("keep-alive request: got %d (close %v), want 200 kept alive", resp.StatusCode, resp.Close)
	}
	for range max - 2 {
		rawDial(t, addr)
	}

	over := rawDial(t, addr)
	out, err := readAll(t, over)
	if err != nil {
		t.Fatalf("connection %d: %v", max+1, err)
	}
	want503(t, out)
	// Accepted in order: the max before it are counted.
	if st := stats(t, s); st.Connections != max || st.Refused503 != 1 {
		t.Errorf("Stats: got %+v, want %d open, 1 refused", st, max)
	}

	// A request on a refused connection is answered the same way.
	over = rawDial(t, addr)
	if _, err := io.WriteString(over, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	out, _ = readAll(t, over)
	want503(t, out)

	// The WebSocket's end frees a place.
	exec(t, s, contract.Command{Kind: contract.CommandClose, Conn: wsID, Code: wire.CloseNormal})
	wsc.mustReadClose()
	r.closed(t, wsID)
	waitFor(t, "the closed WebSocket's place", func() bool { return stats(t, s).Connections == max-1 })
	if status, body := httpDo(t, http.MethodGet, "http://"+addr+"/healthz"); status != http.StatusOK || body != "ok" {
		t.Errorf("GET /healthz with a place free: got %d %q, want 200 ok", status, body)
	}
	if st := stats(t, s); st.Refused503 != 2 {
		t.Errorf("Stats: got %d refused, want 2", st.Refused503)
	}
}

// TestHeaderTimeout checks that a connection whose request headers do not
// all arrive within the header timeout is closed, and its place freed.
func TestHeaderTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	s, addr := startServer(t, contract.StartRequest{HeaderTimeout: timeout})
	tests := []struct {
		name string
		send string
	}{
		{"silent", ""},
		{"half a request line", "GET /healthz HT"},
		{"headers never ended", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now() // before the dial: the server's clock starts after it
			nc := rawDial(t, addr)
			if _, err := io.WriteString(nc, tt.send); err != nil {
				t.Fatal(err)
			}
			out, err := readAll(t, nc)
			elapsed := time.Since(start)
			if err != nil {
				t.Fatalf("read: got %v, want the server to close", err)
			}
			if strings.Contains(out, " 200 ") {
				t.Errorf("got a response %q to an incomplete request", out)
			}
			if elapsed < timeout {
				t.Errorf("closed after %v, want no sooner than the header timeout %v", elapsed, timeout)
			}
		})
	}
	waitFor(t, "every place freed", func() bool { return stats(t, s).Connections == 0 })

	// A request that completes in time is served.
	if status, _ := httpDo(t, http.MethodGet, "http://"+addr+"/healthz"); status != http.StatusOK {
		t.Errorf("GET /healthz: got %d, want 200", status)
	}
}

// TestDefaultLimits checks that the zero StartRequest applies the
// documented default bound (lowered only by a smaller fd limit).
func TestDefaultLimits(t *testing.T) {
	s := ws.New(testLogger(t))
	resp, err := s.Start(context.Background(), contract.StartRequest{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background(), contract.StopRequest{}) })
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	want := min(ws.DefaultMaxConnections, int(rl.Cur)-max(64, int(rl.Cur)/32))
	if resp.MaxConnections != want {
		t.Errorf("StartResponse.MaxConnections: got %d, want %d (fd limit %d)", resp.MaxConnections, want, rl.Cur)
	}
}

func TestStatsBeforeStart(t *testing.T) {
	s := ws.New(testLogger(t))
	if _, err := s.Stats(context.Background()); !errors.Is(err, contract.ErrNotStarted) {
		t.Errorf("Stats before Start: got %v, want ErrNotStarted", err)
	}
}

// The helper process: a Server in a process of its own whose file
// descriptor limit it lowers, driven by commands on stdin.
const (
	helperEnv    = "TETHER_WS_TEST_HELPER"
	helperNoFile = "TETHER_WS_TEST_NOFILE"
)

// helperMain runs the helper process. It prints "addr ADDR MAX", then
// answers each command line: "stats" → "stats OPEN REFUSED"; "exhaust"
// (open files until the fd limit) → "exhausted N"; "release" (close
// them) → "released". At the end of stdin it stops the server.
func helperMain() int {
	log := zerolog.New(os.Stderr)
	if n, err := strconv.ParseUint(os.Getenv(helperNoFile), 10, 64); err == nil {
		var rl syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			log.Error().Err(err).Msg("getrlimit")
			return 1
		}
		rl.Cur = n
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			log.Error().Err(err).Msg("setrlimit")
			return 1
		}
	}
	s := ws.New(log)
	ctx := context.Background()
	resp, err := s.Start(ctx, contract.StartRequest{Listen: "127.0.0.1:0"})
	if err != nil {
		log.Error().Err(err).Msg("start")
		return 1
	}
	fmt.Printf("addr %s %d\n", resp.Addr, resp.MaxConnections)
	var held []*os.File
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "stats":
			st, _ := s.Stats(ctx)
			fmt.Printf("stats %d %d\n", st.Connections, st.Refused503)
		case "exhaust":
			for {
				f, err := os.Open(os.DevNull)
				if err != nil {
					break
				}
				held = append(held, f)
			}
			fmt.Printf("exhausted %d\n", len(held))
		case "release":
			for _, f := range held {
				f.Close()
			}
			held = nil
			fmt.Println("released")
		}
	}
	if err := s.Stop(ctx, contract.StopRequest{}); err != nil {
		log.Error().Err(err).Msg("stop")
		return 1
	}
	return 0
}

// syncBuffer is a bytes.Buffer safe for one writer and readers.
type syncBuffer struct {
	mu sync.Mutex // guards the field below
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// helper is the test's side of a helper process.
type helper struct {
	t     testing.TB
	in    io.WriteCloser
	out   *bufio.Scanner
	addr  string
	max   int
	errs  *syncBuffer
	ended chan error
}

func startHelper(t testing.TB, nofile int) *helper {
	t.Helper()
	cmd := osexec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperNoFile+"="+strconv.Itoa(nofile))
	h := &helper{t: t, errs: new(syncBuffer), ended: make(chan error, 1)}
	cmd.Stderr = h.errs
	var err error
	if h.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h.out = bufio.NewScanner(stdout)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { h.ended <- cmd.Wait() }()
	t.Cleanup(func() {
		h.in.Close() // the helper stops its server and exits
		select {
		case err := <-h.ended:
			if err != nil {
				t.Errorf("helper: %v; its log:\n%s", err, h.errs)
			}
		case <-time.After(waitTimeout):
			_ = cmd.Process.Kill()
			<-h.ended
			t.Errorf("helper did not exit; its log:\n%s", h.errs)
		}
	})
	line := h.line()
	if _, err := fmt.Sscanf(line, "addr %s %d", &h.addr, &h.max); err != nil {
		t.Fatalf("helper said %q, want addr ADDR MAX: %v", line, err)
	}
	return h
}

// line reads the helper's next line of output.
func (h *helper) line() string {
	h.t.Helper()
	got := make(chan string, 1)
	go func() {
		if h.out.Scan() {
			got <- h.out.Text()
			return
		}
		got <- ""
	}()
	select {
	case l := <-got:
		if l == "" {
			h.t.Fatalf("helper output ended; its log:\n%s", h.errs)
		}
		return l
	case <-time.After(waitTimeout):
		h.t.Fatalf("helper said nothing for %v; its log:\n%s", waitTimeout, h.errs)
		return ""
	}
}

// do sends a command and returns the helper's answer.
func (h *helper) do(cmd string) string {
	h.t.Helper()
	if _, err := io.WriteString(h.in, cmd+"\n"); err != nil {
		h.t.Fatalf("helper %s: %v", cmd, err)
	}
	return h.line()
}

func (h *helper) stats() (open int64, refused uint64) {
	h.t.Helper()
	l := h.do("stats")
	if _, err := fmt.Sscanf(l, "stats %d %d", &open, &refused); err != nil {
		h.t.Fatalf("helper said %q to stats: %v", l, err)
	}
	return open, refused
}

// TestFDLimit runs a Server in a process whose fd limit is 256, with the
// default bound of 20000: the bound must be lowered so that a 503 comes
// before accept runs out of descriptors. Then, with every descriptor
// taken by other files, a new connection must still get an answer (the
// spare descriptor) instead of hanging in the backlog, and once files are
// closed the server serves again.
func TestFDLimit(t *testing.T) {
	const nofile = 256
	h := startHelper(t, nofile)
	if want := nofile - 64; h.max != want {
		t.Fatalf("MaxConnections: got %d, want %d (fd limit %d minus the reserve)", h.max, want, nofile)
	}

	held := make([]net.Conn, 0, h.max)
	for range h.max {
		held = append(held, rawDial(t, h.addr))
	}
	for range 5 {
		out, err := readAll(t, rawDial(t, h.addr))
		if err != nil {
			t.Fatalf("over the bound: %v", err)
		}
		want503(t, out)
	}
	if open, refused := h.stats(); open != int64(h.max) || refused != 5 {
		t.Errorf("stats: got %d open, %d refused; want %d, 5", open, refused, h.max)
	}

	for _, nc := range held {
		nc.Close()
	}
	waitFor(t, "the closed connections' places", func() bool { open, _ := h.stats(); return open == 0 })

	l := h.do("exhaust")
	var n int
	if _, err := fmt.Sscanf(l, "exhausted %d", &n); err != nil || n == 0 {
		t.Fatalf("helper said %q to exhaust", l)
	}
	for i := range 3 {
		nc, err := net.DialTimeout("tcp", h.addr, waitTimeout)
		if err != nil {
			t.Fatalf("with no descriptor left, dial %d: %v; helper log:\n%s", i, err, h.errs)
		}
		t.Cleanup(func() { nc.Close() })
		if _, err := io.WriteString(nc, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		out, err := readAll(t, nc)
		if err != nil {
			t.Fatalf("with no descriptor left, connection %d: %v (want an answer, not a hang); helper log:\n%s", i, err, h.errs)
		}
		if !strings.Contains(out, " 503 ") {
			t.Fatalf("with no descriptor left, connection %d: got %q, want a 503; helper log:\n%s", i, out, h.errs)
		}
		want503(t, out)
	}
	if _, refused := h.stats(); refused != 8 {
		t.Errorf("stats: got %d refused, want 8", refused)
	}
	if l := h.do("release"); l != "released" {
		t.Fatalf("helper said %q to release", l)
	}
	nc := rawDial(t, h.addr)
	if _, err := io.WriteString(nc, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if out, _ := readAll(t, nc); !strings.HasPrefix(out, "HTTP/1.1 200 ") {
		t.Errorf("after the files were closed: got %q, want 200", out)
	}
}
