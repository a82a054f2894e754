// Package transport is an example third-party tether transport: the
// host's session protocol over a Unix socket, one message per line, so
// that terminal clients can speak JSON-RPC to a tether host without
// WebSocket. New returns its contract.Transport, a transportkit.Stream
// with this package's wire format; its plugin binary is
// examples/unixsock.
//
// # Listening
//
// StartRequest.Listen "unix:PATH" listens on the socket PATH; any other
// value (the host passes its --listen, "127.0.0.1:7717" by default) listens
// on DefaultPath(). A socket file left behind by a transport that is gone
// is removed; one that still answers fails Start. The socket is made mode
// 0600, so only its owner can connect (the host's token check still
// applies). Start returns the address "unix:PATH"; Stop removes the file.
//
// # Protocol
//
// The client opens with one handshake line, "TETHER" and the raw query
// string the host reads its access token from:
//
//	TETHER token=0123abcd
//
// The connection is then reported Opened with Path "/api/ws", that Query,
// Remote "unix", Host the address Start returned (the host compares it
// with that address) and no headers; any other first line is answered
// with a close line with 1002. Nothing after the handshake is read
// before the host admits the connection.
//
// After that, each line is one text message, both ways (a trailing "\r"
// is dropped, a line may be empty): a line from the client is a Frame, a
// host Send is written as a line. A line over MaxMessage closes the
// connection with 1009, one that is not UTF-8 with 1007. Binary messages
// and text containing a line break cannot be sent: a host Send of one
// closes the connection with 1003.
//
// A close is a last line {"close":CODE,"reason":"..."} (a line that starts
// with {"close": and has no other fields than close and reason), then the
// end of the connection. The server writes it after every queued line
// when the host closes the connection or the transport stops, instead of
// them when its send queue overflows (1013); a client may send one too,
// and its code is reported. A connection that ends without a close line
// is reported with 1006.
//
// # Limits
//
// Those of transportkit.Stream: the handshake line and the admission
// each within PeerTimeout (else the connection is dropped, or closed with
// 1013 "admit timeout"), SendQueue bytes queued per connection (else
// 1013), each write within PeerTimeout. There is no ping: the kernel
// reports a peer process that is gone, so PingInterval is not used.
package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/contract/transportkit"
	"github.com/tether-agent/tether/wire"
)

// Version is the version of this transport, reported by Start.
const Version = "0.1.0-example"

const (
	// Path is the path every connection is reported with.
	Path = "/api/ws"
	// maxHandshake bounds the handshake line.
	maxHandshake = 8 << 10
)

// DefaultPath is the socket path used when StartRequest.Listen does not
// start with "unix:": tether-UID.sock in os.TempDir().
func DefaultPath() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("tether-%d.sock", os.Getuid()))
}

// New returns an unstarted Unix socket transport that logs to log.
func New(log zerolog.Logger) *transportkit.Stream {
	return transportkit.NewStream(transportkit.StreamConfig{
		Protocol: lines{log: log},
		Version:  Version,
		Log:      log,
	})
}

// lines is the wire format: a handshake line, then one message per line.
type lines struct{ log zerolog.Logger }

var _ transportkit.Protocol = lines{}

// Listen listens on the socket of req.Listen (see the package doc).
func (lines) Listen(_ context.Context, req contract.StartRequest) (net.Listener, string, error) {
	path, ok := strings.CutPrefix(req.Listen, "unix:")
	if !ok {
		path = DefaultPath()
	}
	if path == "" {
		return nil, "", fmt.Errorf("empty socket path: %w", contract.ErrInvalidArgument)
	}
	if err := removeStale(path); err != nil {
		return nil, "", err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, "", err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, "", err
	}
	return ln, "unix:" + path, nil // Close removes the file
}

// removeStale removes a socket file at path that nobody answers on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	if nc, err := net.DialTimeout("unix", path, time.Second); err == nil {
		nc.Close()
		return fmt.Errorf("%s is in use by another process", path)
	}
	return os.Remove(path)
}

// Open reads the handshake line "TETHER <query>".
func (lines) Open(_ net.Conn, r *bufio.Reader) (contract.Event, error) {
	line, err := readLine(r, maxHandshake)
	if err != nil {
		return contract.Event{}, err
	}
	rest, ok := bytes.CutPrefix(line, []byte("TETHER"))
	if !ok || len(rest) > 0 && rest[0] != ' ' {
		return contract.Event{}, &transportkit.CloseError{Code: wire.CloseProtocolError, Reason: `want "TETHER <query>"`}
	}
	return contract.Event{Path: Path, Query: string(bytes.TrimSpace(rest)), Remote: "unix"}, nil
}

// ReadMessage reads a line: a message, or the peer's close line.
func (lines) ReadMessage(r *bufio.Reader, max int64) (transportkit.Message, error) {
	line, err := readLine(r, max)
	switch {
	case errors.Is(err, errTooBig):
		return transportkit.Message{}, &transportkit.CloseError{Code: wire.CloseTooBig, Reason: "message too big"}
	case err != nil:
		return transportkit.Message{}, err
	}
	if code, reason, ok := parseCloseLine(line); ok {
		return transportkit.Message{}, &transportkit.CloseError{Code: code, Reason: reason, Peer: true}
	}
	if !utf8.Valid(line) {
		return transportkit.Message{}, &transportkit.CloseError{Code: wire.CloseInvalidPayload, Reason: "invalid UTF-8"}
	}
	return transportkit.Message{Data: line}, nil
}

// AppendMessage appends m as a line; binary and multi-line messages
// cannot be carried (1003).
func (l lines) AppendMessage(b []byte, m transportkit.Message) ([]byte, error) {
	if m.Binary || bytes.IndexByte(m.Data, '\n') >= 0 {
		l.log.Warn().Bool("binary", m.Binary).Msg("message cannot be sent as one line")
		return nil, &transportkit.CloseError{Code: 1003, Reason: "message cannot be sent as one line"}
	}
	return append(append(b, m.Data...), '\n'), nil
}

// AppendClose appends a close line.
func (lines) AppendClose(b []byte, code int, reason string) []byte {
	p, _ := json.Marshal(closeMsg{Close: &code, Reason: reason})
	return append(append(b, p...), '\n')
}

// errTooBig: a line longer than the limit.
var errTooBig = errors.New("line too long")

// readLine reads one line of at most max bytes, without its "\n" or
// "\r\n". A last line without "\n" is io.ErrUnexpectedEOF.
func readLine(br *bufio.Reader, max int64) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if int64(len(line)+len(frag)) > max+2 {
			return nil, errTooBig
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			line = bytes.TrimSuffix(line[:len(line)-1], []byte{'\r'})
			if int64(len(line)) > max {
				return nil, errTooBig
			}
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}

// closeMsg is a close line.
type closeMsg struct {
	Close  *int   `json:"close"`
	Reason string `json:"reason"`
}

// parseCloseLine reports whether line is a close line, and its code.
func parseCloseLine(line []byte) (int, string, bool) {
	if !bytes.HasPrefix(line, []byte(`{"close":`)) {
		return 0, "", false
	}
	var m closeMsg
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil || m.Close == nil || dec.More() {
		return 0, "", false
	}
	return *m.Close, m.Reason, true
}
