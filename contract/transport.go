package contract

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// TransportID identifies one connection of one transport plugin process:
// the plugin instance id (fresh for every process the host starts) and the
// connection id the plugin assigns (never reused within an instance). A
// TransportID is never reused, also across plugin restarts. The zero value
// means "no transport".
type TransportID struct {
	Instance string
	Conn     uint64
}

// IsZero reports whether id is the zero TransportID.
func (id TransportID) IsZero() bool { return id == TransportID{} }

// String formats id as "instance/conn".
func (id TransportID) String() string {
	if id.IsZero() {
		return "-"
	}
	return id.Instance + "/" + strconv.FormatUint(id.Conn, 10)
}

// ParseTransportID parses the String form of a TransportID.
func ParseTransportID(s string) (TransportID, error) {
	i := strings.LastIndexByte(s, '/')
	if i <= 0 {
		return TransportID{}, fmt.Errorf("transport id %q: %w", s, ErrInvalidArgument)
	}
	n, err := strconv.ParseUint(s[i+1:], 10, 64)
	if err != nil {
		return TransportID{}, fmt.Errorf("transport id %q: %w", s, ErrInvalidArgument)
	}
	return TransportID{Instance: s[:i], Conn: n}, nil
}

// NewInstanceID returns a random plugin instance id (16 lower-case hex
// characters). The host gives each plugin process it starts a new one.
func NewInstanceID() string { return RandomHex(8) }

// RandomHex returns n bytes from crypto/rand as 2n lower-case hex
// characters: the one source of tether's random ids, epochs and tokens.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails: crypto/rand crashes the program instead
	return hex.EncodeToString(b)
}

// EventKind says what happened to a transport connection.
type EventKind uint8

// Event kinds reported by a transport.
const (
	// EventOpened: a new connection was upgraded. The transport reads no
	// frame from it until the host admits it with CommandAdmit.
	EventOpened EventKind = iota + 1
	// EventFrame: a complete data message arrived.
	EventFrame
	// EventClosed: the connection is gone. It is the last event for Conn.
	EventClosed
)

// String names the kind.
func (k EventKind) String() string {
	switch k {
	case EventOpened:
		return "opened"
	case EventFrame:
		return "frame"
	case EventClosed:
		return "closed"
	}
	return "event(" + strconv.Itoa(int(k)) + ")"
}

// Event is something a transport reports about one of its connections.
// Events for one connection are delivered in order: Opened, then Frames,
// then exactly one Closed.
type Event struct {
	Kind EventKind
	Conn uint64

	// Opened.
	Path   string              // URL path, e.g. "/api/ws"
	Query  string              // raw query string, without "?"
	Header map[string][]string // request headers, canonical keys
	Remote string              // peer address host:port
	Host   string              // the request's Host header

	// Frame.
	Binary bool   // binary (true) or text (false) message
	Data   []byte // message payload

	// Closed.
	Code   int    // close code received or sent; wire.CloseAbnormal (1006) when there was none
	Reason string // close reason, if any

	// Page marks an Opened event that is a request for a web page, not
	// a WebSocket (StartRequest.PageAuth): the host answers it with one
	// CommandAdmit (serve the page, setting the command's Header on the
	// response) or one CommandClose (refuse it: 4401 is HTTP 401, 4403
	// and 4408 are 403, anything else 503), and no Closed event follows.
	Page bool
}

// CommandKind says what the host asks a transport to do with a connection.
type CommandKind uint8

// Command kinds sent by the host.
const (
	// CommandAdmit lets the transport start reading frames of Conn.
	CommandAdmit CommandKind = iota + 1
	// CommandSend queues one message on Conn.
	CommandSend
	// CommandClose sends a close frame with Code and Reason (after every
	// message queued before it) and closes Conn.
	CommandClose
)

// String names the kind.
func (k CommandKind) String() string {
	switch k {
	case CommandAdmit:
		return "admit"
	case CommandSend:
		return "send"
	case CommandClose:
		return "close"
	}
	return "command(" + strconv.Itoa(int(k)) + ")"
}

// Command is an instruction from the host for one connection. Commands for
// one connection are applied in order.
type Command struct {
	Kind   CommandKind
	Conn   uint64
	Binary bool   // Send: binary or text message
	Data   []byte // Send: payload
	Code   int    // Close: close code
	Reason string // Close: close reason
	// Header is, on the Admit of a page request (Event.Page), headers to
	// set on the page's response (the page cookie's Set-Cookie). On the
	// Admit of a connection the host admitted by its reverse proxy's
	// user header, it is what else binds the connection:
	// AdmitBindHeader names that request header and AdmitBindFrom has
	// one value a prefix of the proxy's addresses. A transport whose
	// connection spans several requests (ws's /acp over Streamable HTTP)
	// then holds each later request to the user header's value of the
	// first, read only from a peer in those prefixes (from any other it
	// counts as absent), as it holds them to the first's credential; a
	// transport with one request a connection may ignore it.
	Header map[string][]string
}

// The headers of the Admit of a connection the host admitted by its
// reverse proxy's user header (Command.Header; docs/PROTOCOL.md 14.15).
const (
	// AdmitBindHeader has one value: the request header that names the
	// user.
	AdmitBindHeader = "Tether-Bind-Header"
	// AdmitBindFrom has one value a prefix (netip.Prefix syntax) of the
	// addresses the proxy connects from: only from those peers is the
	// user header read.
	AdmitBindFrom = "Tether-Bind-From"
)

// StartRequest configures a transport before it is linked.
type StartRequest struct {
	// Instance is the plugin instance id the host assigned; the transport
	// uses it only for logging.
	Instance string
	// Listen is the address of the public listener, e.g. "127.0.0.1:0",
	// or "fd:N": serve the listening socket inherited as file descriptor
	// N (net.FileListener). tether's host always sends "fd:3": it keeps
	// the public listener itself and lends it to every transport process
	// it starts, so the port stays bound across restarts and swaps.
	Listen string
	// PingInterval is how often idle peers are pinged (default 20s).
	PingInterval time.Duration
	// PeerTimeout closes a peer silent for that long (default 60s).
	PeerTimeout time.Duration
	// MaxMessage is the largest data message accepted; larger is closed
	// with 1009 (default 1 MiB).
	MaxMessage int64
	// SendQueue bounds the bytes queued for one connection; a peer that
	// lets more pile up is closed with 1013 (default 8 MiB).
	SendQueue int64

	// The fields below are for a transport that serves HTTP on a TCP
	// listener, as tether's ws does; a transport that does not (like
	// examples/unixsock) may ignore them.

	// MaxConnections bounds the open connections: every accepted TCP
	// connection counts, upgraded or not, idle HTTP keep-alive included,
	// until it is closed. Past it a new connection is answered HTTP 503
	// and closed, and counted in TransportStats.Refused503. A transport
	// may lower it to stay under its file descriptor limit and reports the
	// bound it applies in StartResponse.MaxConnections. Zero means the
	// transport's default (20000 for ws, as the host's --max-connections).
	MaxConnections int
	// HeaderTimeout closes a connection whose request headers (and TLS
	// handshake) have not all arrived within it (default 10s).
	HeaderTimeout time.Duration
	// TLSCertFile and TLSKeyFile, both or neither, are PEM files: the
	// transport then serves HTTPS and WSS (TLS 1.2 or later) instead of
	// plain HTTP. A transport that serves HTTP and cannot do TLS must
	// fail Start rather than serve in the clear.
	TLSCertFile string
	TLSKeyFile  string
	// PageAuth asks the transport to let the host decide every request
	// for its web page: it reports the request as an Opened event with
	// Page set (path, query, headers, peer, Host, as for an upgrade),
	// holds it until the host's one command for it, and then serves the
	// page with the Admit's Header set on the response, or refuses it
	// (Close 4401: HTTP 401; 4403, 4408: 403; else 503). The host sends
	// no token: it checks the credential (and sets the page cookie)
	// itself. false leaves the page public (the host checks every
	// upgrade either way). tether's host always sets it.
	PageAuth bool
}

// StartResponse reports the bound listener.
type StartResponse struct {
	// Addr is the bound host:port of the public listener.
	Addr string
	// Version is the transport's own version string.
	Version string
	// MaxConnections is the bound on open connections the transport
	// applies (see StartRequest.MaxConnections); 0 when it applies none.
	MaxConnections int
}

// StopRequest asks a transport to stop: close the listener, then every
// connection with Code, and report each Closed event.
type StopRequest struct {
	Code   int
	Reason string
}

// EventSink receives batches of events from a transport, in order. It must
// not retain the slice after returning.
type EventSink func(ctx context.Context, events []Event) error

// OwnedExecer is implemented by a Transport that can take over the Data
// of the commands it is given instead of copying it. The gRPC server
// calls ExecOwned, rather than Exec, with commands it has just
// unmarshalled, whose Data nobody else holds; the transport may keep
// that Data until it is written.
type OwnedExecer interface {
	// ExecOwned is Exec for commands whose Data the callee may keep.
	ExecOwned(ctx context.Context, cmds []Command) error
}

// TransportStats are a transport's counters, from the start of its
// process (a restarted plugin counts from zero again).
type TransportStats struct {
	// Connections is the number of connections open now: each from its
	// accept until its socket is closed, which for an upgraded one is
	// before its EventClosed is reported.
	Connections int64
	// Refused503 counts the connections refused because MaxConnections
	// were open (answered HTTP 503 and closed), or because the process
	// ran out of file descriptors (closed at once).
	Refused503 uint64
}

// StatsReporter is implemented by a Transport that reports counters; the
// host asks for them to export its metrics. TransportGRPCClient always
// implements it: a plugin whose transport does not answers with an error
// matching errors.ErrUnsupported.
type StatsReporter interface {
	// Stats returns the transport's counters now.
	Stats(ctx context.Context) (TransportStats, error)
}

// Transport is what a transport plugin implements. The host calls Start,
// then Link (which runs until the link ends) and, concurrently with Link,
// Exec for commands; Stop ends it all. All of the transport's connections
// are multiplexed over the one link: over gRPC it is a single
// bidirectional stream.
type Transport interface {
	// Start binds the public listener.
	Start(ctx context.Context, req StartRequest) (StartResponse, error)
	// Link delivers every event of every connection to sink, in order,
	// batching events that pile up, until ctx is done or the transport is
	// stopped. It returns ErrAlreadyLinked if a link is already running.
	Link(ctx context.Context, sink EventSink) error
	// Exec applies cmds in order. It never blocks on a slow peer: a
	// connection whose queue overflows is closed with 1013. Commands for
	// a connection that is already gone are ignored.
	Exec(ctx context.Context, cmds []Command) error
	// Stop closes the listener and every connection.
	Stop(ctx context.Context, req StopRequest) error
}

// WithoutTetherEnv returns env without its TETHER_* variables: none of
// tether's own settings (the access token among them) reaches a PTY's
// shell, an agent's process or a plugin the host starts. The only
// TETHER_* variables a plugin then gets are those of its handshake, set
// by the host: TETHER_PLUGIN (go-plugin's cookie),
// TETHER_PLUGIN_STATE_DIR and TETHER_PLUGIN_LOG_LEVEL, and the PTY
// plugin its instance secret, TETHER_PLUGIN_SECRET.
func WithoutTetherEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, "TETHER_") {
			out = append(out, kv)
		}
	}
	return out
}
