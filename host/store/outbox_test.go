package store

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestOutbox(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	at := time.UnixMilli(1_700_000_000_123)
	ns := []Notification{
		{ID: "b", Notifier: "w1", Body: []byte(`{"id":"b"}`), Created: at.Add(time.Second)},
		{ID: "a", Notifier: "w2", Body: []byte(`{"id":"a"}`), Created: at},
		{ID: "a", Notifier: "w1", Body: []byte(`{"id":"a"}`), Created: at},
	}
	if err := s.PutNotifications(ctx, ns); err != nil {
		t.Fatalf("PutNotifications: %v", err)
	}
	if err := s.PutNotifications(ctx, []Notification{{ID: "", Notifier: "w"}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("PutNotifications with no id: got %v, want %v", err, ErrInvalid)
	}
	if err := s.DeleteNotification(ctx, "a", "w2"); err != nil {
		t.Fatalf("DeleteNotification: %v", err)
	}
	if err := s.DeleteNotification(ctx, "gone", "w2"); err != nil {
		t.Errorf("DeleteNotification of none: got %v, want nil", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// They survive a reopen, oldest first, bodies and times whole.
	s = openTest2(t, path)
	got, err := s.Notifications(ctx)
	if err != nil {
		t.Fatalf("Notifications: %v", err)
	}
	want := []Notification{ns[2], ns[0]}
	if !slices.EqualFunc(got, want, func(a, b Notification) bool {
		return a.ID == b.ID && a.Notifier == b.Notifier && string(a.Body) == string(b.Body) && a.Created.Equal(b.Created)
	}) {
		t.Errorf("Notifications after a reopen: got %+v, want %+v", got, want)
	}
	// A write fault fails the put, as every write.
	s.SetWriteFault(func() error { return errors.New("disk full") })
	if err := s.PutNotifications(ctx, ns[:1]); !errors.Is(err, ErrUnavailable) {
		t.Errorf("PutNotifications under a write fault: got %v, want %v", err, ErrUnavailable)
	}
}
