package embedded

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// TestRepeats: the rules of repeats (window 30 s, gap 5 s), each a
// sequence of lines (when, kind) and how each is logged.
func TestRepeats(t *testing.T) {
	const w, gap = 30 * time.Second, 5 * time.Second
	type line struct {
		at   time.Duration
		kind string
		want verdict
	}
	loud := verdict{loud: true}
	quiet := verdict{}
	// every returns lines of kind every second from from to to (both
	// included), each quiet.
	every := func(kind string, from, to time.Duration) []line {
		var ls []line
		for at := from; at <= to; at += time.Second {
			ls = append(ls, line{at, kind, quiet})
		}
		return ls
	}
	s := time.Second
	tests := []struct {
		name  string
		lines []line
	}{
		{"the first line of a kind is logged", []line{{0, "a", loud}}},
		{"a repeat within the window goes to debug", slices.Concat(
			[]line{{0, "a", loud}}, every("a", s, w-s),
		)},
		{"a repeat a window after the kind was logged is a summary with the count", slices.Concat(
			[]line{{0, "a", loud}}, every("a", s, w-s),
			[]line{{w, "a", verdict{loud: true, repeated: 29, since: w}}, {w + s, "a", quiet}},
		)},
		{"a kind said without a pause is summarised once per window", slices.Concat(
			[]line{{0, "a", loud}}, every("a", 4*s, w-s),
			[]line{{w + s, "a", verdict{loud: true, repeated: 26, since: w + s}}},
			every("a", w+2*s, 2*w),
			[]line{{2*w + s, "a", verdict{loud: true, repeated: 29, since: w}}},
		)},
		{"another kind is logged at once while one repeats", []line{
			{0, "a", loud}, {s, "a", quiet}, {2 * s, "b", loud},
			{3 * s, "a", quiet}, {4 * s, "b", quiet},
		}},
		{"a kind silent for the gap is new again, its count dropped", []line{
			{0, "a", loud}, {s, "a", quiet}, {s + gap - time.Millisecond, "a", quiet}, {2*s + 2*gap, "a", loud}, {3*s + 2*gap, "a", quiet},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			clock := &fakeClock{t: t0}
			r := newRepeats(w, gap, clock.now)
			for i, l := range tt.lines {
				clock.set(t0.Add(l.at))
				if got := r.see(l.kind); got != l.want {
					t.Errorf("line %d (%s at %v): got %+v, want %+v", i, l.kind, l.at, got, l.want)
				}
			}
		})
	}
}

// TestRepeatsBounded: past maxKinds kinds, the stale ones are forgotten,
// and when none is stale, all of them: memory stays bounded, and a
// forgotten kind is only logged again as new.
func TestRepeatsBounded(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := &fakeClock{t: t0}
	r := newRepeats(time.Minute, time.Minute, clock.now)
	for i := range 3 * maxKinds {
		if i == maxKinds {
			clock.set(t0.Add(time.Minute)) // the first maxKinds are stale
		}
		if v := r.see(fmt.Sprint("kind ", i)); !v.loud {
			t.Fatalf("kind %d: got %+v, want it logged as new", i, v)
		}
		if n := len(r.kinds); n > maxKinds {
			t.Fatalf("after %d kinds: %d remembered, want at most %d", i+1, n, maxKinds)
		}
	}
}

// TestKindOf: lines that differ only in a number are one kind; another
// error or another address is another.
func TestKindOf(t *testing.T) {
	const f = "Error trying to connect to route (attempt %v): %v"
	refused := errors.New("dial tcp 127.0.0.1:6222: connect: connection refused")
	tests := []struct {
		name string
		a, b []any
		same bool
	}{
		{"another attempt", []any{17, refused}, []any{18, refused}, true},
		{"another error", []any{17, refused}, []any{17, errors.New("tls: bad certificate")}, false},
		{"another route", []any{17, refused}, []any{17, errors.New("dial tcp 127.0.0.1:6223: connect: connection refused")}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := kindOf(f, tt.a) == kindOf(f, tt.b); got != tt.same {
				t.Errorf("kindOf(%v) == kindOf(%v): got %v, want %v", tt.a, tt.b, got, tt.same)
			}
		})
	}
	if kindOf("a %v", []any{"x"}) == kindOf("b %v", []any{"x"}) {
		t.Error("two formats with one argument are one kind, want two")
	}
}

// TestNATSLoggerRouteRetries: a route to a server that is gone, retried
// eight times a second for 65 s as nats-server does, is one warning, then
// one summary every 30 s with its count; every line is still there at
// debug level; another error meanwhile is logged at once, at error level.
func TestNATSLoggerRouteRetries(t *testing.T) {
	var buf bytes.Buffer
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := &fakeClock{t: t0}
	l := natsLogger{log: zerolog.New(&buf).Level(zerolog.DebugLevel), rep: newRepeats(repeatWindow, repeatGap, clock.now)}
	refused := errors.New("dial tcp 127.0.0.1:6223: connect: connection refused")
	const perSecond, seconds = 8, 65
	for i := range perSecond * seconds {
		clock.set(t0.Add(time.Duration(i) * time.Second / perSecond))
		l.Errorf("Error trying to connect to route (attempt %v): %v", i/4+1, refused)
		if i == 100 {
			l.Errorf("%s - rid:%d - authentication error", "127.0.0.1:50000", 9)
		}
	}
	var loud []string
	debug := 0
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var e struct{ Level, Message string }
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if e.Level == "debug" {
			debug++
			continue
		}
		loud = append(loud, e.Level+" "+e.Message)
	}
	want := []string{
		"warn Error trying to connect to route (attempt 1): " + refused.Error(),
		"error 127.0.0.1:50000 - rid:9 - authentication error",
		"warn Error trying to connect to route (attempt 61): " + refused.Error() + " (and 239 more like it in 30s, at debug level)",
		"warn Error trying to connect to route (attempt 121): " + refused.Error() + " (and 239 more like it in 30s, at debug level)",
	}
	if strings.Join(loud, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines above debug:\n%s\nwant:\n%s", strings.Join(loud, "\n"), strings.Join(want, "\n"))
	}
	if want := perSecond*seconds - 3; debug != want {
		t.Errorf("%d lines at debug, want the %d repeats", debug, want)
	}
}
