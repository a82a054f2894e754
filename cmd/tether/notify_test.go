package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNotifyFlags: the webhooks' URLs and the secret file are checked
// before anything starts, and a refusal never shows a URL's path (it may
// hold a secret).
func TestNotifyFlags(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "0123456789abcdef\n", 0o600)
	readable := write("readable", "0123456789abcdef", 0o644)
	short := write("short", "tooshort", 0o600)
	for _, c := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"none", nil, ""},
		{"unsigned", []string{"--notify-webhook", "https://h.example/x"}, ""},
		{"signed", []string{"--notify-webhook", "https://h.example/x", "--notify-webhook", "http://127.0.0.1:9/y", "--notify-secret-file", good}, ""},
		{"not http", []string{"--notify-webhook", "ftp://h.example/SECRETPATH"}, "want http(s)://"},
		{"no host", []string{"--notify-webhook", "https:///SECRETPATH"}, "want http(s)://"},
		{"twice", []string{"--notify-webhook", "https://h.example/SECRETPATH", "--notify-webhook", "https://h.example/SECRETPATH"}, "given twice"},
		{"secret alone", []string{"--notify-secret-file", good}, "goes with --notify-webhook"},
		{"readable secret", []string{"--notify-webhook", "https://h.example/x", "--notify-secret-file", readable}, "mode 0644"},
		{"short secret", []string{"--notify-webhook", "https://h.example/x", "--notify-secret-file", short}, "8 bytes, want at least 16"},
		{"missing secret", []string{"--notify-webhook", "https://h.example/x", "--notify-secret-file", filepath.Join(dir, "none")}, "no such file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			n := addNotifyFlags(fs)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			err := n.validate()
			switch {
			case c.wantErr == "" && err != nil:
				t.Errorf("got %v, want nil", err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Errorf("got %v, want an error with %q", err, c.wantErr)
			case err != nil && strings.Contains(err.Error(), "SECRETPATH"):
				t.Errorf("the error %q shows the URL's path", err)
			}
			if c.name == "signed" && string(n.secret) != "0123456789abcdef" {
				t.Errorf("secret: got %q, want the file's, trimmed", n.secret)
			}
		})
	}
}
