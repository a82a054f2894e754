package store

import (
	"context"
	"fmt"
	"time"
)

// Notification is one notification waiting in the outbox for one
// notifier: the body exactly as it is sent (so that every attempt sends
// the same bytes, with the same signature).
type Notification struct {
	// ID is the notification's id, the same for every notifier and every
	// attempt; (ID, Notifier) is the key.
	ID string
	// Notifier names the notifier it waits for.
	Notifier string
	// Body is what is sent.
	Body []byte
	// Created is when it was made (retries end 24 h after it).
	Created time.Time
}

// Outbox keeps the notifications not yet delivered. *Store keeps them in
// state.db.
type Outbox interface {
	// PutNotifications stores ns (replacing any with the same key), all
	// or none.
	PutNotifications(ctx context.Context, ns []Notification) error
	// DeleteNotification removes the notification id of notifier; one
	// that is not there is no error.
	DeleteNotification(ctx context.Context, id, notifier string) error
	// Notifications lists the stored notifications, oldest first.
	Notifications(ctx context.Context) ([]Notification, error)
}

var _ Outbox = (*Store)(nil)

// PutNotifications implements Outbox.
func (s *Store) PutNotifications(ctx context.Context, ns []Notification) error {
	for _, n := range ns {
		if n.ID == "" || n.Notifier == "" {
			return fmt.Errorf("put notification: id and notifier are needed: %w", ErrInvalid)
		}
	}
	return s.write(func() error {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("put notifications: %w", err)
		}
		defer func() { _ = tx.Rollback() }()
		for _, n := range ns {
			if _, err := tx.ExecContext(ctx,
				`INSERT OR REPLACE INTO outbox (id, notifier, body, created_at) VALUES (?, ?, ?, ?)`,
				n.ID, n.Notifier, string(n.Body), n.Created.UnixMilli()); err != nil {
				return fmt.Errorf("put notification %s: %w", n.ID, err)
			}
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("put notifications: %w", err)
		}
		return nil
	})
}

// DeleteNotification implements Outbox.
func (s *Store) DeleteNotification(ctx context.Context, id, notifier string) error {
	return s.write(func() error {
		if _, err := s.db.ExecContext(ctx, `DELETE FROM outbox WHERE id = ? AND notifier = ?`, id, notifier); err != nil {
			return fmt.Errorf("delete notification %s: %w", id, err)
		}
		return nil
	})
}

// Notifications implements Outbox.
func (s *Store) Notifications(ctx context.Context) ([]Notification, error) {
	rows, err := s.reader().QueryContext(ctx, `SELECT id, notifier, body, created_at FROM outbox ORDER BY created_at, id, notifier`)
	if err != nil {
		return nil, fmt.Errorf("notifications: %w", err)
	}
	defer rows.Close()
	var out []Notification
	for rows.Next() {
		var n Notification
		var body string
		var created int64
		if err := rows.Scan(&n.ID, &n.Notifier, &body, &created); err != nil {
			return nil, fmt.Errorf("notifications: %w", err)
		}
		n.Body, n.Created = []byte(body), time.UnixMilli(created)
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("notifications: %w", err)
	}
	return out, nil
}
