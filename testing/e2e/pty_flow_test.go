package e2e_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/tether-agent/tether/testing/e2e"
)

// TestPTYFastWriterComplete: a child that writes many times its ring as
// fast as it can and exits at once is slowed down to what the client
// takes (docs/PROTOCOL.md, 13.7): the client receives every byte, in order, then 4410.
func TestPTYFastWriterComplete(t *testing.T) {
	const size = 6 << 20
	want := letterPayload(size)
	path := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-buffer", "64KiB", "--pty-command", "cat " + path}})
	c := ptyDial(t, s, "attach="+attachToken(t))
	if rp := replayOf(t, c); rp.StartOffset != 0 || !rp.Reset || rp.Reason != "initial" {
		t.Fatalf("pty.replay %+v, want an initial replay from 0", rp)
	}
	if code := closeCode(t, c); code != 4410 {
		t.Fatalf("close code %d after %d of %d bytes, want 4410", code, len(c.Output()), size)
	}
	got := c.Output()
	if sha256.Sum256(got) != sha256.Sum256(want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		t.Fatalf("got %d bytes, want %d: they differ from offset %d", len(got), len(want), i)
	}
}

// TestPTYSlowViewerCut: a view=1 socket that stops reading does not slow
// the PTY down for ever: it is closed with 1013 once its transport queue
// overflows (docs/PROTOCOL.md, 13.7), and the writer, which reads, receives every byte
// of a stream far larger than that queue, then 4410.
func TestPTYSlowViewerCut(t *testing.T) {
	const size = 24 << 20 // well over the 8 MiB send queue and the kernel's socket buffers
	want := letterPayload(size)
	path := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	// The child writes the payload in 64 KiB pieces with a short pause
	// after each (at most ~12 MiB/s): a reading client keeps up even on a
	// loaded machine, so only the viewer that reads nothing overflows its
	// 8 MiB send queue.
	paced := `sh -c 'stty -echo; read f; i=0; while [ $i -lt ` + fmt.Sprint(size>>16) + ` ]; do dd if="$f" bs=65536 skip=$i count=1 2>/dev/null; sleep 0.005; i=$((i+1)); done'`
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", paced}})
	tok := attachToken(t)
	w := ptyDial(t, s, "attach="+tok)
	replayOf(t, w)

	// The viewer reads its pty.replay frame, then nothing more.
	conn, br, _, err := ws.Dial(ctxT(t, 10*time.Second), s.WSURL("/api/pty?view=1&attach="+tok))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var r io.Reader = conn
	if br != nil {
		r = io.MultiReader(br, conn)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if p, op, err := wsutil.ReadServerData(struct {
		io.Reader
		io.Writer
	}{r, conn}); err != nil || op != ws.OpText || !strings.Contains(string(p), `"pty.replay"`) {
		t.Fatalf("viewer: got %q (op %v, %v), want its pty.replay frame", p, op, err)
	}

	if err := w.Write([]byte(path + "\r")); err != nil {
		t.Fatal(err)
	}
	if code := closeCode(t, w); code != 4410 {
		t.Fatalf("writer: close code %d after %d of %d bytes, want 4410", code, len(w.Output()), size)
	}
	got := w.Output()
	if !bytes.HasSuffix(got, want) || len(got) > size+len(path)+8 {
		t.Fatalf("writer: got %d bytes, want the payload's %d (after at most the echo of its path)", len(got), size)
	}

	// The viewer was cut: reading on, it finds the end of its stream well
	// before the payload's end — a 1013 close frame if it still reaches it.
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	var n int
	for {
		h, err := ws.ReadHeader(r)
		if err != nil {
			t.Logf("viewer: connection ended (%v) after %d bytes", err, n)
			break // torn down after the close grace
		}
		p := make([]byte, h.Length)
		if _, err := io.ReadFull(r, p); err != nil {
			t.Logf("viewer: connection ended (%v) in a frame after %d bytes", err, n)
			break
		}
		if h.OpCode == ws.OpClose {
			if h.Masked {
				ws.Cipher(p, h.Mask, 0)
			}
			code, _ := ws.ParseCloseFrameData(p)
			if code != 1013 {
				t.Errorf("viewer: close code %d, want 1013", code)
			}
			t.Logf("viewer: closed %d after %d bytes", code, n)
			break
		}
		n += len(p)
	}
	if n >= size {
		t.Errorf("viewer: got all %d bytes without reading: want it cut", n)
	}
}

// letterPayload returns n pseudo-random letters (a terminal passes them
// through unchanged).
func letterPayload(n int) []byte {
	const abc = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	r := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(n)))
	p := make([]byte, n)
	for i := range p {
		p[i] = abc[r.IntN(len(abc))]
	}
	return p
}
