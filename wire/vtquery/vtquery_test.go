package vtquery_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tether-agent/tether/wire/vtquery"
)

func filter(chunks ...[]byte) ([]byte, int) {
	f := vtquery.New()
	var out []byte
	for _, c := range chunks {
		out = f.Append(out, c)
	}
	return f.Flush(out), f.Dropped()
}

// queries are the sequences a terminal answers, each as a program sends it.
var queries = vtquery.Examples()

// others must pass byte for byte.
var others = []struct{ name, seq string }{
	{"text", "hello, world\r\n"},
	{"utf-8", "日本語 é 🙂"},
	{"invalid utf-8", "a\xff\xfeb\xc3"},
	{"controls", "\a\b\t\n\v\f\r\x0e\x0f"},
	{"SGR", "\x1b[1;31;48;5;200;38;2;1;2;3m"},
	{"SGR colon", "\x1b[4:3m\x1b[58:2::1:2:3m"},
	{"CUP", "\x1b[12;40H"},
	{"DECSET", "\x1b[?1049h\x1b[?2004h\x1b[?1000;1006h"},
	{"DECSTBM", "\x1b[3;20r"},
	{"DSR lookalike XTMODKEYS", "\x1b[>4n"},
	{"modifyOtherKeys", "\x1b[>4;1m"},
	{"kitty keyboard push", "\x1b[>1u"},
	{"kitty keyboard set", "\x1b[=1;1u"},
	{"SCORC", "\x1b[u"},
	{"DECSC", "\x1b7\x1b8"},
	{"charset", "\x1b(0lqk\x1b(B"},
	{"XTWINOPS push title", "\x1b[22;0;0t"},
	{"XTWINOPS resize", "\x1b[8;24;80t"},
	{"title BEL", "\x1b]0;vim ?\a"},
	{"title ST", "\x1b]2;a?b\x1b\\"},
	{"hyperlink", "\x1b]8;;https://example.com/?q=1\x1b\\link\x1b]8;;\x1b\\"},
	{"OSC 10 set", "\x1b]10;#ffffff\a"},
	{"OSC 4 set", "\x1b]4;1;rgb:ff/00/00\a"},
	{"OSC 52 set", "\x1b]52;c;aGVsbG8=\a"},
	{"OSC 104 reset", "\x1b]104\a"},
	{"DCS sixel", "\x1bPq#0;2;0;0;0~-\x1b\\"},
	{"DCS tmux passthrough", "\x1bPtmux;\x1b\x1b[1m\x1b\\"},
	{"APC kitty image", "\x1b_Ga=T,f=24;AAAA\x1b\\"},
	{"PM", "\x1b^private\x1b\\"},
	{"RIS", "\x1bc"},
	{"DECSCUSR", "\x1b[5 q"},
	{"aborted by CAN", "\x1b[6\x18n"},
	{"lone ESC at end", "text\x1b"},
	{"unterminated CSI at end", "\x1b[12;"},
}

func TestQueriesRemoved(t *testing.T) {
	for _, q := range queries {
		t.Run(q.Name, func(t *testing.T) {
			in := []byte("before" + q.Seq + "after")
			got, n := filter(in)
			if string(got) != "beforeafter" || n != 1 {
				t.Errorf("filter(%q): got %q, %d dropped; want %q, 1", in, got, n, "beforeafter")
			}
			checkChunked(t, in, got)
		})
	}
}

func TestOthersPass(t *testing.T) {
	for _, o := range others {
		t.Run(o.name, func(t *testing.T) {
			in := []byte("x" + o.seq)
			got, n := filter(in)
			if !bytes.Equal(got, in) || n != 0 {
				t.Errorf("filter(%q): got %q, %d dropped; want it unchanged", in, got, n)
			}
			checkChunked(t, in, got)
		})
	}
}

// TestMixed: every query and every other sequence in one stream, in any
// split, leaves exactly the others.
func TestMixed(t *testing.T) {
	var in, want strings.Builder
	for i := range max(len(queries), len(others)) {
		if i < len(others) && !strings.HasSuffix(others[i].name, "at end") {
			in.WriteString(others[i].seq + "|")
			want.WriteString(others[i].seq + "|")
		}
		if i < len(queries) {
			in.WriteString(queries[i].Seq)
		}
		in.WriteString("|")
		want.WriteString("|")
	}
	got, n := filter([]byte(in.String()))
	if string(got) != want.String() || n != len(queries) {
		t.Errorf("got %q, %d dropped;\nwant %q, %d", got, n, want.String(), len(queries))
	}
	checkChunked(t, []byte(in.String()), got)
}

func TestInside(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"control executed inside a query stays", "\x1b[\n6n", "\n"},
		{"query aborts an unfinished CSI", "\x1b[12\x1b[6n", ""},
		{"two ESCs, then a query", "\x1b\x1b[c", ""},
		{"ENQ inside a query", "\x1b[\x05c", ""},
		{"prefix before a control", "\x1b[>\n0c", "\n"},
		{"not a query with a control inside", "\x1b[1\n2m", "\x1b[1\n2m"},
		{"string ended by a new sequence", "\x1b]11;?\x1b[1m", "\x1b[1m"},
		{"title then query", "\x1b]0;t\a\x1b[c", "\x1b]0;t\a"},
		{"long OSC passes as it comes", "\x1b]52;c;" + strings.Repeat("A", 70000) + "\a", "\x1b]52;c;" + strings.Repeat("A", 70000) + "\a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := filter([]byte(tt.in))
			if string(got) != tt.want {
				t.Errorf("filter(%.60q): got %.60q, want %.60q", tt.in, got, tt.want)
			}
			if len(tt.in) < 100 {
				checkChunked(t, []byte(tt.in), got)
			}
		})
	}
}

// checkChunked checks that in, split at any point or fed byte by byte,
// filters to want.
func checkChunked(t *testing.T, in, want []byte) {
	t.Helper()
	for i := range in {
		if got, _ := filter(in[:i], in[i:]); !bytes.Equal(got, want) {
			t.Fatalf("filter(%q | %q): got %q, want %q", in[:i], in[i:], got, want)
		}
	}
	var bytewise [][]byte
	for i := range in {
		bytewise = append(bytewise, in[i:i+1])
	}
	if got, _ := filter(bytewise...); !bytes.Equal(got, want) {
		t.Fatalf("filter(%q byte by byte): got %q, want %q", in, got, want)
	}
}

func FuzzFilter(f *testing.F) {
	for _, q := range queries {
		f.Add([]byte("a"+q.Seq+"b"), uint16(2))
	}
	for _, o := range others {
		f.Add([]byte(o.seq), uint16(1))
	}
	f.Fuzz(func(t *testing.T, in []byte, split uint16) {
		whole, _ := filter(in)
		at := int(split) % (len(in) + 1)
		if got, _ := filter(in[:at], in[at:]); !bytes.Equal(got, whole) {
			t.Fatalf("split at %d: got %q, whole %q", at, got, whole)
		}
		// The output is the input less some bytes, in order.
		rest := whole
		for _, b := range in {
			if len(rest) > 0 && rest[0] == b {
				rest = rest[1:]
			}
		}
		if len(rest) != 0 {
			t.Fatalf("output %q is not a subsequence of the input %q", whole, in)
		}
		// No query is left.
		if again, n := filter(whole); n != 0 {
			t.Fatalf("output %q still holds %d queries (filtered again: %q)", whole, n, again)
		}
		if !bytes.ContainsAny(in, "\x1b\x05\x90\x98\x9b\x9d\x9e\x9f") && !bytes.Equal(whole, in) {
			t.Fatalf("input without escapes %q changed to %q", in, whole)
		}
	})
}

// TestC1Forms: the 8-bit forms of queries — a C1 control as a raw byte,
// and as the UTF-8 encoding of its code point, which xterm.js takes for
// the same control — are removed like their 7-bit forms, split across
// pieces too; everything else with those bytes passes byte for byte (the
// hyperlink id of the report that found it held U+009B 6n).
func TestC1Forms(t *testing.T) {
	csi, osc, dcs, st := "\u009b", "\u009d", "\u0090", "\u009c"
	for _, q := range []struct{ name, seq string }{
		{"CPR utf-8 CSI", csi + "6n"},
		{"DA1 utf-8 CSI", csi + "c"},
		{"DECRQM utf-8 CSI", csi + "?2004$p"},
		{"CPR raw CSI", "\x9b6n"},
		{"OSC 11 utf-8 OSC and ST", osc + "11;?" + st},
		{"OSC 11 utf-8 OSC and BEL", osc + "11;?\a"},
		{"OSC 11 utf-8 OSC and ESC ST", osc + "11;?\x1b\\"},
		{"DECRQSS utf-8 DCS and ST", dcs + "$qm" + st},
		{"XTGETTCAP raw DCS", "\x90+q544e\x9c"},
	} {
		t.Run(q.name, func(t *testing.T) {
			in := "before" + q.seq + "after"
			for cut := 0; cut <= len(in); cut++ {
				out, dropped := filter([]byte(in[:cut]), []byte(in[cut:]))
				if string(out) != "beforeafter" || dropped != 1 {
					t.Fatalf("cut at %d: %q -> %q (dropped %d), want %q", cut, in, out, dropped, "beforeafter")
				}
			}
		})
	}
	for _, o := range []struct{ name, seq string }{
		{"SGR utf-8 CSI", csi + "1m"},
		{"cent sign", "¢ and Â"},
		{"lone C2 at end", "x\xc2"},
		{"C2 before ASCII", "x\xc2y"},
		{"title with utf-8 OSC", osc + "2;hello" + st},
		{"NEL", "a\u0085b"},
	} {
		t.Run(o.name, func(t *testing.T) {
			for cut := 0; cut <= len(o.seq); cut++ {
				out, dropped := filter([]byte(o.seq[:cut]), []byte(o.seq[cut:]))
				if string(out) != o.seq || dropped != 0 {
					t.Fatalf("cut at %d: %q -> %q (dropped %d), want it unchanged", cut, o.seq, out, dropped)
				}
			}
		})
	}
}
