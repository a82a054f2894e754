package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// mountTmpfs mounts a tmpfs of size on a new directory, or skips the test
// when this process may not mount (it needs root; CI runs as root).
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root (CI runs as root)")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s)", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillDisk writes the file path until its file system is full.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte("x"), 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", path, err)
			}
			return
		}
	}
}

// commitEvent commits one journal event and the cursor after it, as the
// host's journal does for each event it sends.
func commitEvent(ctx context.Context, s *Store, key string, seq uint64) error {
	p, err := json.Marshal(map[string]any{"session_id": key, "seq": seq, "type": "message.delta", "payload": map[string]string{"text": "word "}})
	if err != nil {
		return err
	}
	return s.Commit(ctx, Batch{
		Events:  []Event{{Key: key, Seq: seq, Params: p}},
		Cursors: []Cursor{{Key: key, Epoch: "e", LastSeq: seq}},
	}, Retention{PerSession: 100})
}

// TestWritesRecoverAfterDiskFull: on a disk smaller than SQLite's default
// WAL checkpoint threshold (1,000 pages, about 4 MiB), a store whose disk
// filled up writes again once room is made, and keeps writing: every one
// of many small commits after the room is made succeeds, several times
// the disk's size of WAL frames in all; twice over. (With the default
// threshold the WAL was never checkpointed on such a disk: it grew until
// it had taken all the room made, and from then on every write, and a
// checkpoint too, failed with SQLITE_FULL, since a checkpoint needs room
// for the database file to grow into.)
func TestWritesRecoverAfterDiskFull(t *testing.T) {
	ctx := context.Background()
	dir := mountTmpfs(t, "2m")
	path := filepath.Join(dir, "state.db")
	s := openTest2(t, path)
	key := NewKey(t0)
	mustCreate(t, s, Session{Key: key, StartedAt: t0})
	filler := filepath.Join(dir, "filler")
	var seq uint64
	for round := range 2 {
		// Commits on the full disk fail once the WAL needs room (in a
		// later round it may start again in the room its file has).
		fillDisk(t, filler)
		refused := false
		for i := 0; i < 1000 && !refused; i++ {
			switch err := commitEvent(ctx, s, key, seq+1); {
			case errors.Is(err, ErrUnavailable):
				refused = true
			case err != nil:
				t.Fatalf("round %d: a commit on a full disk: got %v, want nil or ErrUnavailable", round, err)
			default:
				seq++
			}
		}
		t.Logf("round %d: the full disk refused a commit: %v (%d events journaled)", round, refused, seq)
		if round == 0 && !refused {
			t.Fatal("1,000 commits on a full disk and none failed")
		}
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		// 600 commits write at least 1,800 WAL frames of 4 KiB: 7 MiB,
		// more than three times the disk.
		for range 600 {
			seq++
			if err := commitEvent(ctx, s, key, seq); err != nil {
				wal, _ := os.Stat(path + "-wal")
				db, _ := os.Stat(path)
				t.Fatalf("round %d: commit %d after room was made: %v (state.db %d bytes, its WAL %d)", round, seq, err, db.Size(), wal.Size())
			}
		}
	}
	events, _, last, err := s.EventsSince(ctx, key, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if last != seq || len(events) != 100 {
		t.Errorf("the journal ends at seq %d with %d events, want %d with 100", last, len(events), seq)
	}
}

// TestWALCutBack: the WAL a big commit grew (3 MiB) is cut back to
// walSizeLimit once it is checkpointed and starts again, so the room it
// took goes back to the disk.
func TestWALCutBack(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	s := openTest2(t, path)
	key := NewKey(t0)
	mustCreate(t, s, Session{Key: key, StartedAt: t0})
	big := []byte(`{"text":"` + strings.Repeat("x", 64<<10) + `"}`)
	var b Batch
	for seq := uint64(1); seq <= 48; seq++ {
		b.Events = append(b.Events, Event{Key: key, Seq: seq, Params: big})
	}
	if err := s.Commit(ctx, b, Retention{}); err != nil {
		t.Fatal(err)
	}
	wal, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	if wal.Size() < 3<<20 {
		t.Fatalf("after a commit of 3 MiB the WAL is %d bytes, want 3 MiB or more", wal.Size())
	}
	for seq := uint64(49); seq <= 50; seq++ {
		if err := commitEvent(ctx, s, key, seq); err != nil {
			t.Fatal(err)
		}
	}
	if wal, err = os.Stat(path + "-wal"); err != nil {
		t.Fatal(err)
	}
	if wal.Size() > walSizeLimit {
		t.Errorf("after the big commit and two small ones the WAL is %d bytes, want at most %d", wal.Size(), walSizeLimit)
	}
}
