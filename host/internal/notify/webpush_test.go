package notify

import (
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/testing/notifytest"
	"github.com/tether-agent/tether/testing/pushtest"
)

// memPush is a PushStore in memory.
type memPush struct {
	mu   sync.Mutex
	subs []store.PushSubscription
}

func (m *memPush) PutPushSubscription(_ context.Context, s store.PushSubscription) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.subs {
		if m.subs[i].Endpoint == s.Endpoint {
			m.subs[i] = s
			return nil
		}
	}
	m.subs = append(m.subs, s)
	return nil
}

func (m *memPush) DeletePushSubscription(_ context.Context, endpoint string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.subs {
		if m.subs[i].Endpoint == endpoint {
			m.subs = append(m.subs[:i], m.subs[i+1:]...)
			return nil
		}
	}
	return nil
}

func (m *memPush) PushSubscriptions(context.Context) ([]store.PushSubscription, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]store.PushSubscription(nil), m.subs...), nil
}

// reach is a Reach of scopes (nil: revoked) like the host's: admin
// reaches everything, session:KEY[:view] and pty:TOKEN[:view] theirs.
func reach(scopes []string, kind, id string) bool {
	if slices.Contains(scopes, "admin") {
		return true
	}
	return kind != ReachAdmin && (slices.Contains(scopes, kind+":"+id) || slices.Contains(scopes, kind+":"+id+":view"))
}

// newPush returns an insecure WebPush (local endpoints) whose
// credentials have the scopes of creds (one not there is revoked).
func newPush(t *testing.T, st store.PushStore, creds map[string][]string) *WebPush {
	t.Helper()
	keys, err := LoadVAPIDKeys(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWebPush(PushConfig{Keys: keys, Subject: "mailto:ops@example.com", Store: st, Insecure: true, Log: zerolog.Nop(),
		Reach: func(id, kind, key string) bool { return reach(creds[id], kind, key) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w
}

func subscribe(t *testing.T, w *WebPush, cred string, r *pushtest.Receiver) {
	t.Helper()
	if err := w.Subscribe(context.Background(), cred, r.Endpoint, r.P256dh, r.Auth); err != nil {
		t.Fatalf("Subscribe(%s): %v", cred, err)
	}
}

func send(t *testing.T, w *WebPush, ev Event) error {
	t.Helper()
	body, err := encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = w.Send(ctx, ev.ID, body)
	return err
}

var permEvent = Event{ID: "0123456789abcdef0123456789abcdef", Type: TypePermissionRequested, Session: "20260102_030405_000001",
	Title: "fix the build", RunID: "r1", By: "dana", Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	Link: "https://tether.example/?session=20260102_030405_000001", RequestID: "q1", Tool: "rm -rf build", Unattended: true}

// TestWebPushDecrypts pushes a permission request to a local push
// endpoint that checks the VAPID JWT and decrypts the push with the keys
// of the subscription it made: the payload is the event. A credential
// of another session and a revoked one get nothing.
func TestWebPushDecrypts(t *testing.T) {
	st := &memPush{}
	w := newPush(t, st, map[string][]string{"ca": {"session:" + permEvent.Session}, "cb": {"session:20260102_030405_000002"}, "cadmin": {"admin"}})
	a, b, gone, admin := pushtest.NewReceiver(t), pushtest.NewReceiver(t), pushtest.NewReceiver(t), pushtest.NewReceiver(t)
	subscribe(t, w, "ca", a)
	subscribe(t, w, "cb", b)
	subscribe(t, w, "cadmin", admin)
	if err := w.Subscribe(context.Background(), "crevoked", gone.Endpoint, gone.P256dh, gone.Auth); err != nil {
		t.Fatal(err) // revoked after subscribing: the scopes func no longer knows it
	}
	if err := send(t, w, permEvent); err != nil {
		t.Fatalf("Send: %v", err)
	}
	for _, r := range []*pushtest.Receiver{a, admin} {
		p := r.Wait(t, 1)
		if len(p) != 1 {
			t.Fatalf("pushes: got %d, want 1", len(p))
		}
		var got Event
		if err := json.Unmarshal(p[0].Payload, &got); err != nil {
			t.Fatalf("decrypted payload %q: %v", p[0].Payload, err)
		}
		if got.ID != permEvent.ID || got.Type != permEvent.Type || got.Link != permEvent.Link || got.Session != permEvent.Session ||
			got.Title != permEvent.Title || got.Tool != permEvent.Tool || !got.Time.Equal(permEvent.Time) {
			t.Errorf("decrypted payload: got %+v, want %+v", got, permEvent)
		}
		if p[0].VAPIDKey != w.PublicKey() {
			t.Errorf("VAPID k: got %s, want the host's public key %s", p[0].VAPIDKey, w.PublicKey())
		}
		if sub := p[0].Claims["sub"]; sub != "mailto:ops@example.com" {
			t.Errorf("VAPID sub: got %v, want mailto:ops@example.com", sub)
		}
		h := p[0].Header
		if h.Get("Urgency") != "high" || h.Get("TTL") != "43200" || h.Get("Topic") != permEvent.ID {
			t.Errorf("Urgency, TTL, Topic: got %q %q %q, want high 43200 %s", h.Get("Urgency"), h.Get("TTL"), h.Get("Topic"), permEvent.ID)
		}
	}
	for name, r := range map[string]*pushtest.Receiver{"session:B's": b, "a revoked credential's": gone} {
		if n := len(r.Pushes()); n != 0 {
			t.Errorf("%s subscription: got %d pushes of a permission request in session A, want 0", name, n)
		}
	}
	// A run of which a viewer was connected is not pushed.
	attended := permEvent
	attended.ID, attended.Unattended = "attended000000000000000000000000", false
	if err := send(t, w, attended); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if n := len(a.Pushes()); n != 1 {
		t.Errorf("pushes after an event somebody was connected for: got %d, want still 1", n)
	}
}

// TestWebPushGoneAndRetried: a 410 deletes the subscription; a 500 fails
// Send, and the retry pushes only to the subscription that failed.
func TestWebPushGoneAndRetried(t *testing.T) {
	st := &memPush{}
	w := newPush(t, st, map[string][]string{"c": {"admin"}})
	ok, failing, gone := pushtest.NewReceiver(t), pushtest.NewReceiver(t), pushtest.NewReceiver(t)
	for _, r := range []*pushtest.Receiver{ok, failing, gone} {
		subscribe(t, w, "c", r)
	}
	failing.SetStatus(http.StatusInternalServerError)
	gone.SetStatus(http.StatusGone)
	if err := send(t, w, permEvent); !errors.Is(err, ErrRejected) {
		t.Fatalf("Send with a push service answering 500: got %v, want %v", err, ErrRejected)
	}
	subs, _ := st.PushSubscriptions(context.Background())
	if len(subs) != 2 {
		t.Errorf("subscriptions after a 410: got %d, want 2 (the gone one deleted)", len(subs))
	}
	failing.SetStatus(http.StatusCreated)
	if err := send(t, w, permEvent); err != nil {
		t.Fatalf("Send again: %v", err)
	}
	if n, m := len(ok.Pushes()), len(failing.Pushes()); n != 1 || m != 2 {
		t.Errorf("pushes: got %d to the one that took it and %d to the one that failed first, want 1 and 2", n, m)
	}
}

func TestWebPushSubscribe(t *testing.T) {
	ctx := context.Background()
	st := &memPush{}
	w := newPush(t, st, nil)
	r := pushtest.NewReceiver(t)
	secure, err := NewWebPush(PushConfig{Keys: w.cfg.Keys, Subject: "https://tether.example", Store: st, Log: zerolog.Nop(), Reach: func(string, string, string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(secure.Close)
	cases := []struct {
		name                   string
		w                      *WebPush
		endpoint, p256dh, auth string
	}{
		{"http without the insecure option", secure, r.Endpoint, r.P256dh, r.Auth},
		{"http to another host", w, "http://push.example/x", r.P256dh, r.Auth},
		{"a private address", secure, "https://10.1.2.3/push", r.P256dh, r.Auth},
		{"loopback", secure, "https://127.0.0.1:8443/push", r.P256dh, r.Auth},
		{"user info", secure, "https://u:p@push.example/x", r.P256dh, r.Auth},
		{"not a URL", w, "push", r.P256dh, r.Auth},
		{"a key off the curve", w, r.Endpoint, base64.RawURLEncoding.EncodeToString(make([]byte, 65)), r.Auth},
		{"a short auth", w, r.Endpoint, r.P256dh, "AAAA"},
		{"too long", secure, "https://push.example/" + strings.Repeat("a", 2100), r.P256dh, r.Auth},
	}
	for _, c := range cases {
		if err := c.w.Subscribe(ctx, "c", c.endpoint, c.p256dh, c.auth); !errors.Is(err, ErrBadSubscription) {
			t.Errorf("%s: got %v, want %v", c.name, err, ErrBadSubscription)
		}
	}
	if err := w.Subscribe(ctx, "", r.Endpoint, r.P256dh, r.Auth); !errors.Is(err, ErrBadSubscription) {
		t.Errorf("with no credential: got %v, want %v", err, ErrBadSubscription)
	}
	// A name is checked where it is dialled: localhost is refused.
	if err := secure.Subscribe(ctx, "c", "https://localhost:1/push", r.P256dh, r.Auth); err != nil {
		t.Fatalf("Subscribe https://localhost: %v", err)
	}
	if err := send(t, secure, Event{ID: "t1", Type: TypeTest}); !errors.Is(err, ErrNotPushable) {
		t.Errorf("a push to a name resolving to loopback: got %v, want %v", err, ErrNotPushable)
	}
	if _, err := secure.Unsubscribe(ctx, "c", "https://localhost:1/push", false); err != nil {
		t.Fatal(err)
	}
	// The cap, counting a resubscription once; another's endpoint is not
	// taken over; unsubscribing another's does nothing.
	for i := range MaxPushSubscriptions {
		if err := w.Subscribe(ctx, "c", r.Endpoint+"/"+string(rune('a'+i)), r.P256dh, r.Auth); err != nil {
			t.Fatalf("subscription %d: %v", i, err)
		}
	}
	if err := w.Subscribe(ctx, "c", r.Endpoint+"/a", r.P256dh, r.Auth); err != nil {
		t.Errorf("subscribing again at the cap: got %v, want nil", err)
	}
	if err := w.Subscribe(ctx, "c", r.Endpoint+"/z", r.P256dh, r.Auth); !errors.Is(err, ErrTooManySubscriptions) {
		t.Errorf("one past the cap: got %v, want %v", err, ErrTooManySubscriptions)
	}
	if err := w.Subscribe(ctx, "d", r.Endpoint+"/a", r.P256dh, r.Auth); !errors.Is(err, ErrBadSubscription) {
		t.Errorf("another credential's endpoint: got %v, want %v", err, ErrBadSubscription)
	}
	if del, err := w.Unsubscribe(ctx, "d", r.Endpoint+"/a", false); err != nil || del {
		t.Errorf("Unsubscribe of another's: got %v, %v; want false, nil", del, err)
	}
	if del, err := w.Unsubscribe(ctx, "c", r.Endpoint+"/a", false); err != nil || !del {
		t.Errorf("Unsubscribe of its own: got %v, %v; want true, nil", del, err)
	}
}

func TestPushable(t *testing.T) {
	const a, b = "20260102_030405_000001", "20260102_030405_000002"
	ev := Event{Type: TypeRunCompleted, Session: a, Unattended: true}
	pty := Event{Type: TypePTYExited, PTY: "tok", Unattended: true}
	cases := []struct {
		name   string
		scopes []string
		ev     Event
		want   bool
	}{
		{"admin", []string{"admin"}, ev, true},
		{"its session", []string{"session:" + a}, ev, true},
		{"its session's view", []string{"session:" + a + ":view"}, ev, true},
		{"another session", []string{"session:" + b, "pty:tok"}, ev, false},
		{"new only", []string{"new"}, ev, false},
		{"revoked", nil, ev, false},
		{"revoked admin", nil, Event{Type: TypeTest}, false},
		{"attended", []string{"admin"}, Event{Type: TypeRunCompleted, Session: a}, false},
		{"its terminal", []string{"pty:tok:view"}, pty, true},
		{"another terminal", []string{"pty:other", "session:" + a}, pty, false},
		{"test to admin", []string{"admin"}, Event{Type: TypeTest}, true},
		{"test to others", []string{"session:" + a}, Event{Type: TypeTest}, false},
		{"no subject", []string{"session:" + a}, Event{Type: TypeRunCompleted, Unattended: true}, false},
	}
	for _, c := range cases {
		if got := pushable(func(_, kind, id string) bool { return reach(c.scopes, kind, id) }, "c", c.ev); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestPushPayloadIsSmall(t *testing.T) {
	ev := permEvent
	ev.Title, ev.Tool, ev.Reason = strings.Repeat("é", 3000), strings.Repeat("x", 5000), strings.Repeat("y", 5000)
	b, err := pushPayload(ev)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 1500 {
		t.Errorf("payload of long texts: %d bytes, want at most 1500", len(b))
	}
	var got Event
	if err := json.Unmarshal(b, &got); err != nil || got.ID != ev.ID || got.Link != ev.Link {
		t.Errorf("payload: got %+v, %v; want the event's id and link", got, err)
	}
}

func TestLoadVAPIDKeys(t *testing.T) {
	dir := t.TempDir()
	k, err := LoadVAPIDKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, VAPIDFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: got %v, %v; want mode 0600", VAPIDFile, fi.Mode(), err)
	}
	again, err := LoadVAPIDKeys(dir)
	if err != nil || again != k {
		t.Errorf("LoadVAPIDKeys again: got %v, %v; want the same keys", again.Public, err)
	}
	if pub, err := base64.RawURLEncoding.DecodeString(k.Public); err != nil || len(pub) != 65 {
		t.Errorf("public key %s: want 65 bytes, an uncompressed P-256 point", k.Public)
	}
	// A link planted in its place is refused, never followed.
	other := t.TempDir()
	if err := os.Symlink(filepath.Join(dir, VAPIDFile), filepath.Join(other, VAPIDFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadVAPIDKeys(other); err == nil {
		t.Error("LoadVAPIDKeys through a symbolic link: got nil, want an error")
	}
	// A file of keys that do not match is refused.
	bad := t.TempDir()
	k2, _ := LoadVAPIDKeys(t.TempDir())
	b, _ := json.Marshal(VAPIDKeys{Public: k2.Public, Private: k.Private})
	if err := os.WriteFile(filepath.Join(bad, VAPIDFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadVAPIDKeys(bad); err == nil {
		t.Error("LoadVAPIDKeys of mismatched keys: got nil, want an error")
	}
}

// TestWebPushConformance runs the notifiers' conformance kit against
// Web Push, with one admin subscription at the kit's receiver (which
// reads the id from X-Tether-Event-Id, as a push body is encrypted).
func TestWebPushConformance(t *testing.T) {
	notifytest.Run(t, func(t *testing.T, r *notifytest.Receiver) contract.Notifier {
		w := newPush(t, &memPush{}, map[string][]string{"c": {"admin"}})
		key, err := ecdh.P256().GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		auth := make([]byte, 16)
		_, _ = rand.Read(auth)
		if err := w.Subscribe(context.Background(), "c", r.URL, base64.RawURLEncoding.EncodeToString(key.PublicKey().Bytes()), base64.RawURLEncoding.EncodeToString(auth)); err != nil {
			t.Fatal(err)
		}
		return w
	})
}
