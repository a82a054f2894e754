package host

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// TestStateDirLock: a second lock of a held state dir fails at once and
// names the holder's pid; once let go, the dir can be locked again and
// names no holder.
func TestStateDirLock(t *testing.T) {
	dir := t.TempDir()
	l, err := lockStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if pid, err := LockHolder(dir); err != nil || pid != os.Getpid() {
		t.Errorf("LockHolder = %d, %v; want this process, %d", pid, err, os.Getpid())
	}
	_, err = lockStateDir(dir)
	if !errors.Is(err, ErrStateDirInUse) {
		t.Fatalf("second lock: %v, want ErrStateDirInUse", err)
	}
	if want := "is in use by pid " + strconv.Itoa(os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("second lock: %q does not say %q", err, want)
	}
	l.unlock()
	if pid, err := LockHolder(dir); err != nil || pid != 0 {
		t.Errorf("LockHolder after unlock = %d, %v; want 0", pid, err)
	}
	l2, err := lockStateDir(dir)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	l2.unlock()
}

// TestSocketDir: a short state dir keeps its sockets in plugins/; one
// whose socket paths would be too long gets a private directory under the
// temp dir, the same for every caller.
func TestSocketDir(t *testing.T) {
	short := t.TempDir()
	if got, want := SocketDir(short), filepath.Join(short, "plugins"); got != want {
		t.Errorf("SocketDir(%s) = %s, want %s", short, got, want)
	}
	long := filepath.Join(short, strings.Repeat("d", 120))
	got := SocketDir(long)
	if !strings.HasPrefix(got, os.TempDir()) || got != SocketDir(long) {
		t.Fatalf("SocketDir(long) = %s: want a stable directory under %s", got, os.TempDir())
	}
	if len(filepath.Join(got, "plugin0123456789")) > 103 {
		t.Errorf("SocketDir(long) = %s is still too long for a socket path", got)
	}
	t.Cleanup(func() { os.RemoveAll(got) })
	if err := makeSocketDir(got, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(got); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("socket dir mode = %v, %v; want 0700", fi.Mode(), err)
	}
}

// TestHostIDNeverThroughLink: the host-id file is made 0600 once and read
// again after; an empty one is filled; a link there — to a file or
// dangling — is refused and its target neither read nor written.
func TestHostIDNeverThroughLink(t *testing.T) {
	dir := t.TempDir()
	id, err := HostID(dir, "")
	if err != nil || !strings.HasPrefix(id, "host-") {
		t.Fatalf("HostID = %q, %v", id, err)
	}
	path := filepath.Join(dir, hostIDFile)
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("host-id: %v (%v), want 0600", fi.Mode(), err)
	}
	if again, err := HostID(dir, ""); err != nil || again != id {
		t.Errorf("HostID again = %q, %v; want %q", again, err, id)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if filled, err := HostID(dir, ""); err != nil || filled == "" {
		t.Errorf("HostID of an empty file = %q, %v", filled, err)
	}
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("host-of-someone-else\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{target, filepath.Join(t.TempDir(), "missing")} {
		os.Remove(path)
		if err := os.Symlink(to, path); err != nil {
			t.Fatal(err)
		}
		if got, err := HostID(dir, ""); !errors.Is(err, ErrStateDirNotTrusted) || got != "" {
			t.Errorf("host-id linked to %s: %q, %v; want refused", to, got, err)
		}
		if _, err := os.Lstat(filepath.Join(filepath.Dir(to), "missing")); to != target && err == nil {
			t.Errorf("a host-id was created through the dangling link")
		}
	}
	if b, _ := os.ReadFile(target); string(b) != "host-of-someone-else\n" {
		t.Errorf("the link's target now holds %q", b)
	}
	if got, err := HostID(dir, "given"); err != nil || got != "given" {
		t.Errorf("a given id: %q, %v", got, err)
	}
}
