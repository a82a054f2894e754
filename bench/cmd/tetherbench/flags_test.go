package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	cfg, err := parseFlags(nil).config()
	if err != nil {
		t.Fatalf("config of the defaults: %v", err)
	}
	if cfg.n != 5 || cfg.ptySize != 256<<20 || cfg.checkSize != 8<<20 || cfg.reattachRing != 1<<20 || cfg.cluster.ptySize != 32<<20 {
		t.Errorf("got n %d, sizes %d %d %d %d; want 5, 256MiB, 8MiB, 1MiB, 32MiB", cfg.n, cfg.ptySize, cfg.checkSize, cfg.reattachRing, cfg.cluster.ptySize)
	}
	for _, r := range allRows {
		if !cfg.rows[r] {
			t.Errorf("row %s not selected by default", r)
		}
	}
	if !slices.Equal(cfg.rpcClients, []int{1, 16, 100}) || !slices.Equal(cfg.ptyModels, []bool{true, false}) {
		t.Errorf("got rpc clients %v, pty models %v; want [1 16 100], [true false]", cfg.rpcClients, cfg.ptyModels)
	}
	if want := 4*10000 + 10000; cfg.acp.journal != want {
		t.Errorf("acp journal: got %d, want %d", cfg.acp.journal, want)
	}
	if want := 60*time.Second + 30*time.Second; cfg.reconnect.deadline != want {
		t.Errorf("reconnect deadline: got %v, want %v", cfg.reconnect.deadline, want)
	}
}

// TestQuick: -quick lowers the sizes of the flags not given, and only
// those.
func TestQuick(t *testing.T) {
	cfg, err := parseFlags([]string{"-quick", "-pty-size", "64MiB", "-rows", "rpc,cluster"}).config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.n != 3 || cfg.ptySize != 64<<20 || cfg.checkSize != 2<<20 || cfg.rpcDur != 500*time.Millisecond || cfg.acp.single != 0 {
		t.Errorf("got n %d, pty size %d, check size %d, rpc %v, acp single %d; want 3, 64MiB (given), 2MiB, 500ms, 0",
			cfg.n, cfg.ptySize, cfg.checkSize, cfg.rpcDur, cfg.acp.single)
	}
	var rows []string
	for r := range cfg.rows {
		rows = append(rows, r)
	}
	slices.Sort(rows)
	if want := []string{"cluster-failover", "cluster-pty", "cluster-relay", "cluster-storm", "rpc"}; !slices.Equal(rows, want) {
		t.Errorf("rows: got %v, want %v", rows, want)
	}
}

func TestConfigRefuses(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"a bad size", []string{"-pty-size", "1MB"}, `size "1MB"`},
		{"an unknown row", []string{"-rows", "pty,nope"}, `unknown row "nope"`},
		{"a bad client count", []string{"-rpc-clients", "1,0"}, "bad -rpc-clients"},
		{"a bad terminal size", []string{"-reattach-sizes", "80x"}, "bad -reattach-sizes"},
		{"a bad pty model", []string{"-pty-model", "maybe"}, "bad -pty-model"},
		{"a bad pty data kind", []string{"-pty-data", "letters,video"}, "bad -pty-data"},
		{"no repetitions", []string{"-n", "0"}, "-n must be at least 1"},
		{"a small cluster storm", []string{"-cluster-storm", "2"}, "-cluster-storm ≥ 3"},
		{"a reconnect backoff cap below the bound", []string{"-reconnect-backoff-max", "1ms"}, "-reconnect-backoff-max"},
		{"no fanout words", []string{"-fanout-words", "0"}, "-fanout-words must be ≥ 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseFlags(tt.args).config()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("config(%q): got %v, want an error with %q", tt.args, err, tt.want)
			}
		})
	}
}
