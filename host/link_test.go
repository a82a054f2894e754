package host

import (
	"testing"

	"github.com/tether-agent/tether/contract"
)

func TestBatchCut(t *testing.T) {
	mk := func(sizes ...int) []contract.Command {
		var out []contract.Command
		for _, n := range sizes {
			out = append(out, contract.Command{Kind: contract.CommandSend, Data: make([]byte, n)})
		}
		return out
	}
	tests := []struct {
		name   string
		cmds   []contract.Command
		budget int
		want   int
	}{
		{"all fit", mk(10, 10, 10), 1000, 3},
		{"cut before the one that overflows", mk(400, 400, 400), 1000, 2},
		{"a single big command still goes", mk(5000, 10), 1000, 1},
		{"empty", nil, 1000, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := batchCut(tt.cmds, tt.budget); got != tt.want {
				t.Errorf("batchCut = %d, want %d", got, tt.want)
			}
		})
	}
}
