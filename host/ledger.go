package host

import (
	"errors"
	"fmt"
	"sync"
)

// Ledger errors.
var (
	// ErrKeyTaken: Create found the key already owned.
	ErrKeyTaken = errors.New("session key already owned")
	// ErrRevision: the entry changed since the caller read it.
	ErrRevision = errors.New("ownership revision mismatch")
	// ErrNoOwner: no live owner is recorded for the key.
	ErrNoOwner = errors.New("no owner for session key")
)

// Ownership is what the ledger records for a stored key that is live: the
// runtime session that owns it and its binding generation.
type Ownership struct {
	SessionID string
	Gen       uint64
}

// Ledger is the table's ownership state: which runtime session owns which
// stored key, updated only by revision-checked compare-and-swap. The
// default MemLedger keeps it in this process; a multi-host deployment can
// back it with a key-value store whose revision-checked update is the same
// operation (NATS JetStream KV Create/Update/Delete with last revision).
type Ledger interface {
	// Create records o for key if the key has no owner, returning the new
	// revision, or ErrKeyTaken.
	Create(key string, o Ownership) (rev uint64, err error)
	// Get returns the owner of key and its revision, or ErrNoOwner.
	Get(key string) (Ownership, uint64, error)
	// Update replaces the owner of key if its revision is still rev, or
	// returns ErrRevision.
	Update(key string, o Ownership, rev uint64) (uint64, error)
	// Delete removes the owner of key if its revision is still rev, or
	// returns ErrRevision.
	Delete(key string, rev uint64) error
}

// MemLedger is the in-memory Ledger.
type MemLedger struct {
	mu      sync.Mutex // guards the fields below
	next    uint64
	entries map[string]memEntry
}

type memEntry struct {
	o   Ownership
	rev uint64
}

var _ Ledger = (*MemLedger)(nil)

// NewMemLedger returns an empty in-memory ledger.
func NewMemLedger() *MemLedger { return &MemLedger{entries: make(map[string]memEntry)} }

// Create implements Ledger.
func (l *MemLedger) Create(key string, o Ownership) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.entries[key]; ok {
		return 0, fmt.Errorf("key %s owned by %s: %w", key, e.o.SessionID, ErrKeyTaken)
	}
	l.next++
	l.entries[key] = memEntry{o: o, rev: l.next}
	return l.next, nil
}

// Get implements Ledger.
func (l *MemLedger) Get(key string) (Ownership, uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.entries[key]
	if !ok {
		return Ownership{}, 0, fmt.Errorf("key %s: %w", key, ErrNoOwner)
	}
	return e.o, e.rev, nil
}

// Update implements Ledger.
func (l *MemLedger) Update(key string, o Ownership, rev uint64) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.entries[key]
	if !ok || e.rev != rev {
		return 0, fmt.Errorf("update key %s at revision %d: %w", key, rev, ErrRevision)
	}
	l.next++
	l.entries[key] = memEntry{o: o, rev: l.next}
	return l.next, nil
}

// Delete implements Ledger.
func (l *MemLedger) Delete(key string, rev uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.entries[key]
	if !ok || e.rev != rev {
		return fmt.Errorf("delete key %s at revision %d: %w", key, rev, ErrRevision)
	}
	delete(l.entries, key)
	return nil
}
