package transporttest_test

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
	"github.com/tether-agent/tether/testing/internal/kitcheck"
	"github.com/tether-agent/tether/testing/transporttest"
	"github.com/tether-agent/tether/wire"
)

// brokenEnv names the broken transport TestBrokenHelper runs the kit on.
const brokenEnv = "TRANSPORTTEST_BROKEN"

// broken transports: each wraps a real ws.Server and breaks one rule.
var broken = map[string]func(inner contract.Transport) contract.Transport{
	// The baseline: nothing broken.
	"none": func(inner contract.Transport) contract.Transport { return inner },
	// Hands out the lowest connection id not in use, so the id of a
	// closed connection comes back.
	"reused-ids": func(inner contract.Transport) contract.Transport {
		return &lowestFreeID{Transport: inner, toInner: map[uint64]uint64{}, toOuter: map[uint64]uint64{}}
	},
	// Admits every connection itself, so frames flow before the host
	// admits it.
	"early-frames": func(inner contract.Transport) contract.Transport {
		return &selfAdmit{Transport: inner}
	},
	// Reports every Closed with 1000, whatever the code was.
	"lost-close-code": func(inner contract.Transport) contract.Transport {
		return &rewriteClosed{Transport: inner}
	},
	// Reports the most connections ever open as the number open now.
	"peak-stats": func(inner contract.Transport) contract.Transport {
		return &peakStats{Transport: inner}
	},
}

// TestBrokenHelper is not a test: TestKitFailsBrokenTransports runs it in
// a subprocess with brokenEnv set.
func TestBrokenHelper(t *testing.T) {
	name := os.Getenv(brokenEnv)
	if name == "" {
		t.Skip("helper process of TestKitFailsBrokenTransports")
	}
	wrap := broken[name]
	if wrap == nil {
		t.Fatalf("%s=%q: no such broken transport", brokenEnv, name)
	}
	transporttest.Run(t, func(t *testing.T) contract.Transport {
		return wrap(ws.New(zerolog.Nop()))
	})
}

// TestKitFailsBrokenTransports checks that the kit catches each broken
// transport in the checks named, running it in a child process (the kit
// takes a *testing.T, so a failing run must be a failing test).
func TestKitFailsBrokenTransports(t *testing.T) {
	kitcheck.RunBroken(t, brokenEnv, "transport", []kitcheck.Broken{
		{Name: "none"},
		{Name: "reused-ids", WantFail: []string{"ConnIDs"}},
		{Name: "early-frames", WantFail: []string{"NoFrameBeforeAdmit"}},
		{Name: "lost-close-code", WantFail: []string{"RefuseBeforeAdmit", "CloseAfterSend", "Drop", "Stop"}},
		{Name: "peak-stats", WantFail: []string{"Stats"}},
	})
}

// lowestFreeID renumbers connections with the lowest id not in use.
type lowestFreeID struct {
	contract.Transport

	mu      sync.Mutex // guards the fields below
	toInner map[uint64]uint64
	toOuter map[uint64]uint64
}

func (l *lowestFreeID) Link(ctx context.Context, sink contract.EventSink) error {
	return l.Transport.Link(ctx, func(ctx context.Context, evs []contract.Event) error {
		out := make([]contract.Event, 0, len(evs))
		l.mu.Lock()
		for _, e := range evs {
			if e.Kind == contract.EventOpened {
				id := uint64(1)
				for l.toInner[id] != 0 {
					id++
				}
				l.toInner[id], l.toOuter[e.Conn] = e.Conn, id
			}
			inner := e.Conn
			e.Conn = l.toOuter[inner]
			if e.Kind == contract.EventClosed {
				delete(l.toInner, e.Conn)
				delete(l.toOuter, inner)
			}
			out = append(out, e)
		}
		l.mu.Unlock()
		return sink(ctx, out)
	})
}

func (l *lowestFreeID) Exec(ctx context.Context, cmds []contract.Command) error {
	l.mu.Lock()
	out := make([]contract.Command, 0, len(cmds))
	for _, c := range cmds {
		if inner, ok := l.toInner[c.Conn]; ok {
			c.Conn = inner
			out = append(out, c)
		}
	}
	l.mu.Unlock()
	return l.Transport.Exec(ctx, out)
}

// selfAdmit admits each connection as soon as it opens.
type selfAdmit struct{ contract.Transport }

func (s *selfAdmit) Link(ctx context.Context, sink contract.EventSink) error {
	return s.Transport.Link(ctx, func(ctx context.Context, evs []contract.Event) error {
		for _, e := range evs {
			if e.Kind == contract.EventOpened {
				if err := s.Transport.Exec(ctx, []contract.Command{{Kind: contract.CommandAdmit, Conn: e.Conn}}); err != nil {
					return err
				}
			}
		}
		return sink(ctx, evs)
	})
}

// rewriteClosed reports every Closed with 1000.
type rewriteClosed struct{ contract.Transport }

func (r *rewriteClosed) Link(ctx context.Context, sink contract.EventSink) error {
	return r.Transport.Link(ctx, func(ctx context.Context, evs []contract.Event) error {
		out := slices.Clone(evs)
		for i := range out {
			if out[i].Kind == contract.EventClosed {
				out[i].Code, out[i].Reason = wire.CloseNormal, ""
			}
		}
		return sink(ctx, out)
	})
}

// peakStats reports the most connections ever open as Connections.
type peakStats struct {
	contract.Transport

	mu   sync.Mutex // guards the field below
	peak int64
}

func (p *peakStats) Stats(ctx context.Context) (contract.TransportStats, error) {
	st, err := p.Transport.(contract.StatsReporter).Stats(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.peak = max(p.peak, st.Connections)
	st.Connections = p.peak
	return st, err
}
