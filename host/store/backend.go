package store

import (
	"context"
	"time"

	"github.com/tether-agent/tether/host/agent"
)

// Backend is what the session table needs of a store of stored sessions:
// the method set of *Store with its semantics, errors and orders. The
// SQLite *Store is a single host's; host/internal/cluster/jsstore's Store keeps
// the same on NATS JetStream for a cluster of hosts. Both pass the
// conformance suite in host/store/storetest.
type Backend interface {
	CreateSession(ctx context.Context, sess Session) error
	GetSession(ctx context.Context, key string) (Session, error)
	FindByTitle(ctx context.Context, title string) (Session, error)
	List(ctx context.Context, limit int) ([]Session, error)
	End(ctx context.Context, key, reason string, at time.Time) error
	Reopen(ctx context.Context, key string) error
	SetCursor(ctx context.Context, key, epoch string, lastSeq uint64) error
	SetAgentState(ctx context.Context, key, state string) error
	SetTitle(ctx context.Context, key, title string) error

	AppendMessages(ctx context.Context, key string, msgs ...agent.Message) error
	Messages(ctx context.Context, key string) ([]agent.Message, error)
	DisplayMessages(ctx context.Context, key string) ([]agent.Message, error)
	DisplayCount(ctx context.Context, key string) (int, error)

	StartTurn(ctx context.Context, key string, prompt agent.Message, r Run) error
	StartRun(ctx context.Context, key string, r Run) error
	EndRun(ctx context.Context, key, runID, status string, at time.Time) error
	Runs(ctx context.Context, key string) ([]Run, error)

	AppendEvents(ctx context.Context, events []Event, keep Retention) error
	EventsSince(ctx context.Context, key string, after uint64, limit int) (events []Event, first, last uint64, err error)
	Commit(ctx context.Context, b Batch, keep Retention) error

	// QuickCheck checks that the store is whole (ErrDamaged when not).
	QuickCheck(ctx context.Context) error
	// SetWriteFault makes every write fail with f's error while f
	// returns one (tests); nil removes it.
	SetWriteFault(f func() error)
	// OnWriteFault is called with every failed write's error.
	OnWriteFault(f func(error))
	// Close ends the store's use.
	Close() error
}

var _ Backend = (*Store)(nil)
