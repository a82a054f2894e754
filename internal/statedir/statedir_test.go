package statedir

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// other is the uid of another user the tests hand files to (nobody).
const other = 65534

// TestJudge is the rule for one path, case by case.
func TestJudge(t *testing.T) {
	const me = 1000
	tests := []struct {
		name string
		e    entry
		kind Kind // 0: fine
	}{
		{"our 0700 state dir is fine", entry{fs.ModeDir | 0o700, me, true}, 0},
		{"our 0600 file is fine", entry{0o600, me, false}, 0},
		{"our 0700 plugin copy is fine", entry{0o700, me, false}, 0},
		{"our 0400 file is fine", entry{0o400, me, false}, 0},
		{"our socket is fine whatever its bits", entry{fs.ModeSocket | 0o777, me, false}, 0},
		{"a link is refused, even ours", entry{fs.ModeSymlink | 0o777, me, false}, Link},
		{"a state dir that is a link is refused", entry{fs.ModeSymlink | 0o777, me, true}, Link},
		{"a link of another user is a link first", entry{fs.ModeSymlink | 0o777, other, false}, Link},
		{"a state dir of another user is refused", entry{fs.ModeDir | 0o700, other, true}, Foreign},
		{"a file of another user is refused, even 0600", entry{0o600, other, false}, Foreign},
		{"a socket of another user is refused", entry{fs.ModeSocket | 0o700, other, false}, Foreign},
		{"a state dir that is a file is refused", entry{0o600, me, true}, Special},
		{"a FIFO is refused", entry{fs.ModeNamedPipe | 0o600, me, false}, Special},
		{"a device is refused", entry{fs.ModeDevice | fs.ModeCharDevice | 0o600, me, false}, Special},
		{"a group-writable state dir is refused", entry{fs.ModeDir | 0o770, me, true}, Writable},
		{"a world-writable state dir is refused", entry{fs.ModeDir | 0o707, me, true}, Writable},
		{"a sticky world-writable state dir is refused", entry{fs.ModeDir | fs.ModeSticky | 0o777, me, true}, Writable},
		{"a group-writable file is refused", entry{0o620, me, false}, Writable},
		{"a world-writable file is refused", entry{0o602, me, false}, Writable},
		{"a group-writable subdir is refused", entry{fs.ModeDir | 0o770, me, false}, Writable},
		{"our 0755 state dir is made private", entry{fs.ModeDir | 0o755, me, true}, Readable},
		{"our 0644 file is made private", entry{0o644, me, false}, Readable},
		{"our 0640 file is made private", entry{0o640, me, false}, Readable},
		{"our 0750 subdir is made private", entry{fs.ModeDir | 0o750, me, false}, Readable},
		{"our 0701 dir is made private", entry{fs.ModeDir | 0o701, me, false}, Readable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kind, bad := judge(tt.e, me)
			if bad != (tt.kind != 0) || kind != tt.kind {
				t.Errorf("judge(%v, uid %d) = %v, %v; want kind %v", tt.e.mode, tt.e.uid, kind, bad, tt.kind)
			}
		})
	}
}

// mustRoot skips a test that hands files to another user unless it runs
// as root (only root can chown).
func mustRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test gives files to another user (uid 65534) with chown")
	}
}

// stateDir makes a sound state dir like a host leaves: 0700, a token,
// a database with its WAL, a plugins dir with a record and a socket.
func stateDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"token", "state.db", "state.db-wal", "lock"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "plugins", "bin"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plugins", "pty.json"), []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plugins", "bin", "copy"), []byte("x"), 0o700); err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: filepath.Join(dir, "plugins", "control")}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// snapshot is every path under dir with its mode and content, to tell
// that a refusal changed nothing.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		b.WriteString(path + " " + fi.Mode().String())
		if fi.Mode().IsRegular() {
			c, _ := os.ReadFile(path)
			b.WriteString(" " + string(c))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestCheckAndPrepare plants each kind of problem in a sound state dir:
// Check names the path (and says what to do), Prepare refuses it with
// the same one-line reason and changes nothing at all, not even what it
// would otherwise mend. A sound state dir passes both.
func TestCheckAndPrepare(t *testing.T) {
	tests := []struct {
		name  string
		root  bool // hands a file to another user
		plant func(t *testing.T, dir string) string
		kind  Kind
		say   []string
	}{
		{"state dir of another user", true, func(t *testing.T, dir string) string {
			chown(t, dir)
			return dir
		}, Foreign, []string{"state dir", "belongs to uid 65534", "use a state dir of your own"}},
		{"planted token of another user", true, func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "token")
			chown(t, p)
			return p
		}, Foreign, []string{"token", "belongs to uid 65534", "remove it"}},
		{"a directory of another user", true, func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "plugins")
			chown(t, p)
			if err := os.Chmod(p, 0o700); err != nil {
				t.Fatal(err)
			}
			return p
		}, Foreign, []string{"plugins", "belongs to uid 65534"}},
		{"group-writable state dir", false, func(t *testing.T, dir string) string {
			chmod(t, dir, 0o770)
			return dir
		}, Writable, []string{"state dir", "mode 0770", "chmod go-w"}},
		{"world-writable state dir", false, func(t *testing.T, dir string) string {
			chmod(t, dir, 0o777|fs.ModeSticky)
			return dir
		}, Writable, []string{"state dir", "mode 0777"}},
		{"group-writable database", false, func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "state.db-wal")
			chmod(t, p, 0o660)
			return p
		}, Writable, []string{"state.db-wal", "mode 0660", "chmod go-w"}},
		{"world-writable record", false, func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "plugins", "pty.json")
			chmod(t, p, 0o606)
			return p
		}, Writable, []string{"pty.json", "mode 0606"}},
		{"symlinked token", false, func(t *testing.T, dir string) string {
			return link(t, dir, "token", "/etc/hostname")
		}, Link, []string{"token", "symbolic link (to /etc/hostname)", "remove it"}},
		{"dangling token", false, func(t *testing.T, dir string) string {
			return link(t, dir, "token", "/nonexistent/token")
		}, Link, []string{"token", "symbolic link"}},
		{"symlinked database", false, func(t *testing.T, dir string) string {
			return link(t, dir, "state.db", filepath.Join(t.TempDir(), "elsewhere.db"))
		}, Link, []string{"state.db", "symbolic link"}},
		{"symlinked host-id", false, func(t *testing.T, dir string) string {
			return link(t, dir, "host-id", "/etc/hostname")
		}, Link, []string{"host-id", "symbolic link"}},
		{"symlinked lock", false, func(t *testing.T, dir string) string {
			return link(t, dir, "lock", "/etc/passwd")
		}, Link, []string{"lock", "symbolic link"}},
		{"symlinked plugins dir", false, func(t *testing.T, dir string) string {
			elsewhere := t.TempDir()
			if err := os.RemoveAll(filepath.Join(dir, "plugins")); err != nil {
				t.Fatal(err)
			}
			return link(t, dir, "plugins", elsewhere)
		}, Link, []string{"plugins", "symbolic link"}},
		{"symlinked plugin copy", false, func(t *testing.T, dir string) string {
			return link(t, dir, "plugins/bin/copy", "/bin/sh")
		}, Link, []string{"copy", "symbolic link"}},
		{"state dir that is a link", false, func(t *testing.T, dir string) string {
			real := dir + ".real"
			if err := os.Rename(dir, real); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(real, dir); err != nil {
				t.Fatal(err)
			}
			return dir
		}, Link, []string{"state dir", "symbolic link", "point --state-dir at the directory itself"}},
		{"FIFO", false, func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "token")
			os.Remove(p)
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}, Special, []string{"named pipe", "remove it"}},
		{"state dir that is a file", false, func(t *testing.T, dir string) string {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dir, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return dir
		}, Special, []string{"is not a directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root {
				mustRoot(t)
			}
			dir := stateDir(t)
			// Something Prepare would mend, to see that a refusal
			// mends nothing either.
			chmod(t, filepath.Join(dir, "lock"), 0o644)
			bad := tt.plant(t, dir)
			problems, err := Check(dir)
			if err != nil {
				t.Fatal(err)
			}
			var found *Problem
			for _, p := range problems {
				if p.Path == bad && p.Kind == tt.kind {
					found = p
				}
			}
			if found == nil {
				t.Fatalf("Check found %v, want a %v problem at %s", problems, tt.kind, bad)
			}
			before := snapshot(t, filepath.Dir(dir))
			err = Prepare(dir, zerolog.Nop())
			var p *Problem
			if !errors.As(err, &p) || !errors.Is(err, ErrNotTrusted) || p.Path != bad || p.Kind != tt.kind {
				t.Fatalf("Prepare: %v, want the %v problem at %s", err, tt.kind, bad)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("the reason is not one line: %q", msg)
			}
			for _, s := range append(tt.say, bad) {
				if !strings.Contains(msg, s) {
					t.Errorf("the reason %q does not say %q", msg, s)
				}
			}
			if tt.kind == Link && !errors.Is(err, ErrLink) {
				t.Errorf("a link's problem is not ErrLink: %v", err)
			}
			if after := snapshot(t, filepath.Dir(dir)); after != before {
				t.Errorf("a refused state dir was changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}

	t.Run("sound", func(t *testing.T) {
		dir := stateDir(t)
		if problems, err := Check(dir); err != nil || len(problems) != 0 {
			t.Errorf("Check of a sound state dir: %v, %v", problems, err)
		}
		if err := Prepare(dir, zerolog.Nop()); err != nil {
			t.Errorf("Prepare of a sound state dir: %v", err)
		}
	})
}

// TestPrepareMends: what is ours but readable by others is made private
// (0700 directories, files without their group and other bits, a 0755
// plugin copy 0700), each said once at info level in words; a missing
// state dir is made 0700 with its parents.
func TestPrepareMends(t *testing.T) {
	dir := stateDir(t)
	chmod(t, dir, 0o755)
	chmod(t, filepath.Join(dir, "token"), 0o644)
	chmod(t, filepath.Join(dir, "state.db-wal"), 0o644)
	chmod(t, filepath.Join(dir, "plugins"), 0o750)
	chmod(t, filepath.Join(dir, "plugins", "bin", "copy"), 0o755)
	if err := os.MkdirAll(filepath.Join(dir, "nats", "jetstream"), 0o750); err != nil {
		t.Fatal(err)
	}
	chmod(t, filepath.Join(dir, "nats"), 0o750)
	for _, f := range []string{"a", "b"} {
		if err := os.WriteFile(filepath.Join(dir, "nats", "jetstream", f), nil, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	var logs bytes.Buffer
	if err := Prepare(dir, zerolog.New(&logs)); err != nil {
		t.Fatal(err)
	}
	want := map[string]fs.FileMode{
		dir:                        0o700,
		p(dir, "token"):            0o600,
		p(dir, "state.db"):         0o600,
		p(dir, "state.db-wal"):     0o600,
		p(dir, "lock"):             0o600,
		p(dir, "plugins"):          0o700,
		p(dir, "plugins/pty.json"): 0o600,
		p(dir, "plugins/bin"):      0o700,
		p(dir, "plugins/bin/copy"): 0o700,
		p(dir, "nats"):             0o700,
		p(dir, "nats/jetstream"):   0o700,
		p(dir, "nats/jetstream/a"): 0o600,
		p(dir, "nats/jetstream/b"): 0o600,
	}
	for path, mode := range want {
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v (%v), want %04o", path, fi.Mode(), err, mode)
		}
	}
	out := logs.String()
	for _, s := range []string{
		`"message":"the token file was readable by others; made it 0600"`,
		`"message":"the state dir was readable by others; made it 0700"`,
		`"message":"the database file state.db-wal was readable by others; made it 0600"`,
		`"message":"plugins/bin/copy was readable by others; made it 0700"`,
		`"paths":4`, // nats, jetstream, a, b: said once
	} {
		if strings.Count(out, s) != 1 {
			t.Errorf("the log does not say %s once:\n%s", s, out)
		}
	}
	if strings.Count(out, "\n") != 6 {
		t.Errorf("want 6 lines (state dir, token, wal, plugins, copy, nats), got:\n%s", out)
	}
	logs.Reset()
	if err := Prepare(dir, zerolog.New(&logs)); err != nil || logs.Len() != 0 {
		t.Errorf("a second Prepare: %v, said %q; want nothing to do", err, logs.String())
	}

	fresh := filepath.Join(t.TempDir(), "a", "b", "state")
	if err := Prepare(fresh, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{fresh, filepath.Dir(fresh)} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v (%v), want a 0700 directory", d, fi.Mode(), err)
		}
	}
}

// TestOpenFile: a file of the state dir is opened only when it is a
// regular file of ours that others cannot write; a link to a file (whose
// content and mode stay as they were), a dangling link, a FIFO (no hang),
// a directory, a file of another user and a group-writable one are
// refused with a reason, and O_CREATE never creates through a link.
func TestOpenFile(t *testing.T) {
	dir := stateDir(t)
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link(t, dir, "linked", target)
	link(t, dir, "dangling", filepath.Join(t.TempDir(), "none"))
	if err := syscall.Mkfifo(p(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p(dir, "gw"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	chmod(t, p(dir, "gw"), 0o620)

	for _, tt := range []struct {
		name string
		flag int
		kind Kind
	}{
		{"linked", os.O_RDONLY, Link},
		{"linked", os.O_WRONLY | os.O_CREATE | os.O_TRUNC, Link},
		{"dangling", os.O_RDONLY, Link},
		{"dangling", os.O_WRONLY | os.O_CREATE | os.O_EXCL, Link},
		{"dangling", os.O_RDWR | os.O_CREATE, Link},
		{"fifo", os.O_RDONLY, Special},
		{"plugins", os.O_RDONLY, Special},
		{"gw", os.O_RDONLY, Writable},
	} {
		start := time.Now()
		f, err := OpenFile(p(dir, tt.name), tt.flag, 0o600)
		var pr *Problem
		if !errors.As(err, &pr) || pr.Kind != tt.kind {
			if f != nil {
				f.Close()
			}
			t.Errorf("OpenFile(%s, %#x): %v, want a %v problem", tt.name, tt.flag, err, tt.kind)
		}
		if time.Since(start) > 2*time.Second {
			t.Errorf("OpenFile(%s) took %v", tt.name, time.Since(start))
		}
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "secret\n" {
		t.Errorf("the link's target now holds %q (%v)", b, err)
	}
	if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("the link's target has mode %v (%v), want 0644 untouched", fi.Mode(), err)
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(target), "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a dangling link's target was created: %v", err)
	}

	if os.Geteuid() == 0 {
		chown(t, p(dir, "token"))
		if _, err := ReadFile(p(dir, "token")); !errors.Is(err, ErrNotTrusted) {
			t.Errorf("ReadFile of another user's file: %v, want refused", err)
		}
	}

	// Ours, readable by others: opened, and MakePrivate mends it.
	if err := os.WriteFile(p(dir, "open"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	chmod(t, p(dir, "open"), 0o644)
	f, err := OpenFile(p(dir, "open"), os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if was, changed, err := MakePrivate(f); err != nil || !changed || was != 0o644 {
		t.Errorf("MakePrivate = %v, %v, %v; want 0644 changed", was, changed, err)
	}
	if fi, _ := os.Stat(p(dir, "open")); fi.Mode().Perm() != 0o600 {
		t.Errorf("after MakePrivate the mode is %v", fi.Mode())
	}
}

// TestCheckTop judges the state dir itself, for a command that only
// reads a file there.
func TestCheckTop(t *testing.T) {
	dir := stateDir(t)
	if err := CheckTop(dir); err != nil {
		t.Errorf("sound: %v", err)
	}
	if err := CheckTop(filepath.Join(dir, "none")); err != nil {
		t.Errorf("missing: %v", err)
	}
	chmod(t, dir, 0o755)
	if err := CheckTop(dir); err != nil {
		t.Errorf("readable only: %v", err)
	}
	chmod(t, dir, 0o775)
	if err := CheckTop(dir); !errors.Is(err, ErrNotTrusted) {
		t.Errorf("group-writable: %v, want refused", err)
	}
	l := link(t, filepath.Dir(dir), "link", dir)
	if err := CheckTop(l); !errors.Is(err, ErrLink) {
		t.Errorf("a link: %v, want refused", err)
	}
}

// TestWithin tells a path in a directory from one outside, on paths.
func TestWithin(t *testing.T) {
	for _, tt := range []struct {
		dir, path string
		in        bool
	}{
		{"/s", "/s/token", true},
		{"/s", "/s/a/b", true},
		{"/s/", "/s/token", true},
		{"/s", "/s", false},
		{"/s", "/st/token", false},
		{"/s", "/s/../t/token", false},
		{"/s", "/etc/token", false},
		{"/s", "/s/..token", true},
	} {
		if got := Within(tt.dir, tt.path); got != tt.in {
			t.Errorf("Within(%q, %q) = %v, want %v", tt.dir, tt.path, got, tt.in)
		}
	}
}

func p(dir string, rel ...string) string { return filepath.Join(append([]string{dir}, rel...)...) }

func chmod(t *testing.T, path string, mode fs.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, path string) {
	t.Helper()
	if err := os.Lchown(path, other, other); err != nil {
		t.Fatal(err)
	}
}

// link replaces rel in dir by a symbolic link to target.
func link(t *testing.T, dir, rel, target string) string {
	t.Helper()
	path := filepath.Join(dir, rel)
	os.Remove(path)
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPrepareRacesAnotherHost: between Prepare's walk and its mending,
// another host started on the same state dir at the same instant may
// make the same paths private, or remove one: Prepare goes on, and the
// state dir ends private. A change that is not only bits taken away (a
// link in the path's place, another owner, another type of file, a bit
// added) is still refused.
func TestPrepareRacesAnotherHost(t *testing.T) {
	t.Cleanup(func() { afterCheck = nil })
	readable := func(t *testing.T) string {
		t.Helper()
		dir := stateDir(t)
		chmod(t, dir, 0o755)
		chmod(t, p(dir, "token"), 0o644)
		chmod(t, p(dir, "state.db-wal"), 0o644)
		return dir
	}
	t.Run("made private meanwhile", func(t *testing.T) {
		dir := readable(t)
		afterCheck = func() {
			chmod(t, dir, 0o700)
			chmod(t, p(dir, "token"), 0o600)
			chmod(t, p(dir, "state.db-wal"), 0o640) // halfway: still to mend
		}
		if err := Prepare(dir, zerolog.Nop()); err != nil {
			t.Fatalf("Prepare: %v, want the other host's mending taken for what it is", err)
		}
		for path, mode := range map[string]fs.FileMode{dir: 0o700, p(dir, "token"): 0o600, p(dir, "state.db-wal"): 0o600} {
			if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != mode {
				t.Errorf("%s: %v (%v), want %04o", path, fi.Mode(), err, mode)
			}
		}
	})
	t.Run("removed meanwhile", func(t *testing.T) {
		dir := readable(t)
		afterCheck = func() {
			if err := os.Remove(p(dir, "state.db-wal")); err != nil {
				t.Fatal(err)
			}
		}
		if err := Prepare(dir, zerolog.Nop()); err != nil {
			t.Fatalf("Prepare: %v, want a path gone meanwhile skipped", err)
		}
	})
	for _, tt := range []struct {
		name string
		swap func(t *testing.T, dir string)
		root bool
	}{
		{"a link put in its place", func(t *testing.T, dir string) {
			link(t, dir, "token", p(filepath.Dir(dir), "elsewhere"))
		}, false},
		{"a bit added", func(t *testing.T, dir string) { chmod(t, p(dir, "token"), 0o664) }, false},
		{"made a directory", func(t *testing.T, dir string) {
			if err := os.Remove(p(dir, "token")); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(p(dir, "token"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"given to another user", func(t *testing.T, dir string) { chown(t, p(dir, "token")) }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root {
				mustRoot(t)
			}
			dir := readable(t)
			if err := os.WriteFile(p(filepath.Dir(dir), "elsewhere"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			afterCheck = func() { tt.swap(t, dir) }
			err := Prepare(dir, zerolog.Nop())
			if !errors.Is(err, ErrNotTrusted) || !strings.Contains(err.Error(), "changed while tether looked at it") {
				t.Errorf("Prepare: %v, want it refused as changed", err)
			}
			if fi, err := os.Stat(p(filepath.Dir(dir), "elsewhere")); err != nil || fi.Mode().Perm() != 0o644 {
				t.Errorf("the file a link points to: %v (%v), want it left 0644", fi.Mode(), err)
			}
		})
	}
}
