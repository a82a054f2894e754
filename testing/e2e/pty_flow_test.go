package e2e_test

import (
	"crypto/sha256"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/tether-agent/tether/testing/e2e"
)

// TestPTYFastWriterComplete: a child that writes many times its ring as
// fast as it can and exits at once is slowed down to what the client
// takes (SPEC §6.1): the client receives every byte, in order, then 4410.
func TestPTYFastWriterComplete(t *testing.T) {
	const size = 6 << 20
	// Letters only: a terminal passes them through unchanged.
	const abc = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	r := rand.New(rand.NewPCG(uint64(os.Getpid()), 7))
	want := make([]byte, size)
	for i := range want {
		want[i] = abc[r.IntN(len(abc))]
	}
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
