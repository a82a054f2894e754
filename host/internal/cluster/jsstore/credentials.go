package jsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/cluster/bus"
	"github.com/tether-agent/tether/host/store"
)

// CredentialsBucket is the KV bucket of the cluster's credentials: one
// entry per credential, keyed by its secret's SHA-256 (hex), its value
// the store.Credential as JSON (never the secret). Every host accepts
// every credential in it, so a client signed in on one host is accepted
// by all of them.
const CredentialsBucket = "tether_credentials"

// ClientCredentials keeps the credentials clients present
// (store.CredentialStore) in the credentials bucket, and follows the
// changes other hosts make (Watch). (Credentials are the host's own, to
// the NATS servers.)
type ClientCredentials struct {
	kv  jetstream.KeyValue
	log zerolog.Logger

	mu   sync.Mutex // guards the fields below
	stop context.CancelFunc
	done chan struct{}
}

var _ store.CredentialStore = (*ClientCredentials)(nil)

// OpenClientCredentials opens the credentials bucket, creating it if needed.
func OpenClientCredentials(ctx context.Context, js jetstream.JetStream, replicas int, log zerolog.Logger) (*ClientCredentials, error) {
	return openCredentials(ctx, js, CredentialsBucket, replicas, log)
}

func openCredentials(ctx context.Context, js jetstream.JetStream, bucket string, replicas int, log zerolog.Logger) (*ClientCredentials, error) {
	kv, err := bus.OpenLeaderKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "tether credentials: SHA-256 of each secret, its name and scopes",
		History:     1,
		Replicas:    max(replicas, 1),
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, err
	}
	return &ClientCredentials{kv: kv, log: log}, nil
}

// Credentials implements store.CredentialStore.
func (c *ClientCredentials) Credentials(ctx context.Context) ([]store.Credential, error) {
	w, err := c.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	defer func() { _ = w.Stop() }()
	var out []store.Credential
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("credentials: %w", ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("credentials: watch ended")
			}
			if e == nil {
				return out, nil
			}
			var cr store.Credential
			if err := json.Unmarshal(e.Value(), &cr); err != nil {
				c.log.Warn().Err(err).Str("key", e.Key()).Msg("a credential entry that is not one; ignored")
				continue
			}
			out = append(out, cr)
		}
	}
}

// PutCredential implements store.CredentialStore. The entry of another
// credential with the same ID (an access token that changed) is removed.
func (c *ClientCredentials) PutCredential(ctx context.Context, cr store.Credential) error {
	if cr.Hash == "" || cr.ID == "" {
		return fmt.Errorf("put credential: hash and id are needed: %w", store.ErrInvalid)
	}
	b, err := json.Marshal(cr)
	if err != nil {
		return fmt.Errorf("put credential %s: %w", cr.ID, err)
	}
	all, err := c.Credentials(ctx)
	if err != nil {
		return err
	}
	if _, err := c.kv.Put(ctx, cr.Hash, b); err != nil {
		return fmt.Errorf("put credential %s: %v: %w", cr.ID, err, store.ErrUnavailable)
	}
	for _, o := range all {
		if o.ID == cr.ID && o.Hash != cr.Hash {
			if err := c.DeleteCredential(ctx, o.Hash); err != nil {
				return err
			}
		}
	}
	return nil
}

// DeleteCredential implements store.CredentialStore.
func (c *ClientCredentials) DeleteCredential(ctx context.Context, hash string) error {
	if err := c.kv.Delete(ctx, hash); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("delete credential: %v: %w", err, store.ErrUnavailable)
	}
	return nil
}

// Watch calls apply with every credential in the bucket, returns once it
// has (or ctx ends first), and from then on calls apply with every
// change any host makes — a put, or a delete (with only Hash set) —
// until Close. apply must not block.
func (c *ClientCredentials) Watch(ctx context.Context, apply func(cr store.Credential, deleted bool)) error {
	wctx, cancel := context.WithCancel(context.Background())
	w, err := c.kv.WatchAll(wctx)
	if err != nil {
		cancel()
		return fmt.Errorf("credentials: watch: %w", err)
	}
	ready := make(chan struct{})
	done := make(chan struct{})
	c.mu.Lock()
	if c.stop != nil {
		c.mu.Unlock()
		cancel()
		_ = w.Stop()
		return errors.New("credentials: already watched")
	}
	c.stop, c.done = cancel, done
	c.mu.Unlock()
	go func() {
		defer close(done)
		defer func() { _ = w.Stop() }()
		initial := true
		for {
			select {
			case <-wctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					if initial {
						initial = false
						close(ready)
					}
					continue
				}
				if e.Operation() != jetstream.KeyValuePut {
					apply(store.Credential{Hash: e.Key()}, true)
					continue
				}
				var cr store.Credential
				if err := json.Unmarshal(e.Value(), &cr); err != nil {
					c.log.Warn().Err(err).Str("key", e.Key()).Msg("a credential entry that is not one; ignored")
					continue
				}
				apply(cr, false)
			}
		}
	}()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("credentials: watch: %w", ctx.Err())
	}
}

// Close stops the watch and waits for it.
func (c *ClientCredentials) Close() {
	c.mu.Lock()
	stop, done := c.stop, c.done
	c.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}
