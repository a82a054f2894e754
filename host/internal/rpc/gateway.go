package rpc

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/prompt"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

// Gateway is the JSON-RPC 2.0 dispatcher of /api/ws: the link endpoint
// whose connections are viewers of the session table.
type Gateway struct {
	table   *session.Table
	store   store.Backend
	version string
	log     zerolog.Logger
	metrics *metrics.Metrics
	// ctx is the gateway's lifetime, cancelled by Close; handlers that
	// wait (resume, close) use it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // per-connection workers
	// remote reaches the other hosts of a cluster (nil on a single
	// host).
	remote Remote
	// book holds the host's credentials (SetCredentials); nil in tests
	// of connections without one.
	book *access.Book
	// promptCaps are what a prompt's content may hold besides text and
	// resource links (SetPromptCaps; nil: nothing more).
	promptCaps prompt.Caps
	// push is the host's Web Push (SetPush); nil: push.* are off.
	push    Push
	grants  sync.WaitGroup         // grants of what a "new" credential created, in flight
	pageURL atomic.Pointer[string] // the public URL, set once the listener is known (SetPageURL)
}

var _ link.Endpoint = (*Gateway)(nil)

// New returns a dispatcher over table; version is sent in gateway.ready.
func New(table *session.Table, st store.Backend, version string, log zerolog.Logger, m *metrics.Metrics) *Gateway {
	ctx, cancel := context.WithCancel(context.Background())
	for name := range methods {
		m.RPCDuration.WithLabelValues(name) // exists from the start, empty
	}
	return &Gateway{table: table, store: st, version: version, log: log, metrics: m, ctx: ctx, cancel: cancel}
}

// SetPromptCaps sets the configured agent's prompt capabilities, which
// prompt.submit's content is checked against. Call it before the gateway
// has a connection.
func (g *Gateway) SetPromptCaps(c prompt.Caps) { g.promptCaps = c }

// Close cancels requests in flight and waits for their workers.
func (g *Gateway) Close() {
	g.cancel()
	g.wg.Wait()
	g.grants.Wait()
}

// Open implements link.Endpoint: it admits the connection and sends it
// gateway.ready.
func (g *Gateway) Open(o link.Opening) link.Conn {
	c := g.newConn(o.ID, o.Transport, o.Out)
	c.who = o.Who
	o.Out.Send(contract.Command{Kind: contract.CommandAdmit, Conn: o.ID.Conn})
	if o.Transport != link.RelayTransport {
		// A relayed connection's client had gateway.ready from its own
		// host.
		c.ready()
	}
	return c
}

func (g *Gateway) newConn(id contract.TransportID, transport string, out link.Sender) *conn {
	return &conn{
		id:        id,
		transport: transport,
		out:       out,
		gw:        g,
		log:       g.log.With().Str("transport_id", id.String()).Logger(),
		bindings:  make(map[string]session.Binding),
		legs:      make(map[string]*leg),
		remote:    make(map[string]*leg),
	}
}

// ErrorOf maps a table error to the protocol's error code and message
// (the /acp endpoint answers with the same codes).
func ErrorOf(err error) (code int, message string) {
	re := toRPCError(err)
	return re.Code, re.Message
}

// toRPCError maps table errors to the protocol's codes.
func toRPCError(err error) *rpcError {
	var re *rpcError
	switch {
	case errors.As(err, &re):
		return re
	case errors.Is(err, session.ErrUnknownSession):
		return errorf(wire.CodeUnknownSession, "unknown session_id; resume by stored key")
	case errors.Is(err, session.ErrNoLongerLive):
		return errorf(wire.CodeStoredNotFound, "session no longer live; retry resume")
	case errors.Is(err, session.ErrStoredNotFound):
		return errorf(wire.CodeStoredNotFound, "stored session not found")
	case errors.Is(err, session.ErrSessionBusy):
		return errorf(wire.CodeSessionBusy, "session busy: a run is in flight")
	case errors.Is(err, session.ErrAlreadyResolved):
		return errorf(wire.CodeAlreadyResolved, "already resolved")
	case errors.Is(err, session.ErrUnknownPermission), errors.Is(err, session.ErrUnknownOption):
		return errorf(wire.CodeInvalidParams, "%v", err)
	case errors.Is(err, session.ErrStoreUnreachable):
		// A cluster electing leaders: retried like an unreachable owner.
		return errorf(wire.CodeOwnerUnreachable, "owner unreachable; retry: %s", strings.ReplaceAll(err.Error(), ": storage unreachable", ""))
	case errors.Is(err, session.ErrOverloaded):
		// Nothing was written: the client may ask again after the hint.
		ra, _ := session.RetryAfter(err)
		ms := max(ra.Milliseconds(), 1)
		re := errorf(wire.CodeStorageUnavailable, "storage overloaded; retry after %d ms (nothing was written)", ms)
		re.Data = wire.RetryData{RetryAfterMS: ms}
		return re
	case errors.Is(err, session.ErrStorageUnavailable):
		return errorf(wire.CodeStorageUnavailable, "storage unavailable: %s", strings.ReplaceAll(err.Error(), ": storage unavailable", ""))
	case errors.Is(err, session.ErrOwnersUnavailable):
		return errorf(wire.CodeOwnerUnreachable, "owner unreachable; retry: %v", err)
	case errors.Is(err, session.ErrBuildFailed), errors.Is(err, session.ErrTableClosed),
		errors.Is(err, session.ErrOwnedElsewhere):
		return errorf(wire.CodeResumeFailed, "%v", err)
	}
	return errorf(wire.CodeInternalError, "internal error: %v", err)
}
