package main

import (
	"flag"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestPTYSizeFlag: --pty-max-size is COLSxROWS with each number 1-10000
// in plain decimal; anything else is refused with the form it wants.
func TestPTYSizeFlag(t *testing.T) {
	for _, tt := range []struct {
		in         string
		cols, rows int
		ok         bool
	}{
		{"1000x1000", 1000, 1000, true},
		{"300x100", 300, 100, true},
		{"1x1", 1, 1, true},
		{"10000x10000", 10000, 10000, true},
		{"0300x0100", 300, 100, true},
		{"10001x100", 0, 0, false},
		{"100x10001", 0, 0, false},
		{"0x24", 0, 0, false},
		{"80x0", 0, 0, false},
		{"-80x24", 0, 0, false},
		{"+80x24", 0, 0, false},
		{"80X24", 0, 0, false},
		{"80x24x2", 0, 0, false},
		{"80", 0, 0, false},
		{"x24", 0, 0, false},
		{"80x", 0, 0, false},
		{" 80x24", 0, 0, false},
		{"80.5x24", 0, 0, false},
		{"99999999999999999999x1", 0, 0, false},
		{"", 0, 0, false},
	} {
		t.Run(tt.in, func(t *testing.T) {
			f := ptySize{cols: 7, rows: 7}
			err := f.Set(tt.in)
			switch {
			case tt.ok && (err != nil || f.cols != tt.cols || f.rows != tt.rows):
				t.Errorf("Set(%q): %dx%d, %v; want %dx%d", tt.in, f.cols, f.rows, err, tt.cols, tt.rows)
			case !tt.ok && (err == nil || !strings.Contains(err.Error(), "want COLSxROWS, each 1-10000")):
				t.Errorf("Set(%q): %v; want an error saying the form", tt.in, err)
			case !tt.ok && (f.cols != 7 || f.rows != 7):
				t.Errorf("Set(%q) failed but changed the value to %dx%d", tt.in, f.cols, f.rows)
			}
		})
	}
	if got := (&ptySize{cols: 1000, rows: 1000}).String(); got != "1000x1000" {
		t.Errorf("String: %q, want 1000x1000", got)
	}
}

// TestSizeFlag: sizes in bytes or KiB, MiB, GiB, from 1 KiB up to the
// flag's most (1 GiB unless it says).
func TestSizeFlag(t *testing.T) {
	for _, tt := range []struct {
		in   string
		most int64
		want int64 // 0: refused
	}{
		{"64MiB", 0, 64 << 20},
		{"1024", 0, 1024},
		{"1KiB", 0, 1 << 10},
		{"1GiB", 0, 1 << 30},
		{"2GiB", 0, 0},
		{"1025MiB", 0, 0},
		{"1023", 0, 0},
		{"0", 0, 0},
		{"-1MiB", 0, 0},
		{"1TiB", 0, 0},
		{"MiB", 0, 0},
		{"2GiB", 1 << 40, 2 << 30},
		{"1024GiB", 1 << 40, 1 << 40},
		{"1025GiB", 1 << 40, 0},
		{"9223372036854775807", 1 << 40, 0},
	} {
		t.Run(tt.in, func(t *testing.T) {
			f := sizeFlag{n: 5, most: tt.most}
			err := f.Set(tt.in)
			if tt.want == 0 && (err == nil || f.n != 5) || tt.want != 0 && (err != nil || f.n != tt.want) {
				t.Errorf("Set(%q) with most %d: %d, %v; want %d", tt.in, tt.most, f.n, err, tt.want)
			}
		})
	}
	for n, want := range map[int64]string{64 << 20: "64MiB", 1 << 30: "1GiB", 1536: "1536", 3 << 10: "3KiB"} {
		if got := (&sizeFlag{n: n}).String(); got != want {
			t.Errorf("String of %d: %q, want %q", n, got, want)
		}
	}
}

// TestServeFlagsValidate: each refusal of tether serve's flags, with its
// message; the first mistake (in the order serve checks them) is the one
// reported; good flags make the plugins and the token file's default.
func TestServeFlagsValidate(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name string
		args []string
		want string // "" = accepted; else the message, or its start with a trailing "…"
	}{
		{"defaults", nil, ""},
		{"log level", []string{"--log-level", "loud"}, `--log-level "loud": …`},
		{"log format", []string{"--log-format", "xml"}, `--log-format "xml": want json or console`},
		{"tls cert alone", []string{"--tls-cert", "c.pem"}, "--tls-cert and --tls-key go together"},
		{"tls key alone", []string{"--tls-key", "k.pem"}, "--tls-cert and --tls-key go together"},
		{"agent kind", []string{"--agent", "magic"}, `--agent "magic": want echo, exec or acp`},
		{"exec needs a command", []string{"--agent", "exec"}, "--agent exec needs --agent-command"},
		{"acp needs a command", []string{"--agent", "acp"}, "--agent acp needs --agent-command"},
		{"agent command", []string{"--agent", "exec", "--agent-command", "'open"}, "--agent-command: …"},
		{"agent cwd relative", []string{"--agent-cwd", "rel"}, `--agent-cwd "rel": want an absolute path to a directory`},
		{"agent cwd missing", []string{"--agent-cwd", dir + "/none"}, `--agent-cwd "` + dir + `/none": want an absolute path to a directory`},
		{"pty command", []string{"--pty-command", "'open"}, `--pty-command "'open": …`},
		{"max connections", []string{"--max-connections", "0"}, "--max-connections must be at least 1"},
		{"scrollback negative", []string{"--pty-scrollback", "-1"}, "--pty-scrollback must be 0-1048576"},
		{"scrollback too big", []string{"--pty-scrollback", "1048577"}, "--pty-scrollback must be 0-1048576"},
		{"pty max sessions", []string{"--pty-max-sessions", "0"}, "--pty-max-sessions must be at least 1"},
		{"plugin form", []string{"--plugin", "transport"}, `--plugin "transport": want KIND=PATH[#sha256]`},
		{"plugin missing file", []string{"--plugin", "transport=" + dir + "/none"}, `--plugin "transport=` + dir + `/none": …`},
		{"plugin kind", []string{"--plugin", "gpu=/bin/sh"}, `--plugin gpu=/bin/sh: kind "gpu" is not supported (supported: transport, transport:NAME, backend, notify:NAME)`},
		{"transport name", []string{"--plugin", "transport:pty=/bin/sh"}, `--plugin transport:pty=/bin/sh: "pty" is the PTY backend's name: …`},
		{"transport twice", []string{"--plugin", "transport:x=/bin/sh", "--plugin", "transport:x=/bin/sh"}, "--plugin transport:x=/bin/sh: transport x given twice"},
		{"transport listen form", []string{"--transport-listen", "x"}, `--transport-listen "x": want NAME=ADDR`},
		{"transport listen unknown", []string{"--transport-listen", "x=unix:/tmp/x.sock"}, `--transport-listen "x=unix:/tmp/x.sock": no transport "x" added with --plugin transport:x=PATH`},
		{"cluster flag alone", []string{"--cluster-listen", "127.0.0.1:0"}, "--cluster-listen, --cluster-route-listen and --cluster-routes go with --cluster embedded"},
		{"restart limit", []string{"--plugin-restart-limit", "-1"}, "--plugin-restart-limit must be at least 0"},
		{"first mistake reported", []string{"--plugin-restart-limit", "-1", "--max-connections", "0"}, "--max-connections must be at least 1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("tether serve", flag.ContinueOnError)
			f := newServeFlags(fs)
			if err := fs.Parse(append([]string{"--state-dir", dir, "--log-format", "json"}, tt.args...)); err != nil {
				t.Fatal(err)
			}
			err := f.validate("/usr/bin/tether")
			got := ""
			if err != nil {
				got = err.Error()
			}
			prefix, cut := strings.CutSuffix(tt.want, "…")
			if cut && !strings.HasPrefix(got, prefix) || !cut && got != tt.want {
				t.Errorf("validate: got %q, want %q", got, tt.want)
			}
		})
	}
	fs := flag.NewFlagSet("tether serve", flag.ContinueOnError)
	f := newServeFlags(fs)
	if err := fs.Parse([]string{"--state-dir", dir, "--pty-command", "", "--plugin", "transport:side=/bin/sh", "--transport-listen", "side=unix:/tmp/s.sock",
		"--max-connections", "7", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--ping-interval", "1s", "--peer-timeout", "2s",
		"--allow-origin", "https://o.example", "--allow-host", "h.example"}); err != nil {
		t.Fatal(err)
	}
	if err := f.validate("/usr/bin/tether"); err != nil {
		t.Fatal(err)
	}
	cfg := f.hostConfig()
	if cfg.TokenFile != filepath.Join(dir, "token") || cfg.PTY.Spec.Path != "" || cfg.Transport.Path != "/usr/bin/tether" ||
		len(cfg.Transports) != 1 || cfg.Transports[0].Name != "side" || cfg.Transports[0].Listen != "unix:/tmp/s.sock" {
		t.Errorf("hostConfig: token file %q, PTY %+v, transport %+v, added %+v", cfg.TokenFile, cfg.PTY.Spec, cfg.Transport, cfg.Transports)
	}
	ts := cfg.TransportSettings
	if ts.MaxConnections != 7 || ts.TLSCert != "c.pem" || ts.TLSKey != "k.pem" || ts.PingInterval != time.Second || ts.PeerTimeout != 2*time.Second ||
		!slices.Equal(ts.AllowOrigins, []string{"https://o.example"}) || !slices.Equal(ts.AllowHosts, []string{"h.example"}) {
		t.Errorf("hostConfig: transport settings %+v", ts)
	}
}
