package session

import "github.com/tether-agent/tether/host/internal/ownership"

// Ownership store errors: the ownership package's, under the table's
// names (errors.Is matches either).
var (
	// ErrConflict is ownership.ErrConflict: the entry is not at the
	// revision the caller read.
	ErrConflict = ownership.ErrConflict
	// ErrNoOwner is ownership.ErrNoOwner: no owner is recorded for the
	// key.
	ErrNoOwner = ownership.ErrNoOwner
	// ErrUnavailable is ownership.ErrUnavailable: the store could not be
	// reached; the entry may or may not have changed.
	ErrUnavailable = ownership.ErrUnavailable
)

// Owner is what the ownership store records for a live stored key
// (ownership.Owner).
type Owner = ownership.Owner

// Owners records which live session owns which stored key, changed only
// by revision-checked compare-and-swap (ownership.Store). The in-memory
// MemOwners serves one host; host/internal/cluster's KVOwners shares the
// table between hosts on JetStream KV.
type Owners = ownership.Store

// MemOwners is the in-memory Owners of a single host (ownership.Mem).
type MemOwners = ownership.Mem

// NewMemOwners returns an empty in-memory ownership store.
func NewMemOwners() *MemOwners { return ownership.NewMem() }
