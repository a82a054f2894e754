// Package notifytest is a conformance kit for tether notifiers — the
// built-in webhook, and notifier plugins (contract.Notifier, served with
// contract.ServeNotifier): it checks from the outside what the host's
// outbox relies on. Call Run from a test of your own, like
// testing/fstest.TestFS:
//
//	func TestConformance(t *testing.T) {
//		notifytest.Run(t, func(t *testing.T, r *notifytest.Receiver) contract.Notifier {
//			return mynotifier.New(r.URL) // deliver to the kit's receiver
//		})
//	}
//
// Each check is a named subtest with a receiver and a notifier of its
// own. The receiver is an HTTP endpoint: a notifier under test delivers
// there (a push or chat notifier points its server URL at it). A
// delivery is one request whose X-Tether-Event-Id header or body holds
// the event's id; the receiver answers 204 unless a check makes it
// refuse (500) or hang.
//
// What the host relies on, check by check:
//   - Delivers: Notify returns nil only once the receiver has the
//     notification, delivered once.
//   - RefusedIsError, UnreachableIsError: a receiver that refuses or is
//     down makes Notify fail (the host retries later), never nil.
//   - HonoursContext: Notify returns when its context ends, even if the
//     receiver never answers.
//   - Concurrent: Notify is safe to call from several goroutines.
package notifytest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
)

// wait bounds what a check waits for.
const wait = 10 * time.Second

// Receiver is the kit's HTTP endpoint that notifiers deliver to.
type Receiver struct {
	// URL is where to deliver.
	URL string

	srv  *httptest.Server
	hang chan struct{} // closed at cleanup: ends hanging requests

	mu      sync.Mutex // guards the fields below
	refuse  int        // the next requests answered 500
	hanging bool       // requests wait until cleanup
	got     [][]byte   // each request's id header and body
}

func newReceiver(t *testing.T) *Receiver {
	r := &Receiver{hang: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	r.URL = r.srv.URL + "/notify"
	t.Cleanup(func() {
		close(r.hang)
		r.srv.Close()
	})
	return r
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	hanging := r.hanging
	refuse := r.refuse > 0
	if refuse {
		r.refuse--
	}
	if !hanging && !refuse {
		r.got = append(r.got, append([]byte(req.Header.Get("X-Tether-Event-Id")+"\n"), body...))
	}
	r.mu.Unlock()
	switch {
	case hanging:
		select {
		case <-r.hang:
		case <-req.Context().Done():
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	case refuse:
		w.WriteHeader(http.StatusInternalServerError)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// count is how many deliveries held id.
func (r *Receiver) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, g := range r.got {
		if bytes.Contains(g, []byte(id)) {
			n++
		}
	}
	return n
}

// check is one named check.
type check struct {
	name string
	run  func(t *testing.T, n contract.Notifier, r *Receiver)
}

// Run runs every check against the notifiers newNotifier makes, one per
// check, each delivering to the Receiver it is given.
func Run(t *testing.T, newNotifier func(t *testing.T, r *Receiver) contract.Notifier) {
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			r := newReceiver(t)
			c.run(t, newNotifier(t, r), r)
		})
	}
}

// event is a notification body of the given id.
func event(id string) []byte {
	return fmt.Appendf(nil, `{"id":%q,"type":"test","time":"2026-01-02T03:04:05Z","title":"notifytest"}`, id)
}

func notify(t *testing.T, n contract.Notifier, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := n.Notify(ctx, id, event(id))
	return err
}

var checks = []check{
	{"Delivers", func(t *testing.T, n contract.Notifier, r *Receiver) {
		const id = "0123456789abcdef0123456789abcdef"
		if err := notify(t, n, id); err != nil {
			t.Fatalf("Notify: got %v, want nil", err)
		}
		if got := r.count(id); got != 1 {
			t.Errorf("deliveries holding the id when Notify returned: got %d, want 1", got)
		}
	}},
	{"RefusedIsError", func(t *testing.T, n contract.Notifier, r *Receiver) {
		r.mu.Lock()
		r.refuse = 1 << 20
		r.mu.Unlock()
		if err := notify(t, n, "refused00000000000000000000000000"); err == nil {
			t.Error("Notify to a receiver answering 500: got nil, want an error (the host would drop it)")
		}
	}},
	{"UnreachableIsError", func(t *testing.T, n contract.Notifier, r *Receiver) {
		r.srv.Close()
		if err := notify(t, n, "unreachable0000000000000000000000"); err == nil {
			t.Error("Notify to a receiver that is down: got nil, want an error")
		}
	}},
	{"HonoursContext", func(t *testing.T, n contract.Notifier, r *Receiver) {
		r.mu.Lock()
		r.hanging = true
		r.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := n.Notify(ctx, "hang", event("hang"))
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Error("Notify to a receiver that never answers: got nil, want an error")
			}
		case <-time.After(wait):
			t.Errorf("Notify did not return within %s of its context's end", wait)
		}
	}},
	{"Concurrent", func(t *testing.T, n contract.Notifier, r *Receiver) {
		const workers = 8
		errs := make(chan error, workers)
		for i := range workers {
			go func() { errs <- notify(t, n, fmt.Sprintf("concurrent%022d", i)) }()
		}
		for range workers {
			if err := <-errs; err != nil {
				t.Errorf("Notify: got %v, want nil", err)
			}
		}
		for i := range workers {
			if got := r.count(fmt.Sprintf("concurrent%022d", i)); got != 1 {
				t.Errorf("notification %d: delivered %d times, want 1", i, got)
			}
		}
	}},
}
