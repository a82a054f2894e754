// Package bus holds what the cluster's JetStream users share: opening a
// KV bucket whose reads come from its stream leader, asking a write
// again while the server has not decided it, telling a revision conflict
// from the rest, and the one rule for a subject token or KV key.
package bus

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// maxDirectFixes bounds how often OpenLeaderKV switches the bucket's
// direct gets off and finds them on again (another client configuring
// the bucket with the library's defaults meanwhile).
const maxDirectFixes = 5

// OpenLeaderKV opens the bucket cfg names, creating it with cfg if it
// does not exist, and switches off its direct gets, so that every Get on
// the handle it returns is answered by the stream leader. It refuses a
// bucket that is a mirror.
func OpenLeaderKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			// Another host created it meanwhile.
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", cfg.Bucket, err)
	}
	// The library creates every bucket with direct gets on, and answers
	// Get with one whenever the stream's configuration (as this handle
	// last read it) allows them: turn them off on the stream, then read
	// the configuration back into this handle. Status does both the read
	// and the refresh. The library's calls that configure a bucket
	// (CreateOrUpdateKeyValue, UpdateKeyValue) always ask for direct gets:
	// another client making one meanwhile turns them on again, hence the
	// loop. A handle that read them off keeps them off.
	for fixes := 0; ; fixes++ {
		st, err := kv.Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("bucket %s status: %w", cfg.Bucket, err)
		}
		bs, ok := st.(*jetstream.KeyValueBucketStatus)
		if !ok {
			return nil, fmt.Errorf("bucket %s: status of type %T carries no stream configuration", cfg.Bucket, st)
		}
		scfg := bs.StreamInfo().Config
		if scfg.Mirror != nil {
			return nil, fmt.Errorf("bucket %s mirrors %s: its reads would not come from the stream leader", cfg.Bucket, scfg.Mirror.Name)
		}
		if !scfg.AllowDirect {
			break
		}
		if fixes == maxDirectFixes {
			return nil, fmt.Errorf("bucket %s: direct gets keep being switched back on", cfg.Bucket)
		}
		scfg.AllowDirect = false
		if _, err := js.UpdateStream(ctx, scfg); err != nil {
			return nil, fmt.Errorf("bucket %s: switch direct gets off: %w", cfg.Bucket, err)
		}
	}
	return kv, nil
}

// StopWatch stops w and drains its channel until the library closes it:
// the watch's delivery goroutine blocks on a full channel, and closes it
// only once it has returned.
func StopWatch(w jetstream.KeyWatcher) {
	_ = w.Stop()
	for range w.Updates() {
	}
}

// busyBudget bounds how long a write refused as Busy is asked again
// when its context has no deadline.
const busyBudget = 5 * time.Second

// Busy reports whether the server refused a write without deciding it,
// so that nothing was written and asking again gets an answer: on a
// replicated stream, another write of the key is still being applied
// (code 10164 — also for a moment after the previous write was
// acknowledged, as the leader acknowledges before it forgets the write
// in process), or a new stream leader is still applying its log (10163).
func Busy(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant || apiErr.ErrorCode == CodeExpectedLastSeqNotReady)
}

// CodeExpectedLastSeqNotReady is the server's "expected last sequence per
// subject temporarily unavailable" (the library has no name for it).
const CodeExpectedLastSeqNotReady jetstream.ErrorCode = 10163

// WrongLastSequence reports whether err is the server refusing a write
// whose expected last sequence for the key was not the key's: a create of
// a key that has a value, or an update or delete at a stale revision.
// The library wraps it as ErrKeyExists or ErrKeyRevisionMismatch, except
// for the update of a create over a delete marker, which it returns as
// the server's API error (code 10071). Code 10164, which the library
// counts as a mismatch too, is Busy, tested first.
func WrongLastSequence(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// ValidToken reports whether k can be one token of a subject and a KV
// key: non-empty, of letters, digits, '_' and '-'. Every stored key
// (store.ValidKey) is.
func ValidToken(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// RetryBusy runs write until the server decides it: while it answers
// Busy, write is asked again after a short wait (1 ms, doubling up to
// 50 ms), until ctx ends. It returns write's last error, joined with
// ctx's when that ended the retries. It counts the writes asked again in
// retries.
func RetryBusy(ctx context.Context, retries *atomic.Uint64, write func() error) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, busyBudget)
		defer cancel()
	}
	wait := time.Millisecond
	for {
		err := write()
		if !Busy(err) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (asked again until: %w)", err, ctx.Err())
		case <-t.C:
		}
		retries.Add(1)
		wait = min(2*wait, 50*time.Millisecond)
	}
}
