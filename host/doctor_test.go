package host

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/internal/statedir"
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

// TestDoctorAndServeAgree: for each problem planted in a state dir, the
// reason tether serve refuses it with (PrepareStateDir) is, word for
// word, a failed finding of tether doctor with the same fix — one check
// for both — and doctor changes nothing while serve would.
func TestDoctorAndServeAgree(t *testing.T) {
	type plant func(t *testing.T, dir string)
	file := func(name string, mode os.FileMode) plant {
		return func(t *testing.T, dir string) {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, []byte("x\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, mode); err != nil {
				t.Fatal(err)
			}
		}
	}
	link := func(name, to string) plant {
		return func(t *testing.T, dir string) {
			if err := os.Symlink(to, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name  string
		root  bool
		plant plant
	}{
		{"group-writable WAL", false, file("state.db-wal", 0o660)},
		{"world-writable record dir", false, func(t *testing.T, dir string) {
			if err := os.Mkdir(filepath.Join(dir, "plugins"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(dir, "plugins"), 0o777); err != nil {
				t.Fatal(err)
			}
		}},
		{"symlinked lock", false, link("lock", "/etc/passwd")},
		{"dangling host-id", false, link("host-id", "/nonexistent/host-id")},
		{"symlinked token", false, link("token", "/etc/hostname")},
		{"group-writable state dir", false, func(t *testing.T, dir string) {
			if err := os.Chmod(dir, 0o770); err != nil {
				t.Fatal(err)
			}
		}},
		{"another user's token", true, func(t *testing.T, dir string) {
			file("token", 0o600)(t, dir)
			if err := os.Chown(filepath.Join(dir, "token"), 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}},
		{"another user's state dir", true, func(t *testing.T, dir string) {
			if err := os.Chown(dir, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root && os.Geteuid() != 0 {
				t.Skip("needs root: gives a file to another user (uid 65534)")
			}
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			tt.plant(t, dir)
			found := Diagnose(context.Background(), DoctorConfig{StateDir: dir})
			err := PrepareStateDir(dir, zerolog.Nop())
			var p *statedir.Problem
			if !errors.As(err, &p) || !errors.Is(err, ErrStateDirNotTrusted) {
				t.Fatalf("PrepareStateDir: %v, want a refusal", err)
			}
			agree := false
			for _, f := range found {
				if !f.OK && f.Detail == p.Detail() && f.Fix == p.Fix() {
					agree = true
				}
			}
			if !agree {
				t.Errorf("serve refuses with %q; doctor found %+v", err, found)
			}
		})
	}

	// A sound state dir: serve takes it, doctor finds nothing in it.
	dir := t.TempDir()
	if err := PrepareStateDir(dir, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	for _, f := range Diagnose(context.Background(), DoctorConfig{StateDir: dir}) {
		if !f.OK && f.Check != "port" {
			t.Errorf("sound state dir: %+v", f)
		}
	}
}

// TestStopRecordedPluginRefusesUntrusted: `tether plugins stop pty` with
// no host acts on the record and removes files, so it refuses a state
// dir that breaks the rules and touches nothing there.
func TestStopRecordedPluginRefusesUntrusted(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "plugins"), 0o700); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "record")
	rec := `{"protocol":"grpc","network":"unix","address":"` + filepath.Join(dir, "plugins", "sock") + `","pid":1,"started":1}`
	if err := os.WriteFile(target, []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "plugins", "pty.json")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := StopRecordedPlugin(context.Background(), dir, "pty", zerolog.Nop()); !errors.Is(err, ErrStateDirNotTrusted) {
		t.Fatalf("StopRecordedPlugin: %v, want refused", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "plugins", "pty.json")); err != nil {
		t.Errorf("the refused record was removed: %v", err)
	}
}
