package host

import (
	"context"
	"time"

	"github.com/rs/zerolog"
)

// part is one part of the host (parts.go lists them, in start order): it
// is started in order and stopped in reverse, under one deadline. Either
// func may be nil (nothing to do). A start that fails undoes its own
// half-done work before it returns: only the parts started in full are
// stopped. A stop honours its ctx: past the deadline it lets go at once
// (kills, closes) rather than waiting.
type part struct {
	name  string
	start func(ctx context.Context) error
	stop  func(ctx context.Context) error
}

// lifecycle runs parts: in order at the start, in reverse at the stop.
type lifecycle struct {
	parts []part
	// budget is how long the stop may take in all, from the moment it
	// begins: one deadline for every part; a part may shorten its own
	// share (shortened), never open a fresh one.
	budget time.Duration
	log    zerolog.Logger
}

// run starts the parts in order, calls serve when all have started, and
// stops them in reverse when it returns (or when a start fails: then
// only the parts already started are stopped, once). It returns the
// failed start's error, else serve's.
func (l lifecycle) run(ctx context.Context, serve func(ctx context.Context) error) error {
	n, err := l.start(ctx)
	if err == nil {
		err = serve(ctx)
	} else {
		l.log.Debug().Err(err).Str("part", l.parts[n].name).Msg("start failed; stopping the parts started")
	}
	// The stop's deadline is its own: ctx is usually done by now (the stop
	// signal), and a stop must still persist what it can.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.budget)
	defer cancel()
	l.stop(sctx, n)
	return err
}

// start starts the parts in order until one fails; n is how many started
// (the index of the one that failed, if any).
func (l lifecycle) start(ctx context.Context) (n int, err error) {
	for i, p := range l.parts {
		if p.start != nil {
			if err := p.start(ctx); err != nil {
				return i, err
			}
		}
	}
	return len(l.parts), nil
}

// stop stops the first n parts in reverse, each with ctx, whose deadline
// is the whole stop's. A part that overruns it is logged by name, and the
// parts after it are still stopped, with the expired ctx, so that they
// let go at once. A part that ignores the deadline is waited for at most
// lateStop past it, then left behind (named in the log): the stop, and
// Run, return in time whatever a part does.
func (l lifecycle) stop(ctx context.Context, n int) {
	for i := n - 1; i >= 0; i-- {
		p := l.parts[i]
		if p.stop == nil {
			continue
		}
		late := ctx.Err() != nil
		began := time.Now()
		done, err := stopWithin(ctx, p)
		took := time.Since(began)
		switch {
		case !done:
			l.log.Error().Str("part", p.name).Dur("took", took).Msg("stopping this part overran the shutdown deadline and did not let go; left behind, the parts after it are stopped at once")
		case !late && ctx.Err() != nil, late && took > lateStop:
			l.log.Error().Err(err).Str("part", p.name).Dur("took", took).Msg("stopping this part overran the shutdown deadline; the parts after it are stopped at once")
		case err != nil:
			l.log.Error().Err(err).Str("part", p.name).Msg("stopping this part failed")
		default:
			l.log.Debug().Str("part", p.name).Dur("took", took).Bool("late", late).Msg("part stopped")
		}
	}
}

// stopWithin runs p's stop and waits for it until lateStop past ctx's
// end; done is false when it had not returned by then (it goes on, on its
// own goroutine).
func stopWithin(ctx context.Context, p part) (done bool, err error) {
	ch := make(chan error, 1)
	go func() { ch <- p.stop(ctx) }()
	select {
	case err := <-ch:
		return true, err
	case <-ctx.Done():
	}
	t := time.NewTimer(lateStop)
	defer t.Stop()
	select {
	case err := <-ch:
		return true, err
	case <-t.C:
		return false, nil
	}
}

// lateStop is how long a part stopped past the deadline may take to let
// go (kill, close) before it is named as overrunning, and how long one
// that ignores the deadline is waited for before it is left behind.
const lateStop = 500 * time.Millisecond

// shortened is ctx with a deadline reserve earlier than its own (at once
// if that is past), for a step that must leave time to the steps after
// it: the stop of a part shortens the one deadline, never extends it.
func shortened(ctx context.Context, reserve time.Duration) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, d.Add(-reserve))
}
