package client

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Defaults of Options.
const (
	DefaultDialTimeout  = 10 * time.Second
	DefaultWriteTimeout = 10 * time.Second
	DefaultCloseWait    = 2 * time.Second
	DefaultEventBuffer  = 1024
	DefaultMaxMessage   = 64 << 20
	// DefaultOverloadRetries is Options.OverloadRetries by default.
	DefaultOverloadRetries = 5
)

// Options configure a connection. The zero value works for a host on
// http://127.0.0.1 with no token.
type Options struct {
	// Token is the access token, sent as "Authorization: Bearer" — never
	// in the URL. When empty, a ?token= in the base URL (as tether serve
	// prints it) is taken instead.
	Token string
	// TLSConfig is used for https:// and wss:// URLs (nil: the system
	// roots, the URL's host name).
	TLSConfig *tls.Config
	// Origin, when set, is sent as the Origin header (the host accepts
	// none, its own, or one listed with --allow-origin).
	Origin string
	// Host, when set, replaces the Host header derived from the URL
	// (behind a proxy, or to test a host's checks).
	Host string
	// Header holds extra handshake headers. An Authorization header here
	// replaces the one Token would make.
	Header http.Header
	// DialTimeout bounds the connect, the handshake and the wait for the
	// host's first frame (gateway.ready, pty.replay). Zero means
	// DefaultDialTimeout, negative no limit beyond ctx.
	DialTimeout time.Duration
	// WriteTimeout bounds every frame write. Zero means
	// DefaultWriteTimeout, negative no limit.
	WriteTimeout time.Duration
	// CloseWait bounds how long Close waits for the host to answer its
	// close frame. Zero means DefaultCloseWait.
	CloseWait time.Duration
	// ReadBufferSize sizes the read buffer (0: 4 KiB for JSON-RPC,
	// 32 KiB for a PTY).
	ReadBufferSize int

	// The fields below are for Dial (JSON-RPC) only.

	// OnEvent, when set, is called with every server event after
	// gateway.ready, in order, on the connection's reader goroutine: it
	// must not block for long (a blocked OnEvent stalls responses too,
	// but drops nothing). When nil, events go to Conn.Events.
	OnEvent func(Event)
	// EventBuffer is the capacity of Conn.Events (0: DefaultEventBuffer).
	// When it is full the connection ends with ErrEventOverflow.
	EventBuffer int
	// OnUnmatched, when set, is called on the reader goroutine with each
	// frame that is neither an event nor the response to a pending call:
	// a response to a call that gave up (its ctx ended), an error with id
	// null (a frame the host could not parse), a binary frame, a frame
	// that is not JSON-RPC. When nil such frames are dropped.
	OnUnmatched func(frame []byte, binary bool)
	// MaxMessage bounds a message from the host (0: DefaultMaxMessage);
	// a longer one ends the connection.
	MaxMessage int64
	// OverloadRetries is how many times a call answered 5003 with
	// data.retry_after_ms (the host's store was overloaded and wrote
	// nothing of the call) is sent again, each after retry_after_ms and
	// up to half as much again at random, within ctx. Only calls that a
	// second try cannot double are retried: prompt.submit (such a 5003
	// says the prompt was not stored) and session.resume, .activate,
	// .events.since, .list, .runs, .active_list; never session.create or
	// .branch. Zero means DefaultOverloadRetries, negative none.
	OverloadRetries int
}

func (o Options) dialTimeout() time.Duration  { return orDefault(o.DialTimeout, DefaultDialTimeout) }
func (o Options) writeTimeout() time.Duration { return orDefault(o.WriteTimeout, DefaultWriteTimeout) }
func (o Options) closeWait() time.Duration    { return orDefault(o.CloseWait, DefaultCloseWait) }
func (o Options) readBuffer(def int) int      { return orDefault(o.ReadBufferSize, def) }
func (o Options) maxMessage() int64           { return orDefault(o.MaxMessage, DefaultMaxMessage) }
func (o Options) eventBuffer() int            { return orDefault(o.EventBuffer, DefaultEventBuffer) }
func (o Options) overloadRetries() int        { return orDefault(o.OverloadRetries, DefaultOverloadRetries) }

// orDefault returns def for 0, 0 for a negative v (no limit), else v.
func orDefault[T int | int64 | time.Duration](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// Endpoint turns a base URL — http(s):// or ws(s)://host[:port][/prefix]
// [?token=T], as Dial and AttachPTY take it — into the ws(s) URL of path
// (wire.PathRPC, wire.PathPTY) below it, and returns the token it
// carried. Query, fragment and user info are dropped.
func Endpoint(base, path string) (*url.URL, string, error) {
	u, err := wsURL(base)
	if err != nil {
		return nil, "", err
	}
	token := u.Query().Get("token")
	return &url.URL{Scheme: u.Scheme, Host: u.Host, Path: strings.TrimSuffix(u.Path, "/") + path}, token, nil
}

// wsURL parses raw and maps http to ws and https to wss.
func wsURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("invalid URL %q: %w", raw, err)
	}
	switch u.Scheme {
	case "http", "ws":
		u.Scheme = "ws"
	case "https", "wss":
		u.Scheme = "wss"
	default:
		return nil, fmt.Errorf("invalid URL %q: want http(s)://host:port", raw)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("invalid URL %q: no host", raw)
	}
	return u, nil
}

// redact returns u as a string with a token in its query hidden.
func redact(u *url.URL) string {
	v := *u
	v.User = nil
	if q := v.Query(); q.Has("token") {
		q.Set("token", "REDACTED")
		v.RawQuery = q.Encode()
	}
	return v.String()
}
