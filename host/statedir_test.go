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
