package host

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/host/store"
)

// findings indexes Diagnose's answer by check.
func findings(t *testing.T, cfg DoctorConfig) map[string]Finding {
	t.Helper()
	m := map[string]Finding{}
	for _, f := range Diagnose(context.Background(), cfg) {
		m[f.Check] = f
	}
	return m
}

// TestDoctorFindsPlantedProblems plants each problem doctor looks for in
// a state dir and checks that it is found, with a fix, and that a sound
// state dir passes every check.
func TestDoctorFindsPlantedProblems(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSession(context.Background(), store.Session{Key: store.NewKey(time.Now()), Title: "x", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()
	cfg := DoctorConfig{StateDir: dir, Listen: freeAddr}
	for check, f := range findings(t, cfg) {
		if !f.OK {
			t.Errorf("sound state dir: %s failed: %s", check, f.Detail)
		}
	}

	// Plant the problems.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "token"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "plugins"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plugins", "pty.json"), []byte(`{"protocol":"grpc","network":"unix","address":"/nonexistent/plugin1","pid":999999999,"started":12}`), 0o600); err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	db := filepath.Join(dir, "state.db")
	b, _ := os.ReadFile(db)
	for i := 4096; i < len(b); i++ {
		b[i] ^= 0x5a
	}
	os.Remove(db + "-wal")
	os.Remove(db + "-shm")
	if err := os.WriteFile(db, b, 0o600); err != nil {
		t.Fatal(err)
	}
	got := findings(t, DoctorConfig{StateDir: dir, Listen: taken.Addr().String(), MinFree: 1 << 62})
	for _, check := range []string{"state dir", "token file", "pty plugin", "port", "database", "disk"} {
		f, ok := got[check]
		if !ok || f.OK || f.Fix == "" {
			t.Errorf("planted problem %q: got %+v, want a failed check with a fix", check, f)
		}
	}
	if f := got["state dir"]; !strings.Contains(f.Fix, "chmod 700") {
		t.Errorf("state dir fix %q, want chmod 700", f.Fix)
	}

	// The problems that cannot sit beside those, in a second state dir:
	// a 0-byte state.db, an empty token file, a malformed reattach
	// record, and a host that holds the lock but does not answer on its
	// control socket (hung; here: the lock taken, no socket at all).
	dir2 := t.TempDir()
	if err := os.Chmod(dir2, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir2, "state.db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir2, "token"), []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir2, "plugins"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir2, "plugins", "pty.json"), []byte(`{"protocol":"grpc","pid":`), 0o600); err != nil {
		t.Fatal(err)
	}
	lock, err := lockStateDir(dir2)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.unlock()
	got = findings(t, DoctorConfig{StateDir: dir2, Listen: freeAddr})
	for _, tc := range []struct{ check, detail, fix string }{
		{"database", "is empty", "backup"},
		{"token file", "is empty", "remove it"},
		{"pty plugin", "pty.json", "remove " + filepath.Join(dir2, "plugins", "pty.json")},
		{"host", fmt.Sprintf("a host (pid %d) holds the lock but its control socket does not answer", os.Getpid()), fmt.Sprintf("kill %d", os.Getpid())},
	} {
		f, ok := got[tc.check]
		if !ok || f.OK || !strings.Contains(f.Detail, tc.detail) || !strings.Contains(f.Fix, tc.fix) {
			t.Errorf("planted problem %q: got %+v, want a failed check saying %q with a fix saying %q", tc.check, f, tc.detail, tc.fix)
		}
	}
	if f := got["state dir"]; !f.OK {
		t.Errorf("state dir 0700 failed: %+v", f)
	}
}
