package store

import (
	"context"
	"fmt"
	"time"
)

// PushSubscription is one browser's Web Push subscription (the
// PushSubscription of the Push API), made by a credential.
type PushSubscription struct {
	// Endpoint is the push service's URL for this browser; the key.
	Endpoint string
	// P256dh and Auth are the subscription's keys, base64url as the
	// browser gave them.
	P256dh, Auth string
	// Credential is the ID of the credential that subscribed.
	Credential string
	// Created is when it was stored.
	Created time.Time
}

// PushStore keeps the Web Push subscriptions. *Store keeps them in
// state.db.
type PushStore interface {
	// PutPushSubscription stores s, replacing one of the same endpoint.
	PutPushSubscription(ctx context.Context, s PushSubscription) error
	// DeletePushSubscription removes the subscription of endpoint; one
	// that is not there is no error.
	DeletePushSubscription(ctx context.Context, endpoint string) error
	// PushSubscriptions lists the subscriptions, oldest first.
	PushSubscriptions(ctx context.Context) ([]PushSubscription, error)
}

var _ PushStore = (*Store)(nil)

// PutPushSubscription implements PushStore.
func (s *Store) PutPushSubscription(ctx context.Context, p PushSubscription) error {
	if p.Endpoint == "" || p.Credential == "" {
		return fmt.Errorf("put push subscription: endpoint and credential are needed: %w", ErrInvalid)
	}
	return s.write(func() error {
		if _, err := s.db.ExecContext(ctx,
			`INSERT OR REPLACE INTO push_subscriptions (endpoint, p256dh, auth, credential, created_at) VALUES (?, ?, ?, ?, ?)`,
			p.Endpoint, p.P256dh, p.Auth, p.Credential, p.Created.UnixMilli()); err != nil {
			return fmt.Errorf("put push subscription: %w", err)
		}
		return nil
	})
}

// DeletePushSubscription implements PushStore.
func (s *Store) DeletePushSubscription(ctx context.Context, endpoint string) error {
	return s.write(func() error {
		if _, err := s.db.ExecContext(ctx, `DELETE FROM push_subscriptions WHERE endpoint = ?`, endpoint); err != nil {
			return fmt.Errorf("delete push subscription: %w", err)
		}
		return nil
	})
}

// PushSubscriptions implements PushStore.
func (s *Store) PushSubscriptions(ctx context.Context) ([]PushSubscription, error) {
	rows, err := s.reader().QueryContext(ctx, `SELECT endpoint, p256dh, auth, credential, created_at FROM push_subscriptions ORDER BY created_at, endpoint`)
	if err != nil {
		return nil, fmt.Errorf("push subscriptions: %w", err)
	}
	defer rows.Close()
	var out []PushSubscription
	for rows.Next() {
		var p PushSubscription
		var created int64
		if err := rows.Scan(&p.Endpoint, &p.P256dh, &p.Auth, &p.Credential, &created); err != nil {
			return nil, fmt.Errorf("push subscriptions: %w", err)
		}
		p.Created = time.UnixMilli(created)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("push subscriptions: %w", err)
	}
	return out, nil
}
