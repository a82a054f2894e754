package transportkit_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/contract/transportkit"
)

// wait bounds every wait in these tests; reaching it is a failure, never
// a way to synchronise.
const wait = 10 * time.Second

func frame(conn uint64, s string) contract.Event {
	return contract.Event{Kind: contract.EventFrame, Conn: conn, Data: []byte(s)}
}

func always() bool { return true }

// names renders events as "kind conn data" for comparison.
func names(evs []contract.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = fmt.Sprintf("%v %d %s", e.Kind, e.Conn, e.Data)
	}
	return out
}

// sink is an EventSink that records batches. When gate is set, each call
// reports itself on entered and waits for a value on gate.
type sink struct {
	entered chan struct{}
	gate    chan error

	mu      sync.Mutex // guards the fields below
	batches [][]string
	evs     []contract.Event // every event, Data and Header copied
	changed chan struct{}
}

func newSink(gated bool) *sink {
	s := &sink{changed: make(chan struct{})}
	if gated {
		s.entered, s.gate = make(chan struct{}), make(chan error)
	}
	return s
}

func (s *sink) deliver(ctx context.Context, evs []contract.Event) error {
	if s.gate != nil {
		select {
		case s.entered <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := <-s.gate; err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches = append(s.batches, names(evs)) // copies: evs is not retained
	for _, e := range evs {
		e.Data, e.Header = slices.Clone(e.Data), maps.Clone(e.Header)
		s.evs = append(s.evs, e)
	}
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

// batchList returns the batches delivered so far.
func (s *sink) batchList() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.batches)
}

// events returns every event delivered so far.
func (s *sink) events() []contract.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.evs)
}

// all returns every event delivered so far, in order.
func (s *sink) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Concat(s.batches...)
}

// until waits until cond holds for the events delivered so far and
// returns them.
func (s *sink) until(t *testing.T, what string, cond func([]contract.Event) bool) []contract.Event {
	t.Helper()
	timeout := time.After(wait)
	for {
		s.mu.Lock()
		evs, ch := slices.Clone(s.evs), s.changed
		s.mu.Unlock()
		if cond(evs) {
			return evs
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("waiting for %s: not there after %v: %q", what, wait, names(evs))
		}
	}
}

// waitFor waits until n events were delivered and returns them all.
func (s *sink) waitFor(t *testing.T, n int) []string {
	t.Helper()
	timeout := time.After(wait)
	for {
		s.mu.Lock()
		got, ch := slices.Concat(s.batches...), s.changed
		s.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("waiting for %d events: got %d after %v: %q", n, len(got), wait, got)
		}
	}
}

// linker is a Queue or a Stream.
type linker interface {
	Link(ctx context.Context, sink contract.EventSink) error
}

// link runs q.Link with s until the test ends or the returned cancel is
// called; the returned channel gets what Link returned.
func link(t *testing.T, q linker, s *sink) (<-chan error, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		done <- q.Link(ctx, s.deliver)
	}()
	t.Cleanup(func() {
		cancel()
		if s.gate != nil {
			close(s.gate) // a gated call in flight returns
		}
		<-returned
	})
	return done, cancel
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("waiting for %s: nothing after %v", what, wait)
		panic("unreachable")
	}
}

func TestQueueDeliversInOrderAndBatches(t *testing.T) {
	q := transportkit.NewQueue(0)
	// Pushed with no link: the backlog goes out in one batch.
	q.Push(contract.Event{Kind: contract.EventOpened, Conn: 1})
	q.PushFrame(frame(1, "a"), always)
	q.PushFrame(frame(1, "b"), always)
	s := newSink(true)
	link(t, q, s)
	recv(t, s.entered, "the first delivery")
	s.gate <- nil
	if got := s.waitFor(t, 3); len(s.batchList()) != 1 {
		t.Fatalf("backlog: got batches %q, want the three events in one", s.batchList())
	} else if want := []string{"opened 1 ", "frame 1 a", "frame 1 b"}; !slices.Equal(got, want) {
		t.Fatalf("backlog: got %q, want %q", got, want)
	}

	// While the sink is busy, events pile up and go out together. (The
	// link is idle, so PushFrame delivers "c" itself and waits in the
	// sink: it runs on a goroutine of its own.)
	pushedC := make(chan bool, 1)
	go func() { pushedC <- q.PushFrame(frame(1, "c"), always) }()
	recv(t, s.entered, "the second delivery")
	q.PushFrame(frame(1, "d"), always)
	q.Push(contract.Event{Kind: contract.EventClosed, Conn: 1, Code: 1000})
	s.gate <- nil
	recv(t, pushedC, "PushFrame of c, once its delivery returned")
	recv(t, s.entered, "the third delivery")
	s.gate <- nil
	got := s.waitFor(t, 6)
	if want := []string{"opened 1 ", "frame 1 a", "frame 1 b", "frame 1 c", "frame 1 d", "closed 1 "}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if b := s.batchList(); len(b) != 3 || len(b[2]) != 2 {
		t.Errorf("got batches %q, want the two events pushed during the second delivery in the third", b)
	}
}

func TestQueueOneLinkAtATime(t *testing.T) {
	q := transportkit.NewQueue(0)
	first := newSink(false)
	done, cancel := link(t, q, first)
	q.Push(contract.Event{Kind: contract.EventOpened, Conn: 1})
	first.waitFor(t, 1) // the first link runs

	err := q.Link(context.Background(), func(context.Context, []contract.Event) error {
		return errors.New("the second link's sink must not be called")
	})
	if !errors.Is(err, contract.ErrAlreadyLinked) {
		t.Fatalf("second Link: got %v, want contract.ErrAlreadyLinked", err)
	}
	q.PushFrame(frame(1, "still first"), always)
	if got := first.waitFor(t, 2); got[1] != "frame 1 still first" {
		t.Errorf("first link after the second was refused: got %q", got)
	}

	cancel()
	if err := recv(t, done, "the first Link to return"); err != nil {
		t.Fatalf("first Link after its ctx ended: got %v, want nil", err)
	}
	next := newSink(false)
	link(t, q, next)
	q.PushFrame(frame(1, "next"), always)
	if got := next.waitFor(t, 1); got[0] != "frame 1 next" {
		t.Errorf("a Link after the first returned: got %q", got)
	}
}

func TestQueueSinkErrorKeepsBatch(t *testing.T) {
	q := transportkit.NewQueue(0)
	q.Push(contract.Event{Kind: contract.EventOpened, Conn: 1})
	q.PushFrame(frame(1, "a"), always)
	broke := errors.New("sink broke")
	var failed []string
	err := q.Link(context.Background(), func(_ context.Context, evs []contract.Event) error {
		failed = names(evs)
		return broke
	})
	if !errors.Is(err, broke) {
		t.Fatalf("Link: got %v, want the sink's error", err)
	}
	q.PushFrame(frame(1, "b"), always)
	s := newSink(false)
	link(t, q, s)
	got := s.waitFor(t, 3)
	if want := []string{"opened 1 ", "frame 1 a", "frame 1 b"}; !slices.Equal(got, want) || !slices.Equal(failed, want[:2]) {
		t.Fatalf("failed batch %q, then the next link got %q; want %q again, then the rest", failed, got, want[:2])
	}
}

func TestQueueSinkErrorAfterCancel(t *testing.T) {
	q := transportkit.NewQueue(0)
	q.Push(contract.Event{Kind: contract.EventOpened, Conn: 1})
	ctx, cancel := context.WithCancel(context.Background())
	err := q.Link(ctx, func(ctx context.Context, _ []contract.Event) error {
		cancel() // the host went away during the delivery
		return ctx.Err()
	})
	if err != nil {
		t.Fatalf("Link whose ctx ended during a failed delivery: got %v, want nil", err)
	}
	s := newSink(false)
	link(t, q, s)
	if got := s.waitFor(t, 1); got[0] != "opened 1 " {
		t.Errorf("next link: got %q, want the batch kept", got)
	}
}

// keeper is a PushFrame keep function that reports each call on calls
// and answers what ok holds.
type keeper struct {
	ok    atomic.Bool
	calls chan struct{}
}

func newKeeper() *keeper {
	k := &keeper{calls: make(chan struct{}, 16)}
	k.ok.Store(true)
	return k
}

func (k *keeper) keep() bool {
	k.calls <- struct{}{}
	return k.ok.Load()
}

// pushBlocked starts PushFrame(e) on a full queue and returns once it
// waits for room (its keep function was called a second time).
func pushBlocked(t *testing.T, q *transportkit.Queue, e contract.Event) (*keeper, <-chan bool) {
	t.Helper()
	k := newKeeper()
	pushed := make(chan bool, 1)
	go func() { pushed <- q.PushFrame(e, k.keep) }()
	recv(t, k.calls, "PushFrame's first look")
	recv(t, k.calls, "PushFrame's look once the queue is full") // then it waits
	select {
	case ok := <-pushed:
		t.Fatalf("PushFrame on a full queue returned %v, want it to wait", ok)
	default:
	}
	return k, pushed
}

func TestQueueBackpressure(t *testing.T) {
	q := transportkit.NewQueue(1) // room for one event, whatever its size
	if !q.PushFrame(frame(1, "a large first frame"), always) {
		t.Fatal("PushFrame on an empty queue: got false, want it queued")
	}
	q.Push(contract.Event{Kind: contract.EventOpened, Conn: 2}) // Push never waits
	_, pushed := pushBlocked(t, q, frame(1, "b"))

	s := newSink(false)
	link(t, q, s)
	if !recv(t, pushed, "PushFrame once the link took the queue") {
		t.Fatal("PushFrame: got false once there was room, want true")
	}
	got := s.waitFor(t, 3)
	if want := []string{"frame 1 a large first frame", "opened 2 ", "frame 1 b"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestQueuePushFrameDropped(t *testing.T) {
	q := transportkit.NewQueue(1)
	q.PushFrame(frame(1, "a"), always)
	k, pushed := pushBlocked(t, q, frame(1, "never delivered"))
	k.ok.Store(false) // the connection starts closing…
	q.Wake()          // …and says so
	if recv(t, pushed, "PushFrame after Wake") {
		t.Fatal("PushFrame after its keep turned false: got true, want the frame dropped")
	}
	if q.PushFrame(frame(1, "dropped at once"), func() bool { return false }) {
		t.Fatal("PushFrame with keep false: got true, want false")
	}
	q.Push(contract.Event{Kind: contract.EventClosed, Conn: 1})
	s := newSink(false)
	link(t, q, s)
	if got := s.waitFor(t, 2); !slices.Equal(got, []string{"frame 1 a", "closed 1 "}) {
		t.Errorf("got %q, want the first frame and the Closed only", got)
	}
}

func TestQueueSetLimit(t *testing.T) {
	q := transportkit.NewQueue(1)
	q.PushFrame(frame(1, "a"), always)
	_, pushed := pushBlocked(t, q, frame(1, "b"))
	q.SetLimit(1 << 20) // room now: the waiting push looks again
	if !recv(t, pushed, "PushFrame after SetLimit") {
		t.Fatal("PushFrame after the limit was raised: got false, want true")
	}
}

func TestQueueStop(t *testing.T) {
	t.Run("delivers what stop pushed, then Link returns", func(t *testing.T) {
		q := transportkit.NewQueue(0)
		s := newSink(false)
		done, _ := link(t, q, s)
		q.Push(contract.Event{Kind: contract.EventOpened, Conn: 1})
		s.waitFor(t, 1)
		err := q.Stop(context.Background(), func(context.Context) {
			q.Push(contract.Event{Kind: contract.EventClosed, Conn: 1, Code: 1012})
		})
		if err != nil {
			t.Fatalf("Stop: got %v, want nil", err)
		}
		if got := s.all(); !slices.Equal(got, []string{"opened 1 ", "closed 1 "}) {
			t.Errorf("delivered by the time Stop returned: %q, want the Closed stop pushed", got)
		}
		if err := recv(t, done, "Link to return after Stop"); err != nil {
			t.Errorf("Link after Stop: got %v, want nil", err)
		}
	})

	t.Run("once; later calls wait for the first", func(t *testing.T) {
		q := transportkit.NewQueue(0)
		var runs atomic.Int32
		var finished atomic.Bool
		second := make(chan bool, 1)
		err := q.Stop(context.Background(), func(context.Context) {
			runs.Add(1)
			go func() {
				err := q.Stop(context.Background(), func(context.Context) { runs.Add(1) })
				second <- err == nil && finished.Load()
			}()
			finished.Store(true)
		})
		if err != nil {
			t.Fatalf("first Stop: got %v, want nil", err)
		}
		if !recv(t, second, "the second Stop") {
			t.Error("second Stop: returned an error or before the first had finished")
		}
		if err := q.Stop(context.Background(), func(context.Context) { runs.Add(1) }); err != nil {
			t.Errorf("third Stop: got %v, want nil", err)
		}
		if n := runs.Load(); n != 1 {
			t.Errorf("stop ran %d times, want once", n)
		}
	})

	t.Run("bounded by ctx", func(t *testing.T) {
		q := transportkit.NewQueue(0)
		s := newSink(true)
		done, _ := link(t, q, s)
		q.Push(contract.Event{Kind: contract.EventOpened, Conn: 1})
		recv(t, s.entered, "the first delivery") // the link runs
		s.gate <- nil
		ctx, cancel := context.WithCancel(context.Background())
		stopped := make(chan error, 1)
		go func() {
			stopped <- q.Stop(ctx, func(context.Context) {
				q.Push(contract.Event{Kind: contract.EventClosed, Conn: 1})
			})
		}()
		recv(t, s.entered, "the delivery of the Closed") // and the sink hangs
		waiting := make(chan error, 1)
		go func() { waiting <- q.Stop(ctx, func(context.Context) { t.Error("a second stop ran") }) }()
		cancel()
		if err := recv(t, stopped, "Stop after its ctx ended"); !errors.Is(err, context.Canceled) {
			t.Errorf("Stop with a link that hangs: got %v, want context.Canceled", err)
		}
		if err := recv(t, waiting, "the waiting Stop after its ctx ended"); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("a Stop waiting for the first: got %v, want nil or context.Canceled", err)
		}
		s.gate <- nil
		if err := recv(t, done, "Link once the sink answered"); err != nil {
			t.Errorf("Link: got %v, want nil", err)
		}
	})

	t.Run("a link after Stop delivers the rest", func(t *testing.T) {
		q := transportkit.NewQueue(0)
		q.Push(contract.Event{Kind: contract.EventOpened, Conn: 1})
		if err := q.Stop(context.Background(), func(context.Context) {
			q.Push(contract.Event{Kind: contract.EventClosed, Conn: 1})
		}); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		s := newSink(false)
		if err := q.Link(context.Background(), s.deliver); err != nil {
			t.Fatalf("Link after Stop: got %v, want nil once everything is delivered", err)
		}
		if got := s.all(); !slices.Equal(got, []string{"opened 1 ", "closed 1 "}) {
			t.Errorf("Link after Stop delivered %q, want both events", got)
		}
	})
}

// A frame pushed while the link is idle is delivered by PushFrame itself:
// it returns only once the sink has taken it, with no hand-off to the
// link's goroutine. Frames pushed meanwhile wait for the link.
func TestQueuePushFrameDeliversInline(t *testing.T) {
	q, parked := parkedQueue()
	s := newSink(true)
	done, cancel := link(t, q, s)
	recv(t, parked, "the link waiting with nothing to deliver")
	pushed := make(chan bool, 1)
	go func() { pushed <- q.PushFrame(frame(1, "inline"), always) }()
	recv(t, s.entered, "the inline delivery")
	select {
	case <-pushed:
		t.Fatal("PushFrame returned while its delivery was still in the sink; want it delivered from PushFrame")
	default:
	}
	// The link is not idle now: this frame waits for the link.
	if !q.PushFrame(frame(1, "queued"), always) {
		t.Fatal("PushFrame while a delivery runs: got false")
	}
	s.gate <- nil
	recv(t, pushed, "PushFrame once the sink returned")
	recv(t, s.entered, "the link's delivery of the frame pushed meanwhile")
	s.gate <- nil
	if got := s.waitFor(t, 2); !slices.Equal(got, []string{"frame 1 inline", "frame 1 queued"}) {
		t.Fatalf("got %q, want both frames in order", got)
	}

	// Link does not return while an inline delivery is in the sink.
	recv(t, parked, "the link waiting again")
	go func() { pushed <- q.PushFrame(frame(1, "last"), always) }()
	recv(t, s.entered, "the last inline delivery")
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Link returned (%v) while its sink was still running", err)
	default:
	}
	s.gate <- nil
	recv(t, pushed, "the last PushFrame")
	if err := recv(t, done, "Link after the delivery returned"); err != nil {
		t.Fatalf("Link: %v", err)
	}
}

// The sink is never called twice at once, whoever delivers, and every
// event arrives once, each connection's in order.
func TestQueueSinkNeverConcurrent(t *testing.T) {
	q := transportkit.NewQueue(0)
	var (
		mu      sync.Mutex
		inside  int
		overlap bool
		got     = map[uint64][]string{}
		total   int
		all     = make(chan struct{})
	)
	const pushers, each = 8, 300
	ctx, stop := context.WithCancel(context.Background())
	linkDone := make(chan error, 1)
	go func() {
		linkDone <- q.Link(ctx, func(_ context.Context, evs []contract.Event) error {
			mu.Lock()
			inside++
			if inside > 1 {
				overlap = true
			}
			mu.Unlock()
			runtime.Gosched()
			mu.Lock()
			inside--
			for _, e := range evs {
				got[e.Conn] = append(got[e.Conn], string(e.Data))
				total++
			}
			if total == pushers*each {
				close(all)
			}
			mu.Unlock()
			return nil
		})
	}()
	var wg sync.WaitGroup
	for p := range pushers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if i%7 == 0 {
					q.Push(contract.Event{Kind: contract.EventFrame, Conn: uint64(p), Data: []byte(strconv.Itoa(i))})
				} else {
					q.PushFrame(contract.Event{Kind: contract.EventFrame, Conn: uint64(p), Data: []byte(strconv.Itoa(i))}, always)
				}
			}
		}()
	}
	wg.Wait()
	recv(t, all, "every event")
	stop()
	if err := recv(t, linkDone, "Link"); err != nil {
		t.Fatalf("Link: %v", err)
	}
	if overlap {
		t.Error("the sink was called while another call was still in it")
	}
	for p := range pushers {
		for i, v := range got[uint64(p)] {
			if v != strconv.Itoa(i) {
				t.Fatalf("pusher %d: event %d is %q; want each pusher's events once, in order", p, i, v)
			}
		}
	}
}

// An inline delivery that fails because its link is going (the host
// went away) keeps its frame for the next link, and the next link does
// not inherit the failure.
func TestQueueInlineFailureStaysWithItsLink(t *testing.T) {
	q, parked := parkedQueue()
	first := newSink(true)
	done, cancel := link(t, q, first)
	recv(t, parked, "the first link waiting")
	pushed := make(chan bool, 1)
	go func() { pushed <- q.PushFrame(frame(1, "kept"), always) }()
	recv(t, first.entered, "the inline delivery")
	cancel()
	first.gate <- context.Canceled // the host went away during it
	recv(t, pushed, "PushFrame")
	if err := recv(t, done, "the first Link"); err != nil {
		t.Fatalf("first Link, cancelled: got %v, want nil", err)
	}
	next := newSink(false)
	nextDone, _ := link(t, q, next)
	q.PushFrame(frame(1, "after"), always)
	if got := next.waitFor(t, 2); !slices.Equal(got, []string{"frame 1 kept", "frame 1 after"}) {
		t.Fatalf("next link got %q, want the kept frame, then the new one", got)
	}
	select {
	case err := <-nextDone:
		t.Fatalf("the next link returned %v: it inherited the first link's failure", err)
	default:
	}
}

// parkedQueue is a new Queue and a channel that gets a value whenever its
// link waits with nothing to deliver (one kept at most).
func parkedQueue() (*transportkit.Queue, <-chan struct{}) {
	q := transportkit.NewQueue(0)
	parked := make(chan struct{}, 1)
	transportkit.OnPark(q, func() {
		select {
		case parked <- struct{}{}:
		default:
		}
	})
	return q, parked
}
