package host

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadSecretFile: a cluster secret is read from a regular file of
// this user's that nobody else may read or change, 32 bytes or more (its
// trailing newline aside); every other file is refused with why, and the
// error never quotes the secret.
func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	secret := strings.Repeat("c0", 32)
	file := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := file("good", secret+"\n", 0o600)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	me := os.Geteuid()
	tests := []struct {
		name, path string
		uid        int
		want       string // "" reads the secret
	}{
		{"mode 0600", good, me, ""},
		{"mode 0400", file("ro", secret, 0o400), me, ""},
		{"a symbolic link to it", link, me, ""},
		{"group-readable", file("g", secret, 0o640), me, "mode 0640 lets other users read or change it"},
		{"world-readable", file("o", secret, 0o604), me, "mode 0604"},
		{"group-writable", file("gw", secret, 0o620), me, "mode 0620"},
		{"another user's", good, me + 1, "owned by uid"},
		{"short", file("short", strings.Repeat("x", 31)+"\n", 0o600), me, "31 bytes, want at least 32 random bytes: make one with (umask 077; tether cluster secret > FILE)"},
		{"white space only", file("blank", strings.Repeat(" ", 40), 0o600), me, "0 bytes"},
		{"missing", filepath.Join(dir, "none"), me, "no such file or directory (make one with"},
		{"a directory", dir, me, "not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := readSecretFile(tt.path, tt.uid)
			if tt.want == "" {
				if err != nil || len(b) < 32 || strings.TrimSpace(string(b)) != string(b) {
					t.Fatalf("readSecretFile: %q, %v; want the secret", b, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("readSecretFile: %v, want an error saying %q", err, tt.want)
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "xxxxxxxx") {
				t.Errorf("the error quotes the file's content: %v", err)
			}
		})
	}
}
