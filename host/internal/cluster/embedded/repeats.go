package embedded

import (
	"fmt"
	"sync"
	"time"
)

// repeatWindow is how often at most a line said again and again is
// summarised at its level, and repeatGap how long a kind of line must
// have been silent to be new again (nats-server retries a route every
// second).
const (
	repeatWindow = 30 * time.Second
	repeatGap    = 5 * time.Second
)

// maxKinds bounds how many kinds of line repeats remembers: past it, the
// kinds silent for a gap are forgotten, and if that is not enough,
// all of them (their next lines are logged as new).
const maxKinds = 512

// repeats tells the log lines that say one thing again and again —
// nats-server retrying a route to a server that is gone writes several
// a second — from new ones. The first line of a kind is logged at its
// level; the repeats go to debug, counted; a repeat a window or more
// after the kind was last logged at its level is logged at its level
// again, with how many went to debug meanwhile (a summary, at most one
// per window). A line of another kind (another error, another route) is
// new and logged at once, and so is a kind that was silent for a gap (the
// trouble it told of ended, and this is a new one). Its methods are safe
// for concurrent use.
type repeats struct {
	window, gap time.Duration
	now         func() time.Time

	mu    sync.Mutex // guards the fields below
	kinds map[string]*repeat
}

// repeat is what repeats knows of one kind of line.
type repeat struct {
	loud  time.Time // when one was last logged at its level
	last  time.Time // when one was last seen
	quiet int       // how many went to debug since loud
}

// verdict is how to log one line.
type verdict struct {
	// loud: at the line's own level; else at debug.
	loud bool
	// repeated is, on a loud line, how many lines of its kind went to
	// debug since the last loud one (0: a new line, not a summary), and
	// since how long ago that one was.
	repeated int
	since    time.Duration
}

// newRepeats returns a repeats with window and gap on the clock now
// (nil: time.Now).
func newRepeats(window, gap time.Duration, now func() time.Time) *repeats {
	if now == nil {
		now = time.Now
	}
	return &repeats{window: window, gap: gap, now: now, kinds: make(map[string]*repeat)}
}

// see records one line of kind and says how to log it.
func (r *repeats) see(kind string) verdict {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	k := r.kinds[kind]
	switch {
	case k == nil || now.Sub(k.last) >= r.gap:
		if k == nil {
			r.makeRoomLocked(now)
		}
		r.kinds[kind] = &repeat{loud: now, last: now}
		return verdict{loud: true}
	case now.Sub(k.loud) >= r.window:
		v := verdict{loud: true, repeated: k.quiet, since: now.Sub(k.loud)}
		k.loud, k.last, k.quiet = now, now, 0
		return v
	default:
		k.last = now
		k.quiet++
		return verdict{}
	}
}

// makeRoomLocked makes room for one more kind.
func (r *repeats) makeRoomLocked(now time.Time) {
	if len(r.kinds) < maxKinds {
		return
	}
	for kind, k := range r.kinds {
		if now.Sub(k.last) >= r.gap {
			delete(r.kinds, kind)
		}
	}
	if len(r.kinds) >= maxKinds {
		clear(r.kinds)
	}
}

// kindOf is the kind of the line format and args make: its format and
// every argument but the numbers (a line that differs from another only
// in a count, such as nats-server's "attempt %v", is of the same kind).
func kindOf(format string, args []any) string {
	kind := format
	for _, a := range args {
		switch a.(type) {
		case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64:
			kind += "\x00#"
		default:
			kind += "\x00" + fmt.Sprint(a)
		}
	}
	return kind
}
