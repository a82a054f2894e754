package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

// TestHostLogWriter: lines go to the host's pipe while it is read; once
// the host is gone (the pipe's reader closed: EPIPE) or the plugin was
// reparented, they go to the log file, the failed line included.
func TestHostLogWriter(t *testing.T) {
	t.Run("broken pipe", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		path := filepath.Join(t.TempDir(), "pty.log")
		lw := newHostLogWriter(w, path)
		lw.Write([]byte("to the host\n"))
		buf := make([]byte, 64)
		n, _ := r.Read(buf)
		if got := string(buf[:n]); got != "to the host\n" {
			t.Fatalf("host got %q", got)
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("log file made while the host was there: %v", err)
		}
		r.Close() // the host is gone
		for _, l := range []string{"first after\n", "second after\n"} {
			if n, err := lw.Write([]byte(l)); err != nil || n != len(l) {
				t.Fatalf("Write after the host left: %d, %v", n, err)
			}
		}
		b, err := os.ReadFile(path)
		if err != nil || string(b) != "first after\nsecond after\n" {
			t.Errorf("log file: %q, %v", b, err)
		}
		if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
			t.Errorf("log file mode %v, %v; want 0600", info.Mode(), err)
		}
	})
	t.Run("reparented", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		defer w.Close()
		path := filepath.Join(t.TempDir(), "pty.log")
		lw := newHostLogWriter(w, path)
		lw.ppid = -1 // as if the host that started it were gone
		lw.Write([]byte("line\n"))
		if b, _ := os.ReadFile(path); string(b) != "line\n" {
			t.Errorf("log file: %q", b)
		}
	})
	t.Run("rotated when large", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "pty.log")
		if err := os.WriteFile(path, []byte(strings.Repeat("x", ptyLogMax+1)), 0o600); err != nil {
			t.Fatal(err)
		}
		lw := newHostLogWriter(nil, path)
		lw.hostGone = true
		lw.Write([]byte("new\n"))
		if b, _ := os.ReadFile(path); string(b) != "new\n" {
			t.Errorf("log after rotation: %d bytes", len(b))
		}
		if info, err := os.Stat(path + ".1"); err != nil || info.Size() != ptyLogMax+1 {
			t.Errorf("rotated log: %v", err)
		}
	})
}

// TestPluginLogLevel: a built-in plugin logs from the host's level up,
// and everything when the host said nothing usable.
func TestPluginLogLevel(t *testing.T) {
	for env, want := range map[string]zerolog.Level{
		"warn": zerolog.WarnLevel, "debug": zerolog.DebugLevel, "error": zerolog.ErrorLevel,
		"": zerolog.TraceLevel, "loud": zerolog.TraceLevel,
	} {
		t.Setenv(contract.EnvPluginLogLevel, env)
		if got := pluginLogLevel(); got != want {
			t.Errorf("%s=%q: level %v, want %v", contract.EnvPluginLogLevel, env, got, want)
		}
	}
}
