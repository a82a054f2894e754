package notify

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/store"
)

// Defaults of Config.
const (
	// DefaultBackoff is the wait before the first retry; it doubles
	// after each failed attempt.
	DefaultBackoff = time.Second
	// DefaultMaxBackoff caps the wait between two attempts.
	DefaultMaxBackoff = 10 * time.Minute
	// DefaultGiveUp is how long after the event its notification is
	// retried.
	DefaultGiveUp = 24 * time.Hour
	// DefaultSendTimeout bounds one attempt.
	DefaultSendTimeout = 10 * time.Second
	// maxIntake bounds the events enqueued and not yet stored; more are
	// dropped (and counted as failed).
	maxIntake = 10000
	// storeTimeout bounds one write of the outbox.
	storeTimeout = 5 * time.Second
)

// Config configures an Outbox.
type Config struct {
	// Store keeps the notifications not yet delivered.
	Store store.Outbox
	// Notifiers receive every event; their names must differ.
	Notifiers []Notifier
	// LinkBase is the host's public URL, the base of the events' links
	// (SetLinkBase changes it).
	LinkBase string
	// Backoff, MaxBackoff, GiveUp and SendTimeout: 0 means the default.
	Backoff, MaxBackoff, GiveUp, SendTimeout time.Duration
	Log                                      zerolog.Logger
	Metrics                                  *metrics.Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Outbox stores every event once per notifier, sends it, retries it with
// backoff and deletes it once delivered. Enqueue never blocks.
type Outbox struct {
	cfg     Config
	workers []*worker
	base    atomic.Pointer[string]
	kick    chan struct{} // cap 1: the intake has events
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu     sync.Mutex // guards the fields below
	in     []Event
	closed bool
}

// New returns an outbox for cfg; Start loads what the store kept and
// starts sending.
func New(cfg Config) (*Outbox, error) {
	cfg.Backoff = cmp.Or(cfg.Backoff, DefaultBackoff)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, DefaultMaxBackoff)
	cfg.GiveUp = cmp.Or(cfg.GiveUp, DefaultGiveUp)
	cfg.SendTimeout = cmp.Or(cfg.SendTimeout, DefaultSendTimeout)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	o := &Outbox{cfg: cfg, kick: make(chan struct{}, 1)}
	o.SetLinkBase(cfg.LinkBase)
	seen := map[string]bool{}
	for _, n := range cfg.Notifiers {
		name := n.Name()
		if seen[name] {
			return nil, fmt.Errorf("notifier %s: named twice", name)
		}
		seen[name] = true
		o.workers = append(o.workers, &worker{o: o, n: n, name: name, log: cfg.Log.With().Str("notifier", name).Logger(),
			kick: make(chan struct{}, 1)})
		cfg.Metrics.Notify.Init(name)
	}
	return o, nil
}

// Notifiers lists the names of the outbox's notifiers.
func (o *Outbox) Notifiers() []string {
	names := make([]string, len(o.workers))
	for i, w := range o.workers {
		names[i] = w.name
	}
	return names
}

// SetLinkBase sets the base of the links of the events enqueued after.
func (o *Outbox) SetLinkBase(base string) { o.base.Store(&base) }

// Start loads the notifications the store kept (a previous host's, not
// yet delivered: they are sent at once) and starts sending. Kept ones of
// a notifier no longer configured are deleted.
func (o *Outbox) Start(ctx context.Context) error {
	kept, err := o.cfg.Store.Notifications(ctx)
	if err != nil {
		return fmt.Errorf("notifications: load the outbox: %w", err)
	}
	byName := map[string]*worker{}
	for _, w := range o.workers {
		byName[w.name] = w
	}
	for _, n := range kept {
		w := byName[n.Notifier]
		if w == nil {
			o.cfg.Log.Warn().Str("notifier", n.Notifier).Str("id", n.ID).Msg("a stored notification's notifier is no longer configured: dropped")
			if err := o.cfg.Store.DeleteNotification(ctx, n.ID, n.Notifier); err != nil {
				return fmt.Errorf("notifications: %w", err)
			}
			continue
		}
		w.add(&item{id: n.ID, body: n.Body, created: n.Created, due: o.cfg.Now()})
	}
	if len(kept) > 0 {
		o.cfg.Log.Info().Int("notifications", len(kept)).Msg("notifications kept by the last host: sending")
	}
	o.ctx, o.cancel = context.WithCancel(context.WithoutCancel(ctx))
	o.wg.Go(o.intake)
	for _, w := range o.workers {
		o.wg.Go(w.run)
	}
	return nil
}

// Enqueue queues ev for every notifier, filling its id, time and link
// when empty; it never blocks (the event is stored and sent by the
// outbox's own goroutines). An event past a full intake, or enqueued
// after Close, is dropped and counted as failed.
func (o *Outbox) Enqueue(ev Event) {
	if len(o.workers) == 0 {
		return
	}
	ev.ID = cmp.Or(ev.ID, newID())
	if ev.Time.IsZero() {
		ev.Time = o.cfg.Now()
	}
	if ev.Link == "" {
		ev.Link = Link(*o.base.Load(), ev.Session, ev.PTY)
	}
	o.mu.Lock()
	if o.closed || len(o.in) >= maxIntake {
		closed := o.closed
		o.mu.Unlock()
		for _, w := range o.workers {
			o.cfg.Metrics.Notify.Failed.WithLabelValues(w.name).Inc()
		}
		o.cfg.Log.Warn().Str("id", ev.ID).Str("type", ev.Type).Bool("closed", closed).Msg("notification dropped: the outbox is closed or full")
		return
	}
	o.in = append(o.in, ev)
	o.mu.Unlock()
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// intake stores the enqueued events, then hands them to the notifiers'
// workers. At Close it stores what is left, for the next host.
func (o *Outbox) intake() {
	for {
		select {
		case <-o.ctx.Done():
			o.mu.Lock()
			o.closed = true
			evs := o.in
			o.in = nil
			o.mu.Unlock()
			o.store(context.Background(), evs)
			return
		case <-o.kick:
		}
		o.mu.Lock()
		evs := o.in
		o.in = nil
		o.mu.Unlock()
		items := o.store(o.ctx, evs)
		for _, w := range o.workers {
			for _, it := range items {
				w.add(&item{id: it.id, body: it.body, created: it.created, due: it.due})
			}
		}
	}
}

// store stores evs once per notifier, within storeTimeout of ctx, and
// returns them as items. A failed store is logged: the items are still
// sent, but a restart before delivery loses them.
func (o *Outbox) store(ctx context.Context, evs []Event) []item {
	if len(evs) == 0 {
		return nil
	}
	items := make([]item, 0, len(evs))
	rows := make([]store.Notification, 0, len(evs)*len(o.workers))
	now := o.cfg.Now()
	for _, ev := range evs {
		body, err := encode(ev)
		if err != nil {
			o.cfg.Log.Error().Err(err).Msg("notification dropped")
			continue
		}
		items = append(items, item{id: ev.ID, body: body, created: ev.Time, due: now})
		for _, w := range o.workers {
			rows = append(rows, store.Notification{ID: ev.ID, Notifier: w.name, Body: body, Created: ev.Time})
		}
	}
	sctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	if err := o.cfg.Store.PutNotifications(sctx, rows); err != nil {
		o.cfg.Log.Warn().Err(err).Int("notifications", len(items)).Msg("notifications not stored: sent, but lost if the host stops before they are delivered")
	}
	return items
}

// Close stops sending (an attempt in flight is cancelled and stays
// stored), stores what was enqueued but not yet stored, waits for the
// outbox's goroutines and closes the notifiers that have a Close.
func (o *Outbox) Close() {
	if o.cancel == nil {
		o.mu.Lock()
		o.closed = true
		o.mu.Unlock()
		return
	}
	o.cancel()
	o.wg.Wait()
	for _, w := range o.workers {
		if c, ok := w.n.(interface{ Close() }); ok {
			c.Close()
		}
	}
}

// Result is one notifier's answer to a test notification.
type Result struct {
	Notifier string
	Answer   string
	Err      error
}

// Test sends one test notification to every notifier, directly (it is
// not stored, nor retried), and returns each one's answer.
func (o *Outbox) Test(ctx context.Context) []Result {
	ev := Event{ID: newID(), Type: TypeTest, Time: o.cfg.Now(), Title: "tether notify test", Link: Link(*o.base.Load(), "", "")}
	body, err := encode(ev)
	out := make([]Result, len(o.workers))
	for i, w := range o.workers {
		out[i].Notifier = w.name
		if err != nil {
			out[i].Err = err
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, o.cfg.SendTimeout)
		out[i].Answer, out[i].Err = w.n.Send(sctx, ev.ID, body)
		cancel()
	}
	return out
}

// item is one notification waiting for one notifier.
type item struct {
	id       string
	body     []byte
	created  time.Time
	due      time.Time // the next attempt
	attempts int
}

// worker sends one notifier's notifications, one at a time, the one
// due first first.
type worker struct {
	o    *Outbox
	n    Notifier
	name string
	log  zerolog.Logger
	kick chan struct{} // cap 1: an item was added

	mu    sync.Mutex // guards the fields below
	items []*item
}

func (w *worker) add(it *item) {
	w.mu.Lock()
	if slices.ContainsFunc(w.items, func(x *item) bool { return x.id == it.id }) {
		w.mu.Unlock()
		return
	}
	w.items = append(w.items, it)
	w.mu.Unlock()
	w.o.cfg.Metrics.Notify.Pending.Inc()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// next is the item due first, or nil.
func (w *worker) next() *item {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first *item
	for _, it := range w.items {
		if first == nil || it.due.Before(first.due) {
			first = it
		}
	}
	return first
}

func (w *worker) remove(it *item) {
	w.mu.Lock()
	w.items = slices.DeleteFunc(w.items, func(x *item) bool { return x == it })
	w.mu.Unlock()
	w.o.cfg.Metrics.Notify.Pending.Dec()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.o.ctx), storeTimeout)
	defer cancel()
	if err := w.o.cfg.Store.DeleteNotification(ctx, it.id, w.name); err != nil {
		w.log.Warn().Err(err).Str("id", it.id).Msg("a delivered notification stays stored: the next host sends it again")
	}
}

func (w *worker) run() {
	ctx := w.o.ctx
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		it := w.next()
		var wait <-chan time.Time
		if it != nil {
			if d := it.due.Sub(w.o.cfg.Now()); d > 0 {
				if timer == nil {
					timer = time.NewTimer(d)
				} else {
					timer.Reset(d)
				}
				wait, it = timer.C, nil
			}
		}
		if it == nil {
			select {
			case <-ctx.Done():
				return
			case <-w.kick:
			case <-wait:
			}
			continue
		}
		w.attempt(ctx, it)
	}
}

// attempt sends it once: delivered, it is removed; failed, it is due
// again after the backoff, or given up 24 h after its event.
func (w *worker) attempt(ctx context.Context, it *item) {
	cfg := w.o.cfg
	sctx, cancel := context.WithTimeout(ctx, cfg.SendTimeout)
	answer, err := w.n.Send(sctx, it.id, it.body)
	cancel()
	if ctx.Err() != nil {
		return // closing: it stays stored for the next host
	}
	if err == nil {
		cfg.Metrics.Notify.Sent.WithLabelValues(w.name).Inc()
		w.log.Debug().Str("id", it.id).Str("answer", answer).Int("attempts", it.attempts+1).Msg("notification delivered")
		w.remove(it)
		return
	}
	it.attempts++
	now := cfg.Now()
	if now.Sub(it.created) >= cfg.GiveUp {
		cfg.Metrics.Notify.Failed.WithLabelValues(w.name).Inc()
		w.log.Error().Err(err).Str("id", it.id).Int("attempts", it.attempts).Msg("notification given up: not delivered within a day")
		w.remove(it)
		return
	}
	cfg.Metrics.Notify.Retries.WithLabelValues(w.name).Inc()
	wait := backoff(cfg.Backoff, cfg.MaxBackoff, it.attempts)
	w.mu.Lock()
	it.due = now.Add(wait)
	w.mu.Unlock()
	ev := w.log.Debug()
	if it.attempts == 1 {
		ev = w.log.Warn()
	}
	ev.Err(err).Str("id", it.id).Int("attempts", it.attempts).Str("retry_in", wait.String()).Msg("notification not delivered: retrying")
}

// backoff is the wait after the n-th failed attempt (n >= 1): first,
// doubling, at most ceiling.
func backoff(first, ceiling time.Duration, n int) time.Duration {
	d := first
	for i := 1; i < n && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling)
}
