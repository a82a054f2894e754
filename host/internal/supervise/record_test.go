package supervise

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestJudgeRecord(t *testing.T) {
	const (
		sock   = "/state/plugins/plugin123"
		pid    = 4242
		ticks  = 987654
		reused = "was reused"
	)
	argv := []string{"/old/build/tether", "plugin", "pty"}
	good := ReattachRecord{Protocol: "grpc", Network: "unix", Address: sock, Pid: pid, Started: ticks, Secret: "s", Argv: argv}
	alive := procInfo{Exists: true, Started: ticks, Args: argv}
	tests := []struct {
		name   string
		rec    ReattachRecord
		proc   procInfo
		ok     bool
		reason string // part of the refusal's reason
	}{
		{"alive", good, alive, true, ""},
		// The binary it runs does not matter (a rebuilt or upgraded host
		// reattaches); the secret proves it, after.
		{"alive, with no secret recorded (proven after: it fails then)", func() ReattachRecord { r := good; r.Secret = ""; return r }(), alive, true, ""},
		{"same pid and start time, another command line", good, procInfo{Exists: true, Started: ticks, Args: []string{"sleep", "60"}}, false, "not the plugin"},
		{"an older record without a command line: a tether plugin", func() ReattachRecord { r := good; r.Argv = nil; return r }(), alive, true, ""},
		{"an older record without a command line: another program", func() ReattachRecord { r := good; r.Argv = nil; return r }(), procInfo{Exists: true, Started: ticks, Args: []string{"sleep", "60"}}, false, "not the plugin"},
		{"tcp on loopback", func() ReattachRecord { r := good; r.Network, r.Address = "tcp", "127.0.0.1:12345"; return r }(), alive, true, ""},
		{"dead pid", good, procInfo{}, false, "is gone"},
		{"zombie", good, procInfo{Exists: true, Zombie: true, Started: ticks}, false, "has exited"},
		{"pid reused by a later process", good, procInfo{Exists: true, Started: ticks + 1}, false, reused},
		{"pid reused by an earlier boot's numbering", good, procInfo{Exists: true, Started: 12}, false, reused},
		{"not grpc", func() ReattachRecord { r := good; r.Protocol = "netrpc"; return r }(), alive, false, "not grpc"},
		{"unknown network", func() ReattachRecord { r := good; r.Network = "udp"; return r }(), alive, false, "network"},
		{"relative socket", func() ReattachRecord { r := good; r.Address = "plugins/x"; return r }(), alive, false, "absolute"},
		{"tcp off the machine", func() ReattachRecord { r := good; r.Network, r.Address = "tcp", "10.0.0.1:80"; return r }(), alive, false, "loopback"},
		{"no pid", func() ReattachRecord { r := good; r.Pid = 0; return r }(), alive, false, "pid"},
		{"pid 1", func() ReattachRecord { r := good; r.Pid = 1; return r }(), alive, false, "pid"},
		{"no start time", func() ReattachRecord { r := good; r.Started = 0; return r }(), alive, false, "start time"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, reason := judgeRecord(tt.rec, tt.proc)
			if ok != tt.ok || !strings.Contains(reason, tt.reason) {
				t.Errorf("judgeRecord: got (%v, %q), want (%v, …%q…)", ok, reason, tt.ok, tt.reason)
			}
			if !ok && reason == "" {
				t.Errorf("a refusal without a reason")
			}
		})
	}
}

func TestParseStat(t *testing.T) {
	// Fields 3.. of a real /proc/PID/stat line; field 22 is 123456.
	const rest = " S 1 2 3 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0"
	tests := []struct {
		name    string
		stat    string
		state   byte
		started uint64
		ok      bool
	}{
		{"plain", "42 (tether)" + rest, 'S', 123456, true},
		{"comm with spaces and parens", "42 (a) b (c))" + rest, 'S', 123456, true},
		{"zombie", "42 (x) Z" + rest[2:], 'Z', 123456, true},
		{"truncated", "42 (tether) S 1 2 3", 0, 0, false},
		{"no comm", "42 tether S", 0, 0, false},
		{"bad start", "42 (t)" + strings.Replace(rest, "123456", "x", 1), 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state, started, ok := parseStat([]byte(tt.stat))
			if ok != tt.ok || (ok && (state != tt.state || started != tt.started)) {
				t.Errorf("parseStat: got (%q, %d, %v), want (%q, %d, %v)", state, started, ok, tt.state, tt.started, tt.ok)
			}
		})
	}
}

func TestReadProcSelf(t *testing.T) {
	p := readProc(os.Getpid())
	if !p.Exists || p.Zombie || p.Started == 0 || len(p.Args) == 0 {
		t.Fatalf("readProc(self) = %+v, want this live process with its start time", p)
	}
	ok, reason := judgeRecord(ReattachRecord{Protocol: "grpc", Network: "unix", Address: "/x", Pid: os.Getpid(), Started: p.Started, Argv: p.Args}, p)
	if !ok {
		t.Errorf("judgeRecord of this very process: %s", reason)
	}
	if readProc(1 << 30).Exists {
		t.Errorf("readProc of an impossible pid says it exists")
	}
}

func TestRecordFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "plugins")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "pty.json")
	if _, found, err := readRecord(path); found || err != nil {
		t.Fatalf("readRecord of no file: found %v, %v", found, err)
	}
	sock := filepath.Join(dir, "plugin1")
	outside := filepath.Join(t.TempDir(), "precious")
	for _, f := range []string{sock, outside} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rec := ReattachRecord{Protocol: "grpc", Network: "unix", Address: sock, Pid: 99, Started: 7}
	for range 2 { // the second write replaces the first
		if err := writeRecord(path, rec); err != nil {
			t.Fatal(err)
		}
	}
	info, err := os.Stat(path)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("record file: %v %v, want mode 0600", info.Mode(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("plugins dir holds %d entries, want the record and the socket (no temporary files)", len(entries))
	}
	b, _ := os.ReadFile(path)
	for _, key := range []string{`"protocol"`, `"network"`, `"address"`, `"pid"`, `"started"`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("record %s has no %s", b, key)
		}
	}
	got, found, err := readRecord(path)
	if !found || err != nil || !reflect.DeepEqual(got, rec) {
		t.Fatalf("readRecord: %+v %v %v, want %+v", got, found, err, rec)
	}

	// A record naming a file outside its directory never gets it removed.
	if err := removeRecord(path, ReattachRecord{Network: "unix", Address: outside}, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatalf("removeRecord removed %s, outside the plugins dir", outside)
	}
	if err := writeRecord(path, rec); err != nil {
		t.Fatal(err)
	}
	if err := removeRecord(path, rec, ""); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{path, sock} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s after removeRecord: %v, want it gone", f, err)
		}
	}

	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, found, err := readRecord(path); !found || err == nil {
		t.Errorf("readRecord of a corrupt record: found %v, err %v; want found with an error", found, err)
	}
}

// TestRemoveOwnRecord: a plugin exiting by itself removes the record and
// socket only while the record names it (pid and secret); a record of
// another process, or none, is left as it is.
func TestRemoveOwnRecord(t *testing.T) {
	for _, tc := range []struct {
		name        string
		pid         int
		secret      string
		wantRemoved bool
	}{
		{"its own", 100, "s3cret", true},
		{"another pid", 101, "s3cret", false},
		{"another secret", 100, "other", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			dir := filepath.Join(state, "plugins")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(dir, "plugin123")
			if err := os.WriteFile(sock, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := writeRecord(recordPath(state, "pty"), ReattachRecord{Protocol: "grpc", Network: "unix", Address: sock, Pid: 100, Secret: "s3cret"}); err != nil {
				t.Fatal(err)
			}
			removed, err := RemoveOwnRecord(state, dir, "pty", tc.pid, tc.secret)
			if err != nil || removed != tc.wantRemoved {
				t.Fatalf("RemoveOwnRecord = %v, %v; want %v, nil", removed, err, tc.wantRemoved)
			}
			for _, p := range []string{recordPath(state, "pty"), sock} {
				if _, err := os.Stat(p); os.IsNotExist(err) != tc.wantRemoved {
					t.Errorf("%s: exists %v, want %v", p, !os.IsNotExist(err), !tc.wantRemoved)
				}
			}
		})
	}
	if removed, err := RemoveOwnRecord(t.TempDir(), "", "pty", 100, "s3cret"); removed || err != nil {
		t.Errorf("with no record: %v, %v; want false, nil", removed, err)
	}
}
