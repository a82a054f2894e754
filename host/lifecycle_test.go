package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// recorder records the starts and stops of fake parts, and the deadline
// each stop was given.
type recorder struct {
	mu        sync.Mutex // a stop left behind runs beside the next ones
	events    []string
	deadlines []time.Time
	expired   map[string]bool // part name: its stop's ctx was done when it returned
}

// How a fake part's stop behaves.
const (
	stopsAtOnce     = iota
	overruns        // waits for its ctx to end
	ignoresDeadline // waits for the test's end
)

// part is a fake part named name; its start fails with startErr, and its
// stop behaves as how says.
func (r *recorder) part(t *testing.T, name string, startErr error, how int) part {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	return part{
		name: name,
		start: func(context.Context) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.events = append(r.events, "start "+name)
			return startErr
		},
		stop: func(ctx context.Context) error {
			r.mu.Lock()
			r.events = append(r.events, "stop "+name)
			d, _ := ctx.Deadline()
			r.deadlines = append(r.deadlines, d)
			r.mu.Unlock()
			switch how {
			case overruns:
				<-ctx.Done()
			case ignoresDeadline:
				<-release
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			r.expired[name] = ctx.Err() != nil
			return nil
		},
	}
}

// logLines are the JSON log lines in buf.
func logLines(t testing.TB, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// TestLifecycle: parts start in order and stop in reverse under one
// deadline; a part that overruns it is named in the log and the parts
// after it are still stopped, with the expired ctx; a failed start stops
// only the parts that started, once, and Run returns its error.
func TestLifecycle(t *testing.T) {
	errStart := errors.New("b cannot start")
	errServe := errors.New("served")
	for _, tt := range []struct {
		name        string
		failB       bool
		stopB       int
		want        []string
		wantErr     error
		wantOverrun string
		wantExpired map[string]bool
	}{
		{
			name:        "all start in order and stop in reverse",
			want:        []string{"start a", "start b", "start c", "serve", "stop c", "stop b", "stop a"},
			wantErr:     errServe,
			wantExpired: map[string]bool{"a": false, "b": false, "c": false},
		},
		{
			name:        "a failed start stops only the parts started, once",
			failB:       true,
			want:        []string{"start a", "start b", "stop a"},
			wantErr:     errStart,
			wantExpired: map[string]bool{"a": false},
		},
		{
			name:        "an overrun is named and the parts after it still stop, late",
			stopB:       overruns,
			want:        []string{"start a", "start b", "start c", "serve", "stop c", "stop b", "stop a"},
			wantErr:     errServe,
			wantOverrun: "b",
			wantExpired: map[string]bool{"a": true, "b": true, "c": false},
		},
		{
			name:        "a part that ignores the deadline is left behind, named, and the stop ends in time",
			stopB:       ignoresDeadline,
			want:        []string{"start a", "start b", "start c", "serve", "stop c", "stop b", "stop a"},
			wantErr:     errServe,
			wantOverrun: "b",
			wantExpired: map[string]bool{"a": true, "c": false},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{expired: map[string]bool{}}
			var failB error
			if tt.failB {
				failB = errStart
			}
			var buf bytes.Buffer
			l := lifecycle{
				parts:  []part{r.part(t, "a", nil, stopsAtOnce), r.part(t, "b", failB, tt.stopB), r.part(t, "c", nil, stopsAtOnce)},
				budget: 200 * time.Millisecond,
				log:    zerolog.New(&buf),
			}
			began := time.Now()
			err := l.run(context.Background(), func(context.Context) error {
				r.events = append(r.events, "serve")
				return errServe
			})
			if took, most := time.Since(began), l.budget+lateStop+time.Second; took > most {
				t.Errorf("run took %v, want at most %v (the budget, and lateStop for a part that does not let go)", took, most)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("run: got %v, want %v", err, tt.wantErr)
			}
			if !slices.Equal(r.events, tt.want) {
				t.Errorf("got %q, want %q", r.events, tt.want)
			}
			for _, d := range r.deadlines {
				if d.IsZero() || !d.Equal(r.deadlines[0]) {
					t.Errorf("stop deadlines: got %v, want one deadline for every part", r.deadlines)
					break
				}
			}
			for name, want := range tt.wantExpired {
				if got := r.expired[name]; got != want {
					t.Errorf("part %s stopped with its ctx done: got %v, want %v", name, got, want)
				}
			}
			var overran []string
			for _, m := range logLines(t, &buf) {
				if msg, _ := m["message"].(string); strings.Contains(msg, "overran") {
					overran = append(overran, m["part"].(string))
				}
			}
			if want := []string{tt.wantOverrun}; tt.wantOverrun != "" && !slices.Equal(overran, want) || tt.wantOverrun == "" && overran != nil {
				t.Errorf("parts logged as overrunning: got %q, want %q", overran, tt.wantOverrun)
			}
		})
	}
}

// TestShortened: a step's shortened deadline is earlier than the one
// deadline, never later, and without a deadline it is only cancellable.
func TestShortened(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	d, _ := ctx.Deadline()
	s, scancel := shortened(ctx, time.Minute)
	defer scancel()
	if got, _ := s.Deadline(); !got.Equal(d.Add(-time.Minute)) {
		t.Errorf("shortened deadline: got %v, want %v", got, d.Add(-time.Minute))
	}
	n, ncancel := shortened(context.Background(), time.Minute)
	defer ncancel()
	if _, ok := n.Deadline(); ok {
		t.Error("shortened without a deadline: got one, want none")
	}
}
