package statedir

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// OpenFile is os.OpenFile for a file of a state dir. It never goes
// through a symbolic link: with O_NOFOLLOW a link there, dangling or
// not, is refused at once as a *Problem of Kind Link (never followed,
// never waited on). With O_NONBLOCK a FIFO planted there does not block
// the open. What it opened must be a regular file of this user that
// group and others cannot write, else it is closed and the *Problem
// returned. A file it creates (O_CREATE) gets perm.
//
// The directories on the way are the state dir's own: Check judged them
// (no link, ours, closed to others) when the host started, and nobody
// else can change them since.
func OpenFile(path string, flag int, perm fs.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, perm)
	if err != nil {
		// O_NOFOLLOW says ELOOP for a link; O_CREATE|O_EXCL says EEXIST
		// for a dangling one. Either way, name the link.
		if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			p := &Problem{Path: path, Kind: Link, Mode: fi.Mode(), UID: ownerOf(fi)}
			p.Target, _ = os.Readlink(path)
			return nil, p
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	p := problemOf(path, fi, false)
	if p == nil && fi.IsDir() {
		p = &Problem{Path: path, Kind: Special, Mode: fi.Mode(), UID: ownerOf(fi)}
	}
	if p != nil && !p.Mendable() {
		f.Close()
		return nil, p
	}
	return f, nil
}

// ReadFile reads the file of a state dir at path with OpenFile's rules.
func ReadFile(path string) ([]byte, error) {
	f, err := OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// MakePrivate takes the group and other bits off the file f (opened by
// OpenFile, so never through a link) when it has any, and reports the
// mode it had and whether it changed it.
func MakePrivate(f *os.File) (was fs.FileMode, changed bool, err error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, false, err
	}
	was = fi.Mode().Perm()
	if was&0o077 == 0 {
		return was, false, nil
	}
	if err := f.Chmod(was &^ 0o077); err != nil {
		return was, false, fmt.Errorf("%s: %w", f.Name(), err)
	}
	return was, true, nil
}

// CheckTop judges the state dir dir itself, not what is in it: nil when
// it is a directory of this user that group and others cannot write, or
// when it does not exist. Client commands that only read a file there
// use it; a host walks the whole dir (Check, Prepare).
func CheckTop(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if p := problemOf(dir, fi, true); p != nil && !p.Mendable() {
		return p
	}
	return nil
}

// Within reports whether path is inside the directory dir, judged on the
// paths as written (made absolute and clean), not by resolving links.
func Within(dir, path string) bool {
	d, err1 := filepath.Abs(dir)
	p, err2 := filepath.Abs(path)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// CheckFile judges the one path of a state dir at path without opening
// it: nil when it does not exist or keeps the rules (ours, not a link,
// not writable by others; readable by others is for Prepare to mend),
// else the *Problem. It is for files a library opens by name, where
// OpenFile cannot be used (SQLite's -wal and -shm).
func CheckFile(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if p := problemOf(path, fi, false); p != nil && !p.Mendable() {
		return p
	}
	return nil
}
