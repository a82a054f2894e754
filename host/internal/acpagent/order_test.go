package acpagent

import (
	"io"
	"strings"
	"testing"
)

// TestOrderHandsDirectOnlyInOrder: order hands a session/update to direct
// (and not to the library) only when every update before it was
// handled; the lines it keeps reach the library whole and in order.
func TestOrderHandsDirectOnlyInOrder(t *testing.T) {
	const (
		tool = `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c"}}}`
		text = `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}`
		resp = `{"jsonrpc":"2.0","id":1,"result":{}}`
	)
	for _, tc := range []struct {
		name, in, lib string
		direct        int
	}{
		{"alone: direct", text + "\n" + text + "\n" + resp + "\n", resp + "\n", 2},
		{"behind an update the library has: the library", tool + "\n" + text + "\n" + resp, tool + "\n" + text + "\n" + resp, 0},
		{"a last line without its newline", text + "\n" + resp, resp, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newOrder(strings.NewReader(tc.in))
			calls := 0
			o.direct = func(line []byte) bool {
				if _, ok := decodeTextChunk(line); !ok {
					return false
				}
				calls++
				o.handledOne()
				return true
			}
			lib, err := io.ReadAll(o)
			if err != nil {
				t.Fatal(err)
			}
			if string(lib) != tc.lib || calls != tc.direct {
				t.Fatalf("the library read %q and direct took %d; want %q and %d", lib, calls, tc.lib, tc.direct)
			}
		})
	}
}
