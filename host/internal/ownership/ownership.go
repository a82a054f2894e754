// Package ownership is the seam between the session table and the store
// that records which live session owns each stored key: the Owner record,
// the Store interface of revision-checked compare-and-swap operations, its
// error classes, and Mem, the in-memory store of a single host.
//
// It imports nothing of ours but contract, so that a store shared by
// several hosts (host/internal/cluster, on JetStream KV) implements it
// without reaching the session table, and the table's own tests can run
// against such a store.
package ownership

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/tether-agent/tether/contract"
)

// Ownership store errors. A store answers them as normal outcomes; the
// table turns them into refused binds, never into a panic.
var (
	// ErrConflict: the entry is not at the revision the caller read (it
	// changed since, or it exists where the caller meant to create it).
	ErrConflict = errors.New("ownership revision conflict")
	// ErrNoOwner: no owner is recorded for the key.
	ErrNoOwner = errors.New("no owner for session key")
	// ErrUnavailable: the store could not be reached; the entry may or
	// may not have changed.
	ErrUnavailable = errors.New("ownership store unreachable")
)

// HeldError is a conflict with a live owner on another host: the key is
// held by session SessionID of host Host (process Instance). It unwraps
// to ErrConflict.
type HeldError struct {
	Host, Instance, SessionID string
}

// Error implements error.
func (e *HeldError) Error() string {
	return fmt.Sprintf("held by session %s on host %s", e.SessionID, e.Host)
}

// Unwrap makes errors.Is(err, ErrConflict) hold.
func (e *HeldError) Unwrap() error { return ErrConflict }

// Owner is what the ownership store records for a stored key that is
// live: the host and runtime session that own it, the binding generation
// and the viewers bound to it, by transport identity.
type Owner struct {
	Host string `json:"host,omitempty"`
	// Instance names the host's process (a new one each start), so that
	// the entries a killed host left behind are known as its old
	// process's when it starts again.
	Instance  string                 `json:"instance,omitempty"`
	SessionID string                 `json:"session_id"`
	Gen       uint64                 `json:"gen"`
	Viewers   []contract.TransportID `json:"viewers,omitempty"`
}

// Store records which live session owns which stored key, changed only
// by revision-checked compare-and-swap. The table calls it with no lock
// held, one call at a time per session, and treats every error as a
// normal outcome. Revisions are opaque: a store's revisions grow with
// every write it makes (to any key), so a caller never computes one, it
// only presents the last one the store gave it. Revision 0 is never an
// entry's: Update and Delete at revision 0 are conflicts.
type Store interface {
	// Create records o for key if the key has no owner and returns the
	// entry's revision; ErrConflict if it has one.
	Create(ctx context.Context, key string, o Owner) (rev uint64, err error)
	// Get returns the owner of key and its revision, or ErrNoOwner.
	Get(ctx context.Context, key string) (Owner, uint64, error)
	// Update replaces the owner of key if the entry is still at rev and
	// returns the new revision; ErrConflict otherwise.
	Update(ctx context.Context, key string, o Owner, rev uint64) (uint64, error)
	// Delete removes the owner of key if the entry is still at rev;
	// ErrConflict otherwise.
	Delete(ctx context.Context, key string, rev uint64) error
}

// Mem is the in-memory Store of a single host.
type Mem struct {
	mu      sync.Mutex // guards the fields below
	next    uint64
	entries map[string]memEntry
}

type memEntry struct {
	o   Owner
	rev uint64
}

var _ Store = (*Mem)(nil)

// NewMem returns an empty in-memory ownership store.
func NewMem() *Mem { return &Mem{entries: make(map[string]memEntry)} }

// Create implements Store.
func (m *Mem) Create(_ context.Context, key string, o Owner) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.entries[key]; ok {
		return 0, fmt.Errorf("create %s: owned by session %s: %w", key, e.o.SessionID, ErrConflict)
	}
	m.next++
	m.entries[key] = memEntry{o: Clone(o), rev: m.next}
	return m.next, nil
}

// Get implements Store.
func (m *Mem) Get(_ context.Context, key string) (Owner, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok {
		return Owner{}, 0, fmt.Errorf("get %s: %w", key, ErrNoOwner)
	}
	return Clone(e.o), e.rev, nil
}

// Update implements Store.
func (m *Mem) Update(_ context.Context, key string, o Owner, rev uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok || e.rev != rev {
		return 0, fmt.Errorf("update %s at revision %d: %w", key, rev, ErrConflict)
	}
	m.next++
	m.entries[key] = memEntry{o: Clone(o), rev: m.next}
	return m.next, nil
}

// Delete implements Store.
func (m *Mem) Delete(_ context.Context, key string, rev uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok || e.rev != rev {
		return fmt.Errorf("delete %s at revision %d: %w", key, rev, ErrConflict)
	}
	delete(m.entries, key)
	return nil
}

// Len is the number of keys with an owner.
func (m *Mem) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries)
}

// Clone returns a copy of o that shares nothing with it.
func Clone(o Owner) Owner {
	o.Viewers = slices.Clone(o.Viewers)
	return o
}
