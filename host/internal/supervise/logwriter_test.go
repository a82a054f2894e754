package supervise

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

// syncBuffer is a bytes.Buffer safe for the writer's timer goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// TestPluginLogWriterRateLimit: a plugin writing 5,000 lines within one
// second has 1,000 re-emitted and the other 4,000 counted in one summary
// line when the second is over; the next second starts afresh.
func TestPluginLogWriterRateLimit(t *testing.T) {
	var out syncBuffer
	dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped"})
	w := newPluginLogWriter(zerolog.New(&out), "flood", dropped)
	clock := time.Unix(1000, 0)
	w.now = func() time.Time { return clock }
	for i := range 5000 {
		fmt.Fprintf(w, "line %d\n", i)
	}
	if got := len(out.lines()); got != logLinesPerSecond {
		t.Fatalf("within one second: %d lines re-emitted, want %d", got, logLinesPerSecond)
	}
	if got := testutil.ToFloat64(dropped); got != 4000 {
		t.Errorf("dropped counter = %v, want 4000", got)
	}
	clock = clock.Add(time.Second)
	fmt.Fprintf(w, "next second\n")
	w.close()
	lines := out.lines()
	if len(lines) != logLinesPerSecond+2 {
		t.Fatalf("after the second: %d lines, want %d (the summary and the new line)", len(lines), logLinesPerSecond+2)
	}
	sum := lines[logLinesPerSecond]
	if sum["dropped"] != float64(4000) || sum["level"] != "warn" {
		t.Errorf("summary line = %v, want a warning with dropped=4000", sum)
	}
	if last := lines[len(lines)-1]; last["message"] != "next second" || last["plugin"] != "flood" {
		t.Errorf("last line = %v, want the next second's line", last)
	}
}

// TestPluginLogWriterSummaryTimer: when the flood stops, the summary
// still comes once the second is over, without another line: passing the
// limit arms a timer for the end of the window, whose function reports
// the count.
func TestPluginLogWriterSummaryTimer(t *testing.T) {
	var out syncBuffer
	w := newPluginLogWriter(zerolog.New(&out), "flood", nil)
	start := time.Unix(1000, 0)
	w.now = func() time.Time { return start.Add(300 * time.Millisecond) }
	w.window = start
	for i := range logLinesPerSecond + 10 {
		fmt.Fprintf(w, "line %d\n", i)
	}
	w.mu.Lock()
	armed := w.summaryTime != nil
	w.mu.Unlock()
	if !armed {
		t.Fatal("no summary timer armed after the limit was passed")
	}
	w.summarize() // what the timer runs
	lines := out.lines()
	if len(lines) != logLinesPerSecond+1 || lines[logLinesPerSecond]["dropped"] != float64(10) {
		t.Fatalf("after the window's timer: %d lines, last %v; want the summary of 10 dropped", len(lines), lines[len(lines)-1])
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.summaryTime != nil {
		t.Error("summary timer still armed after it reported")
	}
}
