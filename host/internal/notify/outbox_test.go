package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/store"
)

// fake is a notifier that fails its first fails attempts, then records
// what it is sent.
type fake struct {
	name string
	got  chan string // each delivered body

	mu    sync.Mutex // guards the fields below
	fails int
	tries int
}

func newFake(name string, fails int) *fake {
	return &fake{name: name, fails: fails, got: make(chan string, 100)}
}

func (f *fake) Name() string { return f.name }

func (f *fake) Send(_ context.Context, id string, body []byte) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tries++
	if f.tries <= f.fails {
		return "500", fmt.Errorf("try %d: %w", f.tries, ErrRejected)
	}
	f.got <- string(body)
	return "200", nil
}

func openStore(tb testing.TB, path string) *store.Store {
	tb.Helper()
	s, err := store.Open(context.Background(), path)
	if err != nil {
		tb.Fatalf("store.Open: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

func startOutbox(tb testing.TB, cfg Config) *Outbox {
	tb.Helper()
	cfg.Log = zerolog.Nop()
	cfg.Backoff = cmpOr(cfg.Backoff, time.Millisecond)
	o, err := New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	if err := o.Start(context.Background()); err != nil {
		tb.Fatalf("Start: %v", err)
	}
	tb.Cleanup(o.Close)
	return o
}

func cmpOr(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

func recv(tb testing.TB, f *fake) Event {
	tb.Helper()
	select {
	case body := <-f.got:
		var ev Event
		if err := json.Unmarshal([]byte(body), &ev); err != nil {
			tb.Fatalf("body %q: %v", body, err)
		}
		return ev
	case <-time.After(10 * time.Second):
		tb.Fatalf("%s: no notification within 10s", f.name)
		return Event{}
	}
}

// settled waits until the outbox holds nothing for any notifier (the
// gauge and the store agree).
func settled(tb testing.TB, m *metrics.Metrics, st store.Outbox) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ns, err := st.Notifications(context.Background())
		if err == nil && len(ns) == 0 && testutil.ToFloat64(m.Notify.Pending) == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("outbox not empty after 10s: %d stored (%v), pending %v", len(ns), err, testutil.ToFloat64(m.Notify.Pending))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDeliveredToEveryNotifierOnce(t *testing.T) {
	st := openStore(t, filepath.Join(t.TempDir(), "state.db"))
	m := metrics.New()
	a, b := newFake("a", 0), newFake("b", 2)
	o := startOutbox(t, Config{Store: st, Notifiers: []Notifier{a, b}, LinkBase: "https://tether.example/x/", Metrics: m})
	o.Enqueue(Event{Type: TypeRunCompleted, Session: "k1", Title: "t", RunID: "r1", By: "admin"})
	ea, eb := recv(t, a), recv(t, b)
	if ea.ID == "" || ea.ID != eb.ID {
		t.Errorf("ids: a got %q, b got %q; want the same, not empty", ea.ID, eb.ID)
	}
	if want := "https://tether.example/x/?session=k1"; ea.Link != want {
		t.Errorf("link: got %q, want %q", ea.Link, want)
	}
	if ea.Type != TypeRunCompleted || ea.Session != "k1" || ea.RunID != "r1" || ea.By != "admin" || ea.Time.IsZero() {
		t.Errorf("event: got %+v", ea)
	}
	settled(t, m, st)
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"sent a", testutil.ToFloat64(m.Notify.Sent.WithLabelValues("a")), 1},
		{"sent b", testutil.ToFloat64(m.Notify.Sent.WithLabelValues("b")), 1},
		{"retries a", testutil.ToFloat64(m.Notify.Retries.WithLabelValues("a")), 0},
		{"retries b", testutil.ToFloat64(m.Notify.Retries.WithLabelValues("b")), 2},
		{"failed b", testutil.ToFloat64(m.Notify.Failed.WithLabelValues("b")), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	select {
	case body := <-b.got:
		t.Errorf("b got a second delivery: %s", body)
	default:
	}
}

func TestGivenUpAfterADay(t *testing.T) {
	st := openStore(t, filepath.Join(t.TempDir(), "state.db"))
	m := metrics.New()
	f := newFake("f", 1<<30)
	start := time.Now()
	var mu sync.Mutex
	now := start
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	o := startOutbox(t, Config{Store: st, Notifiers: []Notifier{f}, Metrics: m, Now: clock})
	// The event happened a day ago: its first failure gives it up.
	o.Enqueue(Event{Type: TypeRunFailed, Time: start.Add(-DefaultGiveUp)})
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(m.Notify.Failed.WithLabelValues("f")) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("not given up within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	settled(t, m, st)
	if got := testutil.ToFloat64(m.Notify.Retries.WithLabelValues("f")); got != 0 {
		t.Errorf("retries: got %v, want 0 (given up at the first failure)", got)
	}
	if got := testutil.ToFloat64(m.Notify.Sent.WithLabelValues("f")); got != 0 {
		t.Errorf("sent: got %v, want 0", got)
	}
}

// TestKeptAcrossRestart: what one outbox stored and could not deliver,
// the next one (on the same store) delivers, with the same id; a stored
// notification of a notifier no longer configured is dropped.
func TestKeptAcrossRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st := openStore(t, path)
	m := metrics.New()
	down := newFake("w", 1<<30)
	o, err := New(Config{Store: st, Notifiers: []Notifier{down, newFake("gone", 1<<30)}, Metrics: m, Log: zerolog.Nop(), Backoff: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	o.Enqueue(Event{Type: TypePermissionRequested, Session: "k", RequestID: "q"})
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(m.Notify.Retries.WithLabelValues("w")) < 1 || testutil.ToFloat64(m.Notify.Retries.WithLabelValues("gone")) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no failed attempt within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	o.Close()
	stored, err := st.Notifications(context.Background())
	if err != nil || len(stored) != 2 {
		t.Fatalf("stored after the close: got %d, %v; want 2 (one per notifier)", len(stored), err)
	}

	up := newFake("w", 0)
	m2 := metrics.New()
	startOutbox(t, Config{Store: st, Notifiers: []Notifier{up}, Metrics: m2})
	ev := recv(t, up)
	if ev.ID != stored[0].ID || ev.Type != TypePermissionRequested || ev.RequestID != "q" {
		t.Errorf("after the restart: got %+v, want id %s, the permission request", ev, stored[0].ID)
	}
	settled(t, m2, st)
}

func TestBackoff(t *testing.T) {
	for _, c := range []struct {
		n    int
		want time.Duration
	}{
		{1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {10, 512 * time.Second}, {11, 10 * time.Minute}, {1000, 10 * time.Minute},
	} {
		if got := backoff(DefaultBackoff, DefaultMaxBackoff, c.n); got != c.want {
			t.Errorf("backoff after %d failures: got %v, want %v", c.n, got, c.want)
		}
	}
}

func TestLink(t *testing.T) {
	for _, c := range []struct{ base, session, pty, want string }{
		{"", "k", "", ""},
		{"https://h.example", "k 1", "", "https://h.example/?session=k+1"},
		{"https://h.example/t/", "", "tok", "https://h.example/t/?attach=tok"},
		{"https://h.example", "", "", "https://h.example/"},
	} {
		if got := Link(c.base, c.session, c.pty); got != c.want {
			t.Errorf("Link(%q, %q, %q): got %q, want %q", c.base, c.session, c.pty, got, c.want)
		}
	}
}

func TestWebhookSignsAndRejects(t *testing.T) {
	secret := []byte("s3cret")
	var mu sync.Mutex
	status := http.StatusInternalServerError
	var gotSig, gotType, gotID string
	var gotBody []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		gotSig, gotType, gotID, gotBody = r.Header.Get(SignatureHeader), r.Header.Get("Content-Type"), r.Header.Get(IDHeader), b
		w.WriteHeader(status)
	}))
	defer srv.Close()
	wh, err := NewWebhook(srv.URL+"/hook/SECRETPATH", secret)
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Close()
	body := []byte(`{"id":"x"}`)
	if _, err := wh.Send(context.Background(), "x", body); !errors.Is(err, ErrRejected) {
		t.Errorf("a 500: got %v, want %v", err, ErrRejected)
	}
	mu.Lock()
	status = http.StatusNoContent
	mu.Unlock()
	answer, err := wh.Send(context.Background(), "x", body)
	if err != nil || answer != "204 No Content" {
		t.Errorf("a 204: got %q, %v; want 204 No Content, nil", answer, err)
	}
	mu.Lock()
	if want := Sign(secret, body); gotSig != want || string(gotBody) != string(body) || gotType != "application/json" || gotID != "x" {
		t.Errorf("request: signature %q (want %q), body %q, type %q, id %q", gotSig, want, gotBody, gotType, gotID)
	}
	// A redirect is a failure, never followed.
	status = http.StatusFound
	mu.Unlock()
	if _, err := wh.Send(context.Background(), "x", body); !errors.Is(err, ErrRejected) {
		t.Errorf("a 302: got %v, want %v", err, ErrRejected)
	}
	// An unreachable receiver's error does not quote the URL (it may hold
	// a secret).
	srv.Close()
	if _, err := wh.Send(context.Background(), "x", body); err == nil || strings.Contains(err.Error(), "SECRETPATH") {
		t.Errorf("unreachable: got %v, want an error without the URL's path", err)
	}
	if strings.Contains(wh.Name(), "SECRETPATH") {
		t.Errorf("name %q shows the URL's path", wh.Name())
	}
}
