// Package statedir keeps the rules of a tether state dir (docs/PROTOCOL.md,
// "The state dir"): the directory and everything in it belong to the user
// tether runs as, nothing there is writable by group or others, and no
// symbolic link there is ever followed.
//
// Check says what breaks the rules and changes nothing (tether doctor
// reports what it finds); Prepare makes a state dir ready for a host or
// refuses it with the first problem it cannot mend (tether serve). Both
// decide with the same function, judge. OpenFile, ReadFile and
// CheckFile open or look at one file there without following a link.
package statedir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/rs/zerolog"
)

// Errors of this package; a *Problem wraps them, test with errors.Is.
var (
	// ErrNotTrusted: a state dir, or a path in it, breaks the rules.
	ErrNotTrusted = errors.New("state dir not trusted")
	// ErrLink: a symbolic link where tether reads or writes a file of
	// its state dir (a *Problem of Kind Link wraps it and ErrNotTrusted).
	ErrLink = errors.New("symbolic link")
)

// Kind is what is wrong with one path of a state dir.
type Kind int

// The kinds of problem, in the order judge looks for them.
const (
	// Link: a symbolic link. tether never follows one in its state dir,
	// dangling or not.
	Link Kind = iota + 1
	// Foreign: owned by another user, who may have planted it.
	Foreign
	// Special: not what tether keeps there (the state dir is not a
	// directory; a file is a FIFO or a device).
	Special
	// Writable: writable by group or others, who may have changed it.
	Writable
	// Readable: ours, but readable (or, for a directory, searchable) by
	// group or others. The only kind Prepare mends: it takes the group
	// and other bits away.
	Readable
)

// entry is what lstat says of one path: judge's input.
type entry struct {
	mode fs.FileMode // type and permission bits
	uid  int         // the owner
	top  bool        // the state dir itself
}

// judge decides about one path of a state dir for a process running as
// uid self, and does no I/O. A symbolic link is refused whoever owns it
// and wherever it points; then a path owned by anyone else; then one of a
// type tether does not keep there (only directories, regular files and
// Unix sockets); then one that group or others can write. A Unix socket's
// permission bits are not judged: they only govern connect(2), and the
// 0700 directory around it keeps everyone else out. What is ours and only
// readable by others is Readable: made private, not refused.
func judge(e entry, self int) (Kind, bool) {
	perm := e.mode.Perm()
	switch {
	case e.mode&fs.ModeSymlink != 0:
		return Link, true
	case e.uid != self:
		return Foreign, true
	case e.top && !e.mode.IsDir():
		return Special, true
	case !e.mode.IsDir() && !e.mode.IsRegular() && e.mode.Type() != fs.ModeSocket:
		return Special, true
	case e.mode.Type() == fs.ModeSocket:
		return 0, false
	case perm&0o022 != 0:
		return Writable, true
	case perm&0o077 != 0:
		return Readable, true
	}
	return 0, false
}

// Problem is one path of a state dir that breaks the rules. Its Error is
// one line that names the path and says what to do.
type Problem struct {
	// Path is the path at fault.
	Path string
	// Kind is what is wrong with it.
	Kind Kind
	// Mode is what lstat says of it.
	Mode fs.FileMode
	// UID owns it.
	UID int
	// Top: Path is the state dir itself (or the socket dir, see
	// PrepareSocketDir).
	Top bool
	// Role names the directory judged: "" for the state dir, or
	// "socket dir".
	Role string
	// Target is where a Link points ("" when unreadable).
	Target string
}

// Error implements error: what is wrong, then what to do.
func (p *Problem) Error() string { return p.Detail() + "; " + p.Fix() }

// Unwrap lets errors.Is find ErrNotTrusted, and ErrLink for a Link.
func (p *Problem) Unwrap() []error {
	if p.Kind == Link {
		return []error{ErrNotTrusted, ErrLink}
	}
	return []error{ErrNotTrusted}
}

// Mendable reports whether Prepare mends the problem itself (Readable).
func (p *Problem) Mendable() bool { return p.Kind == Readable }

// Private is the mode Prepare gives a Readable path: the owner's bits
// only (0700 for a directory, 0600 for a file tether made 0644).
func (p *Problem) Private() fs.FileMode { return p.Mode.Perm() &^ 0o077 }

// Detail says what is wrong, naming the path.
func (p *Problem) Detail() string {
	name := p.Path
	if p.Top {
		name = p.role() + " " + p.Path
	}
	switch p.Kind {
	case Link:
		to := ""
		if p.Target != "" {
			to = " (to " + p.Target + ")"
		}
		return name + " is a symbolic link" + to + ", and tether never follows a link in its state dir"
	case Foreign:
		return fmt.Sprintf("%s belongs to %s, not to %s who runs tether", name, who(p.UID), who(os.Geteuid()))
	case Special:
		if p.Top {
			return name + " is not a directory"
		}
		if p.Mode.IsDir() {
			return name + " is a directory where tether keeps a file"
		}
		return fmt.Sprintf("%s is a %s, which tether never keeps in its state dir", name, typeName(p.Mode))
	case Writable:
		return fmt.Sprintf("%s has mode %04o: group or others can write it, and may have changed it", name, p.Mode.Perm())
	case Readable:
		return fmt.Sprintf("%s has mode %04o: group or others can read it", name, p.Mode.Perm())
	}
	return name + " is not trusted"
}

// role names the directory judged.
func (p *Problem) role() string {
	if p.Role == "" {
		return "state dir"
	}
	return p.Role
}

// Fix says what to do about the problem.
func (p *Problem) Fix() string {
	switch {
	case p.Top && p.Role != "" && p.Kind != Readable:
		return "remove it: tether makes a private one"
	case p.Kind == Link && p.Top:
		return "point --state-dir at the directory itself"
	case p.Kind == Link:
		return "remove it (tether keeps plain files there), or put the file itself in its place"
	case p.Kind == Foreign && p.Top:
		return "use a state dir of your own (--state-dir, default $XDG_STATE_HOME/tether), or run tether as its owner"
	case p.Kind == Foreign:
		return "another user put it there: check it, then remove it"
	case p.Kind == Special && p.Top:
		return "point --state-dir at a directory"
	case p.Kind == Special:
		return "remove it"
	case p.Kind == Writable && p.Mode.IsDir():
		return "check what is in it, then chmod go-w " + p.Path
	case p.Kind == Writable:
		return "check it, then chmod go-w " + p.Path
	case p.Kind == Readable:
		return fmt.Sprintf("chmod %o %s (tether serve does it)", p.Private(), p.Path)
	}
	return "check it"
}

// typeName names the type of a file tether never keeps.
func typeName(m fs.FileMode) string {
	switch m.Type() {
	case fs.ModeNamedPipe:
		return "named pipe"
	case fs.ModeDevice | fs.ModeCharDevice:
		return "character device"
	case fs.ModeDevice:
		return "block device"
	}
	return "special file (" + m.Type().String() + ")"
}

// who names a user: "uid 65534 (nobody)", or "uid N" when unknown.
func who(uid int) string {
	s := "uid " + strconv.Itoa(uid)
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil && u.Username != "" {
		s += " (" + u.Username + ")"
	}
	return s
}

// problemOf judges the path whose lstat is fi.
func problemOf(path string, fi fs.FileInfo, top bool) *Problem {
	e := entry{mode: fi.Mode(), uid: ownerOf(fi), top: top}
	kind, bad := judge(e, os.Geteuid())
	if !bad {
		return nil
	}
	p := &Problem{Path: path, Kind: kind, Mode: fi.Mode(), UID: e.uid, Top: top}
	if kind == Link {
		p.Target, _ = os.Readlink(path)
	}
	return p
}

// ownerOf is the owner of what fi describes (-1 when unknown: never us).
func ownerOf(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// Check walks the state dir at dir, not following any link, and returns
// every path that breaks the rules, the state dir first; it changes
// nothing. A state dir that does not exist yet has no problem. The error
// is for what could not be looked at (a directory that cannot be read).
func Check(dir string) ([]*Problem, error) { return check(dir, "") }

// check is Check of the directory dir in role.
func check(dir, role string) ([]*Problem, error) {
	var out []*Problem
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		top := path == dir
		if err != nil {
			switch {
			case top && errors.Is(err, fs.ErrNotExist):
				return filepath.SkipAll
			case errors.Is(err, fs.ErrNotExist):
				return nil // gone while we looked (a running host's file)
			case d != nil && d.IsDir() && len(out) > 0 && out[len(out)-1].Path == path:
				return filepath.SkipDir // a foreign directory we cannot read: said already
			}
			return fmt.Errorf("state dir %s: %w", dir, err)
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("state dir %s: %w", dir, err)
		}
		p := problemOf(path, fi, top)
		if p == nil {
			return nil
		}
		p.Role = role
		out = append(out, p)
		if top && p.Kind != Readable {
			return filepath.SkipAll // not our directory: what is in it is not ours to judge
		}
		return nil
	})
	return out, err
}

// Prepare makes dir ready for a host: it creates it (mode 0700, with its
// missing parents) when it does not exist, refuses it with the first
// problem Check finds that it cannot mend (a *Problem: one line naming the
// path and the fix), and otherwise takes the group and other bits off
// what is ours but readable by others (0700 for a directory, 0600 for a
// file), saying so at info level. It changes nothing when it refuses.
func Prepare(dir string, log zerolog.Logger) error { return prepare(dir, "", log) }

// PrepareSocketDir is Prepare for the private directory a host keeps its
// Unix sockets in when the state dir's path is too long for them (under
// the system temp dir, where anyone may have made it first).
func PrepareSocketDir(dir string, log zerolog.Logger) error {
	return prepare(dir, "socket dir", log)
}

// afterCheck, when a test sets it, is called by prepare between its walk
// and its mending: a test changes the state dir there as another host
// started at the same instant could.
var afterCheck func()

// prepare is Prepare of the directory dir in role.
func prepare(dir, role string, log zerolog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		// MkdirAll fails on a dangling link: say that, not EEXIST.
		if fi, lerr := os.Lstat(dir); lerr == nil {
			if p := problemOf(dir, fi, true); p != nil {
				p.Role = role
				return p
			}
		}
		return fmt.Errorf("%s: %w", (&Problem{Role: role}).role(), err)
	}
	problems, err := check(dir, role)
	if err != nil {
		return err
	}
	if afterCheck != nil {
		afterCheck()
	}
	for _, p := range problems {
		if !p.Mendable() {
			return p
		}
	}
	var nats []string
	for _, p := range problems {
		if err := makePrivate(p); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p.Path)
		if rel == "nats" || strings.HasPrefix(rel, "nats"+string(filepath.Separator)) {
			nats = append(nats, rel) // said once for all, below
			continue
		}
		log.Info().Str("file", p.Path).Str("was", fmt.Sprintf("%04o", p.Mode.Perm())).Str("now", fmt.Sprintf("%04o", p.Private())).
			Msgf("%s was readable by others; made it %04o", describe(rel, p), p.Private())
	}
	if len(nats) > 0 {
		log.Info().Str("dir", filepath.Join(dir, "nats")).Int("paths", len(nats)).
			Msg("the embedded NATS server's store was readable by others; made its files 0600 and directories 0700")
	}
	return nil
}

// describe names a path of the state dir (rel to it) for a log line.
func describe(rel string, p *Problem) string {
	switch {
	case p.Top:
		return "the " + p.role()
	case rel == "token":
		return "the token file"
	case strings.HasPrefix(rel, "state.db"):
		return "the database file " + rel
	case p.Mode.IsDir():
		return "the directory " + rel
	}
	return rel
}

// makePrivate takes the group and other bits off a Readable path,
// through a descriptor opened without following a link and checked to be
// the file that was judged.
//
// Another tether host started on the same state dir at the same instant
// judges and mends it too, so the path may have been made private (or
// removed: a running host's file) between the walk and the open. A path
// gone is nothing to mend, and a change that only took permission bits
// away is what making it private does: neither is taken for an attack.
// Anything else is refused: a link in its place, another owner, another
// type of file, or a permission bit added.
func makePrivate(p *Problem) error {
	f, err := os.OpenFile(p.Path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		if fi, lerr := os.Lstat(p.Path); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("making %s private: it changed while tether looked at it: %w", p.Path, problemOf(p.Path, fi, p.Top))
		}
		return fmt.Errorf("making %s private: %w", p.Path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("making %s private: %w", p.Path, err)
	}
	if !onlyNarrowed(p, fi) {
		return fmt.Errorf("making %s private: it changed while tether looked at it: %w", p.Path, ErrNotTrusted)
	}
	perm := fi.Mode().Perm()
	if perm&0o077 == 0 {
		return nil // made private meanwhile (another host on this state dir)
	}
	if err := f.Chmod(perm &^ 0o077); err != nil {
		return fmt.Errorf("making %s private: %w", p.Path, err)
	}
	return nil
}

// onlyNarrowed reports whether fi, what the judged path p is now, is
// the same type of file with the same owner, and has no permission bit
// that it did not have when judged: at most some were taken away.
func onlyNarrowed(p *Problem, fi fs.FileInfo) bool {
	now := fi.Mode()
	return now.Type() == p.Mode.Type() && ownerOf(fi) == p.UID &&
		now&^fs.ModeType&^p.Mode == 0
}

// Verify is Prepare for a command that uses a state dir a host made and
// mends nothing: the first problem Prepare would refuse, or nil. A
// state dir that does not exist passes.
func Verify(dir string) error {
	problems, err := Check(dir)
	if err != nil {
		return err
	}
	for _, p := range problems {
		if !p.Mendable() {
			return p
		}
	}
	return nil
}
