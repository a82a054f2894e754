package main

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestServeProxyFlags: --auth-proxy-header and --auth-proxy-from go
// together; a users file that does not parse names its line, one others
// can change is refused; good flags reach the transports' settings.
func TestServeProxyFlags(t *testing.T) {
	dir := t.TempDir()
	users := filepath.Join(dir, "users")
	if err := os.WriteFile(users, []byte("# people\nalice admin\nbob session:k:view new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("alice admin\nbob root\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open")
	if err := os.WriteFile(open, []byte("alice admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o666); err != nil {
		t.Fatal(err)
	}
	parse := func(t *testing.T, args ...string) (*serveFlags, error) {
		t.Helper()
		fs := flag.NewFlagSet("tether serve", flag.ContinueOnError)
		f := newServeFlags(fs)
		if err := fs.Parse(append([]string{"--state-dir", filepath.Join(dir, "state"), "--log-format", "json"}, args...)); err != nil {
			t.Fatal(err)
		}
		return f, f.validate("/usr/bin/tether")
	}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"header alone", []string{"--auth-proxy-header", "X-Forwarded-User"}, "auth proxy: --auth-proxy-header needs --auth-proxy-from"},
		{"from alone", []string{"--auth-proxy-from", "127.0.0.1/32"}, "auth proxy: --auth-proxy-from needs --auth-proxy-header"},
		{"users alone", []string{"--auth-proxy-users", users}, "auth proxy: --auth-proxy-users needs --auth-proxy-header and --auth-proxy-from"},
		{"bad CIDR", []string{"--auth-proxy-header", "X-U", "--auth-proxy-from", "127.0.0.1/40"}, `auth proxy: --auth-proxy-from "127.0.0.1/40"`},
		{"bad users line", []string{"--auth-proxy-header", "X-U", "--auth-proxy-from", "127.0.0.1/32", "--auth-proxy-users", bad}, "auth proxy: " + bad + ":2: bad scope \"root\""},
		{"users file others can change", []string{"--auth-proxy-header", "X-U", "--auth-proxy-from", "127.0.0.1/32", "--auth-proxy-users", open}, "mode 0666"},
		{"missing users file", []string{"--auth-proxy-header", "X-U", "--auth-proxy-from", "127.0.0.1/32", "--auth-proxy-users", filepath.Join(dir, "none")}, "no such file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("validate: got %v, want one line with %q", err, tt.want)
			}
		})
	}
	f, err := parse(t)
	if err != nil || f.hostConfig().AuthProxy != nil {
		t.Errorf("no --auth-proxy-* flag: err %v, proxy %+v; want none", err, f.hostConfig().AuthProxy)
	}
	f, err = parse(t, "--auth-proxy-header", "x-forwarded-user", "--auth-proxy-from", "127.0.0.1/32,::1", "--auth-proxy-from", "10.0.0.0/8", "--auth-proxy-users", users)
	if err != nil {
		t.Fatal(err)
	}
	p := f.hostConfig().AuthProxy
	if p == nil || p.Header != "X-Forwarded-User" || len(p.From) != 3 || !slices.Equal(p.Users["bob"], []string{"session:k:view", "new"}) || !p.Trusts("10.2.3.4:5") || p.Trusts("127.0.0.2:5") {
		t.Errorf("AuthProxy = %+v", p)
	}
}
