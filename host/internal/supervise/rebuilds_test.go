package supervise

import "testing"

// TestRebuildCount: the total never decreases, across plugin processes
// whose own counts start again at 0.
func TestRebuildCount(t *testing.T) {
	var c rebuildCount
	for i, step := range []struct {
		instance string
		n, want  int64
	}{
		{"a", 0, 0},
		{"a", 2, 2},
		{"a", 1, 2}, // a stale answer never lowers it
		{"a", 5, 5},
		{"b", 0, 5}, // a new process starts at 0
		{"b", 3, 8},
		{"a", 1, 9}, // (an instance seen before counts as a new one)
	} {
		if got := c.seen(step.instance, step.n); got != step.want {
			t.Errorf("step %d: seen(%q, %d) = %d, want %d", i, step.instance, step.n, got, step.want)
		}
		if got := c.total(); got != step.want {
			t.Errorf("step %d: total() = %d, want %d", i, got, step.want)
		}
	}
}
