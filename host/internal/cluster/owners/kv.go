package owners

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tether-agent/tether/host/internal/cluster/bus"
	"github.com/tether-agent/tether/host/internal/ownership"
)

// Bucket is the KV bucket of the session ownership table.
const Bucket = "tether_sessions"

// KVConfig configures the bucket NewKV creates when it does not
// exist yet. An existing bucket is used as it is, except that direct gets
// are switched off.
type KVConfig struct {
	// Bucket is the bucket's name (default Bucket).
	Bucket string
	// Replicas is how many servers keep the bucket (default 1): 3 on a
	// three-server cluster, so that it survives losing one.
	Replicas int
	// Storage is where the servers keep it: jetstream.FileStorage (the
	// zero value, and the product's choice), or jetstream.MemoryStorage.
	Storage jetstream.StorageType
}

// KV is an ownership.Store on a JetStream KV bucket shared by every
// host of a cluster. Its methods are safe for concurrent use. It does
// not own the connection: close that after the last call.
type KV struct {
	kv     jetstream.KeyValue
	bucket string

	// busyRetries counts the writes asked again because the server had
	// not decided them (see busy).
	busyRetries atomic.Uint64
}

var _ ownership.Store = (*KV)(nil)

// NewKV opens the ownership bucket, creating it if needed (history
// 1, cfg's replicas and storage), and switches off its direct gets, so
// that every Get this KV makes is answered by the stream leader.
func NewKV(ctx context.Context, js jetstream.JetStream, cfg KVConfig) (*KV, error) {
	if cfg.Bucket == "" {
		cfg.Bucket = Bucket
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	kv, err := bus.OpenLeaderKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "tether session ownership: one entry per live stored session",
		History:     1,
		Replicas:    cfg.Replicas,
		Storage:     cfg.Storage,
	})
	if err != nil {
		return nil, err
	}
	return &KV{kv: kv, bucket: cfg.Bucket}, nil
}

// Create implements ownership.Store: a KV create, which also takes a key
// whose last entry is a delete marker (by an update at the marker's
// revision, so two creators of a deleted key cannot both win).
func (k *KV) Create(ctx context.Context, key string, o ownership.Owner) (uint64, error) {
	val, err := json.Marshal(o)
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", key, err)
	}
	var rev uint64
	err = k.retryBusy(ctx, func() (err error) {
		rev, err = k.kv.Create(ctx, key, val)
		return err
	})
	if err != nil {
		return 0, classify(fmt.Sprintf("create %s", key), err)
	}
	return rev, nil
}

// Get implements ownership.Store, reading the stream leader's last
// message for the key (never a replica's or a mirror's direct get). A key
// whose last message is a delete marker has no owner.
func (k *KV) Get(ctx context.Context, key string) (ownership.Owner, uint64, error) {
	e, err := k.kv.Get(ctx, key)
	if err != nil {
		return ownership.Owner{}, 0, classify(fmt.Sprintf("get %s", key), err)
	}
	var o ownership.Owner
	if err := json.Unmarshal(e.Value(), &o); err != nil {
		return ownership.Owner{}, 0, fmt.Errorf("get %s: revision %d is not an owner record: %v: %w", key, e.Revision(), err, ownership.ErrUnavailable)
	}
	return o, e.Revision(), nil
}

// Update implements ownership.Store: a publish that the server accepts
// only if the key's last message is at rev.
func (k *KV) Update(ctx context.Context, key string, o ownership.Owner, rev uint64) (uint64, error) {
	op := fmt.Sprintf("update %s at revision %d", key, rev)
	if rev == 0 {
		// To the server, "last message at 0" means "no message yet":
		// an update would create the key.
		return 0, fmt.Errorf("%s: no entry has revision 0: %w", op, ownership.ErrConflict)
	}
	val, err := json.Marshal(o)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	var next uint64
	err = k.retryBusy(ctx, func() (err error) {
		next, err = k.kv.Update(ctx, key, val, rev)
		return err
	})
	if err != nil {
		return 0, classify(op, err)
	}
	return next, nil
}

// Delete implements ownership.Store: a delete marker that the server
// accepts only if the key's last message is at rev. The marker stays (the
// bucket keeps one message per key); Create takes the key over it.
func (k *KV) Delete(ctx context.Context, key string, rev uint64) error {
	op := fmt.Sprintf("delete %s at revision %d", key, rev)
	if rev == 0 {
		// LastRevision(0) is no check at all: an unconditional delete.
		return fmt.Errorf("%s: no entry has revision 0: %w", op, ownership.ErrConflict)
	}
	err := k.retryBusy(ctx, func() error { return k.kv.Delete(ctx, key, jetstream.LastRevision(rev)) })
	if err != nil {
		return classify(op, err)
	}
	return nil
}

// Entry is one key of the ownership table and its owner.
type Entry struct {
	Key   string
	Owner ownership.Owner
	Rev   uint64
}

// List returns every key that has an owner, by a watch of the whole
// bucket that stops at the end of its initial values. The list is a
// snapshot: entries may change while it is read, so nothing decided on
// it is a compare-and-swap (Get and the write are).
func (k *KV) List(ctx context.Context) ([]Entry, error) {
	w, err := k.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, classify("list", err)
	}
	defer bus.StopWatch(w)
	var out []Entry
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("list: the watch ended: %w", ownership.ErrUnavailable)
			}
			if e == nil {
				// The marker: every key's last value has been sent.
				return out, nil
			}
			var o ownership.Owner
			if err := json.Unmarshal(e.Value(), &o); err != nil {
				return nil, fmt.Errorf("list: %s at revision %d is not an owner record: %v: %w", e.Key(), e.Revision(), err, ownership.ErrUnavailable)
			}
			out = append(out, Entry{Key: e.Key(), Owner: o, Rev: e.Revision()})
		case <-ctx.Done():
			return nil, fmt.Errorf("list: %w: %w", ownership.ErrUnavailable, ctx.Err())
		}
	}
}

// retryBusy is bus.RetryBusy, counting the writes asked again in
// busyRetries.
func (k *KV) retryBusy(ctx context.Context, write func() error) error {
	return bus.RetryBusy(ctx, &k.busyRetries, write)
}

// classify wraps a nats error in the ownership error class it answers:
// the server's refusal of the revision is a conflict, a key with no value
// (never written, or its last message a delete marker) has no owner, and
// anything else (a timeout, no responders, a closed connection, JetStream
// unavailable, an answer not understood, a write still busy when its
// context ended) leaves the entry unknown. The nats error stays wrapped
// too.
func classify(op string, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrInvalidKey):
		// Refused before anything was sent: a caller's mistake.
		return fmt.Errorf("%s: %w", op, err)
	case bus.Busy(err):
		// Not a conflict: the server did not compare the revision.
		return fmt.Errorf("%s: %w: %w", op, ownership.ErrUnavailable, err)
	case bus.WrongLastSequence(err):
		return fmt.Errorf("%s: %w: %w", op, ownership.ErrConflict, err)
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return fmt.Errorf("%s: %w: %w", op, ownership.ErrNoOwner, err)
	}
	return fmt.Errorf("%s: %w: %w", op, ownership.ErrUnavailable, err)
}
