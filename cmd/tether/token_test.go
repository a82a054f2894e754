package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/internal/statedir"
)

// TestLoadOrCreateToken: the token file in the state dir is made 0600
// when missing and read again after; one others can read is made 0600
// and said at info; a link there — to a file, or dangling — is refused
// at once with a reason (the old code looped for ever on a dangling
// one), and the file it points at keeps its content and mode, and is
// never created. A --token-file outside the state dir may be a link: it
// is read through, never chmodded through; a dangling one is refused.
func TestLoadOrCreateToken(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(state, "token")
	tok, created, err := loadOrCreateToken(state, path, zerolog.Nop())
	if err != nil || !created || len(tok) != 32 {
		t.Fatalf("first start: %q, %v, %v; want a new 32-digit token", tok, created, err)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("made token file: %v (%v), want 0600", fi.Mode(), err)
	}
	again, created, err := loadOrCreateToken(state, path, zerolog.Nop())
	if err != nil || created || again != tok {
		t.Errorf("second start: %q, %v, %v; want the same token, not made", again, created, err)
	}

	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	if _, _, err := loadOrCreateToken(state, path, zerolog.New(&logs)); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Lstat(path); fi.Mode().Perm() != 0o600 || !strings.Contains(logs.String(), "token file was readable by others; made it 0600") {
		t.Errorf("a 0644 token file: now %v, log %q; want 0600 and a word", fi.Mode(), logs.String())
	}

	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("not a token of ours\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(target, 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	for _, to := range []string{target, missing} {
		os.Remove(path)
		if err := os.Symlink(to, path); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		tok, _, err := loadOrCreateToken(state, path, zerolog.Nop())
		if !errors.Is(err, statedir.ErrLink) || tok != "" || !strings.Contains(err.Error(), path) {
			t.Errorf("token file linked to %s: %q, %v; want refused naming it", to, tok, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("the refusal took %v", d)
		}
	}
	if b, _ := os.ReadFile(target); string(b) != "not a token of ours\n" {
		t.Errorf("the target now holds %q", b)
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o644 {
		t.Errorf("the target's mode is %v, want 0644 untouched", fi.Mode())
	}
	if _, err := os.Lstat(missing); err == nil {
		t.Errorf("a file was created through the dangling link")
	}

	// Outside the state dir: the operator's link is read through.
	outside := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(target, []byte("operators-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(target, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, outside); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	tok, created, err = loadOrCreateToken(state, outside, zerolog.New(&logs))
	if err != nil || created || tok != "operators-token" {
		t.Errorf("an outside link: %q, %v, %v; want its target's token", tok, created, err)
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o644 || !strings.Contains(logs.String(), "does not chmod through a link") {
		t.Errorf("an outside link: target %v, log %q; want 0644 kept and said", fi.Mode(), logs.String())
	}
	dangling := filepath.Join(t.TempDir(), "token")
	if err := os.Symlink(missing, dangling); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadOrCreateToken(state, dangling, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("an outside dangling link: %v, want refused", err)
	}
	if _, err := os.Lstat(missing); err == nil {
		t.Errorf("a file was created through the outside dangling link")
	}
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadOrCreateToken(state, fifo, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("an outside FIFO: %v, want refused at once", err)
	}
}

// TestLoadOrCreateTokenRace: hosts started at the same instant on a new
// state dir all end up with the one token that was made.
func TestLoadOrCreateTokenRace(t *testing.T) {
	state := t.TempDir()
	path := filepath.Join(state, "token")
	const n = 8
	toks := make([]string, n)
	made := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { toks[i], made[i], errs[i] = loadOrCreateToken(state, path, zerolog.Nop()) })
	}
	wg.Wait()
	creators := 0
	for i := range n {
		if errs[i] != nil || toks[i] != toks[0] {
			t.Errorf("start %d: %q, %v; want %q", i, toks[i], errs[i], toks[0])
		}
		if made[i] {
			creators++
		}
	}
	if creators != 1 {
		t.Errorf("%d starts made the token, want 1", creators)
	}
}
