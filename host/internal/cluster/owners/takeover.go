package owners

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/ownership"
)

// Takeover is the ownership store one host of a cluster gives its
// session table: KV, with the takeover of keys whose owner left.
//
// A Create that finds the key owned asks the registry whether the owner's
// process is still in the cluster. If it is, the key stays its owner's:
// the error is an *ownership.HeldError naming the owner, so the caller
// can reach the session there. If it left (its heartbeat is older than
// the TTL, it stopped, or its host runs a new process since), the entry
// is taken over with an Update at the revision that was read — a
// compare-and-swap, so of several hosts taking over one key exactly one
// wins and the others find the winner alive. An entry of this very
// process is taken over too: the table calls Create only for a key it
// has no live session of.
type Takeover struct {
	kv  *KV
	reg *Registry
	log zerolog.Logger

	// Takeovers counts keys taken from an owner that left.
	Takeovers atomic.Uint64
}

var _ ownership.Store = (*Takeover)(nil)

// NewTakeover returns the ownership store of the host reg belongs to.
func NewTakeover(kv *KV, reg *Registry, log zerolog.Logger) *Takeover {
	return &Takeover{kv: kv, reg: reg, log: log}
}

// maxTakeoverTries bounds how often Create reads and tries again when
// the entry changes under it.
const maxTakeoverTries = 4

// Create implements ownership.Store, taking over a key whose owner left.
func (h *Takeover) Create(ctx context.Context, key string, o ownership.Owner) (uint64, error) {
	self, inst := h.reg.Self()
	var err error
	for range maxTakeoverTries {
		var rev uint64
		rev, err = h.kv.Create(ctx, key, o)
		if !errors.Is(err, ownership.ErrConflict) {
			return rev, err
		}
		cur, crev, gerr := h.kv.Get(ctx, key)
		if errors.Is(gerr, ownership.ErrNoOwner) {
			continue // deleted meanwhile: create again
		}
		if gerr != nil {
			return 0, gerr
		}
		mine := cur.Host == self && cur.Instance == inst
		if !mine {
			alive, aerr := h.reg.Alive(ctx, cur.Host, cur.Instance)
			if aerr != nil {
				return 0, fmt.Errorf("create %s: owner %s: %v: %w", key, cur.Host, aerr, ownership.ErrUnavailable)
			}
			if alive {
				return 0, fmt.Errorf("create %s: %w", key, &ownership.HeldError{Host: cur.Host, Instance: cur.Instance, SessionID: cur.SessionID})
			}
		}
		rev, err = h.kv.Update(ctx, key, o, crev)
		if err == nil {
			h.Takeovers.Add(1)
			h.log.Info().Str("session_key", key).Str("from_host", cur.Host).Str("from_session", cur.SessionID).Msg("took over a session whose owner left the cluster")
			return rev, nil
		}
		if !errors.Is(err, ownership.ErrConflict) {
			return 0, err
		}
	}
	return 0, err
}

// Get implements ownership.Store.
func (h *Takeover) Get(ctx context.Context, key string) (ownership.Owner, uint64, error) {
	return h.kv.Get(ctx, key)
}

// Update implements ownership.Store.
func (h *Takeover) Update(ctx context.Context, key string, o ownership.Owner, rev uint64) (uint64, error) {
	return h.kv.Update(ctx, key, o, rev)
}

// Delete implements ownership.Store.
func (h *Takeover) Delete(ctx context.Context, key string, rev uint64) error {
	return h.kv.Delete(ctx, key, rev)
}
