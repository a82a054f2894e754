// Package acpgw is the /acp endpoint: tether as the Agent Client Protocol
// agent to unmodified ACP clients (editors, the SDKs' clients), one ACP
// JSON-RPC message per WebSocket text frame, spoken with
// github.com/coder/acp-go-sdk. An ACP session is a tether session (its
// sessionId is the stored key): session/new creates one with the
// configured agent, session/prompt submits a prompt and answers when its
// run ends, session/load replays the session's whole history from the
// journal before answering, session/resume with _meta["tether/after"]
// replays only what came after, and every session/update carries the
// event's seq in _meta["tether/seq"]. A connection is a viewer of the
// sessions it bound, like a native /api/ws one, so both kinds watch and
// drive the same session at once.
package acpgw

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/coder/acp-go-sdk"
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

// CodeTurnFailed is the JSON-RPC error of a session/prompt whose turn
// failed (the agent's error, or its crash); data.reason says why.
const CodeTurnFailed = wire.CodeTurnFailed

// Meta keys tether reads and writes.
const (
	// MetaSeq carries an update's event seq in session/update's _meta.
	MetaSeq = "tether/seq"
	// MetaBy, in a session/update of a prompt, names who submitted it
	// (a credential's name).
	MetaBy = "tether/by"
	// MetaAfter, in session/resume's _meta, asks for the updates after a
	// seq.
	MetaAfter = "tether/after"
	// MetaTruncated, true in a load's or resume's response _meta, says
	// the replay left out updates the journal no longer holds.
	MetaTruncated = "tether/truncated"
	// MetaRequestID, in a session/request_permission's _meta, is the
	// request's id (the request_id native clients see).
	MetaRequestID = "tether/request_id"
)

// closedMethod is the extension notification the connection feeds its
// protocol reader after a closed client's last message: the library
// dispatches notifications in order, so when it is handled every message
// before it was. A client cannot send it (OnFrame refuses it).
const closedMethod = "_tether/closed"

// startWait bounds how long the reader waits for a request to start
// before it feeds the next message.
const startWait = 10 * time.Second

// maxLine is the length of a line the ACP library's reader no longer
// reads (a bufio.Scanner of 10 MiB): a message that long is refused
// before it (a prompt that big passes no transport's 1 MiB frames today).
const maxLine = 10 << 20

// maxQueued bounds a connection's frames waiting for the protocol
// reader; a client that floods past it is closed with 1013.
const maxQueued = 1024

// Config configures a Gateway.
type Config struct {
	Table *session.Table
	Store store.Backend
	// Cwd is the working directory of sessions a client makes without
	// one.
	Cwd     string
	Version string
	Log     zerolog.Logger
	Metrics *metrics.Metrics
	// PromptCaps are the configured agent's prompt capabilities, passed
	// on by initialize and checked by session/prompt (nil: text and
	// resource links only).
	PromptCaps prompt.Caps
}

// Gateway is the /acp endpoint.
type Gateway struct {
	cfg    Config
	book   *access.Book // the host's credentials (SetCredentials); nil: identities as given
	remote Remote       // the other hosts of a cluster (SetRemote); nil: none
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

var _ link.Endpoint = (*Gateway)(nil)

// New returns the /acp endpoint.
func New(cfg Config) *Gateway {
	ctx, cancel := context.WithCancel(context.Background())
	return &Gateway{cfg: cfg, ctx: ctx, cancel: cancel}
}

// Close ends every connection's work and waits for it.
func (g *Gateway) Close() {
	g.cancel()
	g.wg.Wait()
}

// Open implements link.Endpoint.
func (g *Gateway) Open(o link.Opening) link.Conn {
	id, out := o.ID, o.Out
	out.Send(contract.Command{Kind: contract.CommandAdmit, Conn: id.Conn})
	c := &conn{
		g:          g,
		id:         id,
		transport:  o.Transport,
		who:        o.Who,
		out:        out,
		log:        g.cfg.Log.With().Str("transport_id", id.String()).Str("endpoint", wire.PathACP).Logger(),
		in:         make(chan inLine, maxQueued),
		lines:      make(chan []byte),
		events:     make(chan struct{}, 1),
		closing:    make(chan struct{}),
		drained:    make(chan struct{}),
		stop:       make(chan struct{}),
		bindings:   make(map[string]session.Binding),
		byID:       make(map[string]string),
		loading:    make(map[string]*loadState),
		runs:       make(map[string]chan runEnd),
		ended:      make(map[string]runEnd),
		prompts:    make(map[string]int),
		promptText: make(map[string]string),
		asks:       make(map[string]*askState),
	}
	c.fw = &frameWriter{c: c}
	c.asc = acp.NewAgentSideConnection(&acpAgent{c: c}, c.fw, &lineReader{lines: c.lines})
	// The library's own complaints (a notification it could not
	// handle, a connection it closed on overflow) are tether's warnings.
	c.asc.SetLogger(slog.New(slog.NewTextHandler(warnWriter{c.log}, &slog.HandlerOptions{Level: slog.LevelError})))
	g.wg.Add(2)
	go c.pumpIn()
	go c.pumpEvents()
	return c
}

// conn is one /acp connection: an ACP agent-side connection to the client
// and a viewer of the sessions it bound.
type conn struct {
	g         *Gateway
	id        contract.TransportID
	transport string
	who       access.Identity // who the connection's credential names
	out       link.Sender
	log       zerolog.Logger
	asc       *acp.AgentSideConnection
	fw        *frameWriter  // what asc writes to; notifyRaw writes there too
	in        chan inLine   // client frames for the protocol reader
	lines     chan []byte   // what the protocol reader reads; closed at the end
	events    chan struct{} // capacity 1: evq has frames for the event worker
	closing   chan struct{} // closed by OnClosed
	closeOnce sync.Once
	drained   chan struct{} // closed when the protocol reader handled closedMethod
	evmu      sync.Mutex    // guards evq, evbytes and evcut; a leaf lock
	evq       [][]byte      // events for the event worker, in order
	evbytes   int
	evcut     bool // the queue overflowed: the connection is being closed
	drainOnce sync.Once
	stop      chan struct{} // closed when the connection has ended

	mu sync.Mutex // guards the fields below
	// created holds the stored keys of the sessions this connection
	// made, which a credential that is not admin reaches at once.
	created map[string]bool
	// bindings by stored key (the ACP sessionId), and the stored key of
	// each bound runtime id.
	bindings map[string]session.Binding
	byID     map[string]string
	// loading holds the sessions being loaded or resumed: their live
	// events wait until the replay is out.
	loading map[string]*loadState
	// runs this connection submitted, by run id: told how they ended.
	runs map[string]chan runEnd
	// submitting counts this connection's Submits under way; ended keeps
	// the ends of runs that finished meanwhile (one may be a run whose
	// Submit has not returned yet).
	submitting int
	ended      map[string]runEnd
	// prompts and promptText: per runtime session id, this connection's
	// prompts being submitted and the last one's text, so their
	// message.start is not sent back to it as another client's prompt.
	prompts    map[string]int
	promptText map[string]string
	// asks are this connection's open permission requests to its client,
	// by request id: cancelled (withdrawn) when another answer wins.
	asks map[string]*askState
	// starting is the client request just fed to the protocol reader,
	// until its handler starts or it is answered; busy counts handlers
	// whose work on the connection's bindings is not done, and idle is
	// closed when busy drops to 0.
	starting *startingRequest
	busy     int
	idle     chan struct{}
	// closed: the connection has ended (or is ending): no binding is
	// kept and no request asked.
	closed bool
	// rs is what a cluster host's connection relays (remote.go).
	rs remoteState
}

// askState is one permission request open at the client.
type askState struct {
	cancel context.CancelFunc // withdraws it
	done   chan struct{}      // closed when its goroutine is done
	// rpcID is the JSON-RPC id the client sees (compact), and answered
	// says the client's answer to it was fed to the protocol reader.
	rpcID    string
	answered bool
}

// startingRequest is a client request fed to the protocol reader whose
// handler has not started yet.
type startingRequest struct {
	id      string        // its JSON-RPC id, compact
	started chan struct{} // closed when its handler starts or it is answered
}

// inLine is one client message for the protocol reader.
type inLine struct {
	data []byte
	// request is the id of a request, response the id of a response
	// (compact), or "".
	request, response string
}

var (
	_ session.Viewer = (*conn)(nil)
	_ link.Conn      = (*conn)(nil)
)

// loadState holds a session's live events while its replay is sent.
type loadState struct {
	held []event
	// stored is closed when every event up to the bind's snapshot is
	// stored (so the journal can replay them all): the table hands the
	// barrier frame to Send only then.
	stored chan struct{}
}

// barrierPrefix starts the frames bind passes to the table's send
// function as a barrier; never a JSON-RPC message.
const barrierPrefix = "\x00barrier:"

// runEnd is how a run ended, from its message.complete.
type runEnd struct {
	RunID      string `json:"run_id"`
	Text       string `json:"text"`
	Status     string `json:"status"`
	StopReason string `json:"stop_reason"`
	Reason     string `json:"reason"`
}

// ID implements session.Viewer.
func (c *conn) ID() contract.TransportID { return c.id }

// Transport implements session.Viewer.
func (c *conn) Transport() string { return c.transport }

// maxEventBytes bounds the events queued for one /acp connection's event
// worker, like the WebSocket transport's send queue: a burst of updates
// (an agent streaming thousands unpaced) waits there while the worker
// encodes them; past the bound the connection is closed with 1013.
const maxEventBytes = 16 << 20

// Send implements session.Viewer: an event of a bound session, queued for
// the event worker (never blocking: a connection whose queue passes
// maxEventBytes is closed with 1013 and can load its sessions again).
func (c *conn) Send(frame []byte) {
	c.evmu.Lock()
	if c.evcut {
		c.evmu.Unlock()
		return
	}
	if c.evbytes+len(frame) > maxEventBytes {
		c.evcut, c.evq, c.evbytes = true, nil, 0
		c.evmu.Unlock()
		c.log.Warn().Msg("acp client too slow for its sessions' events; closing it")
		c.closeWith(wire.CloseTryAgainLater, "too slow")
		return
	}
	c.evq = append(c.evq, frame)
	c.evbytes += len(frame)
	c.evmu.Unlock()
	select {
	case c.events <- struct{}{}:
	default:
	}
}

// takeEvents returns the queued events and empties the queue.
func (c *conn) takeEvents() [][]byte {
	c.evmu.Lock()
	defer c.evmu.Unlock()
	q := c.evq
	c.evq, c.evbytes = nil, 0
	return q
}

// Released implements session.Viewer.
func (c *conn) Released(s *session.Session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.bindings[s.Key()]; ok && b.Session() == s {
		delete(c.bindings, s.Key())
		delete(c.byID, s.ID())
	}
}

func (c *conn) closeWith(code int, reason string) {
	c.out.Send(contract.Command{Kind: contract.CommandClose, Conn: c.id.Conn, Code: code, Reason: reason})
}
