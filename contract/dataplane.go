package contract

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tether-agent/tether/contract/proto/tetherv1"
)

// DataPlaneProtocol is the framing of a transport link's data plane: a
// connected Unix stream socket between host and plugin that carries the
// link's batches instead of the gRPC Link stream (docs/PLUGINS.md, "The
// data plane"). Each frame is a 4-byte big-endian length and that many
// bytes of one protobuf message: a tether.v1.CommandBatch from the host,
// a tether.v1.EventBatch from the plugin. A length of 0xFFFFFFFF, with
// nothing after it, is the plugin's last frame: its link has ended and
// every event before it was sent. gRPC stays for everything else (Start,
// Stop, Stats), and the Link stream is still opened: it carries nothing,
// and its end is the link's end.
//
// The host offers it in StartRequest.DataPlane ("fd:N", a socket the
// plugin inherited as file descriptor N); a plugin served by
// ServeTransport answers DataPlaneProtocol in StartResponse.DataPlane and
// uses it, with nothing for the plugin's author to do. A plugin in
// another language that ignores the offer answers nothing, and its link
// runs over gRPC as before.
const DataPlaneProtocol = "tether-frames/1"

// endOfLink is the length field of the data plane's last frame.
const endOfLink = 0xFFFFFFFF

// frameReadBuffer is the size of a data plane reader's buffer.
const frameReadBuffer = 256 << 10

// frameWriter writes a data plane's frames, one whole frame per Write,
// from any goroutine.
type frameWriter struct {
	mu   sync.Mutex // guards the fields below and serialises writes
	conn net.Conn
	buf  []byte
}

// write sends m as one frame.
func (w *frameWriter) write(m proto.Message) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, err := proto.MarshalOptions{}.MarshalAppend(append(w.buf[:0], 0, 0, 0, 0), m)
	if err != nil {
		return fmt.Errorf("data plane: encoding a frame: %w", err)
	}
	n := len(b) - 4
	if n > MaxMessageSize {
		return fmt.Errorf("data plane: a frame of %d bytes is over %d: %w", n, MaxMessageSize, ErrInvalidArgument)
	}
	binary.BigEndian.PutUint32(b, uint32(n))
	_, err = w.conn.Write(b)
	if cap(b) <= 1<<20 {
		w.buf = b // keep a buffer for the next frame, not a huge one
	}
	if err != nil {
		return fmt.Errorf("data plane: %w", err)
	}
	return nil
}

// end sends the last frame.
func (w *frameWriter) end() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], endOfLink)
	if _, err := w.conn.Write(b[:]); err != nil {
		return fmt.Errorf("data plane: %w", err)
	}
	return nil
}

// frameReader reads a data plane's frames; one goroutine at a time.
type frameReader struct {
	r   *bufio.Reader
	buf []byte
}

func newFrameReader(c net.Conn) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(c, frameReadBuffer)}
}

// errEndOfLink is what next returns for the last frame.
var errEndOfLink = errors.New("data plane: end of link")

// next reads the next frame into m (which it resets). It returns
// errEndOfLink for the last frame, io.EOF when the peer closed between
// frames, and any other error for a broken or malformed stream.
func (r *frameReader) next(m proto.Message) error {
	var head [4]byte
	if _, err := io.ReadFull(r.r, head[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n == endOfLink {
		return errEndOfLink
	}
	if n > MaxMessageSize {
		return fmt.Errorf("data plane: a frame of %d bytes is over %d: %w", n, MaxMessageSize, ErrInvalidArgument)
	}
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	b := r.buf[:n]
	if _, err := io.ReadFull(r.r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("data plane: %w", err)
	}
	// Unmarshal copies bytes fields, so the buffer is reused and the
	// messages' Data are their own.
	if err := proto.Unmarshal(b, m); err != nil {
		return fmt.Errorf("data plane: a malformed frame: %w: %w", err, ErrInvalidArgument)
	}
	if cap(r.buf) > 1<<20 {
		r.buf = nil // do not keep a huge frame's buffer
	}
	return nil
}

// openInheritedConn opens a data plane offer "fd:N" on the plugin's side:
// the socket inherited as file descriptor N.
func openInheritedConn(name string) (net.Conn, error) {
	s, ok := strings.CutPrefix(name, "fd:")
	if !ok {
		return nil, fmt.Errorf("data plane %q: not fd:N: %w", name, ErrInvalidArgument)
	}
	fd, err := strconv.Atoi(s)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("data plane %q: not an inherited descriptor: %w", name, ErrInvalidArgument)
	}
	f := os.NewFile(uintptr(fd), "tether-data-plane")
	if f == nil {
		return nil, fmt.Errorf("data plane %q: no such descriptor: %w", name, ErrInvalidArgument)
	}
	defer f.Close() // FileConn holds a duplicate
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("data plane %q: %w", name, err)
	}
	if _, ok := c.(*net.UnixConn); !ok {
		c.Close()
		return nil, fmt.Errorf("data plane %q: not a Unix socket: %w", name, ErrInvalidArgument)
	}
	return c, nil
}

// linkData is Link on the data plane: events are read from conn; the
// gRPC stream, which carries nothing, says how the plugin's link ended.
func (c *TransportGRPCClient) linkData(ctx context.Context, stream tetherv1.Transport_LinkClient, conn net.Conn, sink EventSink) error {
	defer conn.Close() // one link per data plane: Exec after it is ErrStopped
	streamEnd := make(chan error, 1)
	go func() {
		// Recv returns when the plugin's handler has returned (after its
		// last frame) or the stream broke; ctx's cancel ends it too.
		_, err := stream.Recv()
		if err == nil {
			err = fmt.Errorf("data plane: a batch on the Link stream: %w", ErrInvalidArgument)
		}
		streamEnd <- err
	}()
	// Reading stops when ctx is done (deadline in the past); a plugin
	// that exits closes its end, so the read sees EOF.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(aLongTimeAgo) })
	defer stop()

	rd := newFrameReader(conn)
	var events []Event
	for {
		batch := &tetherv1.EventBatch{}
		err := rd.next(batch)
		switch {
		case errors.Is(err, errEndOfLink):
			// The plugin's link ended; the stream's status is its error.
			select {
			case serr := <-streamEnd:
				if errors.Is(serr, io.EOF) {
					return nil
				}
				return FromGRPC(serr)
			case <-ctx.Done():
				return ctx.Err()
			}
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("transport link: the data plane ended without its last frame (the plugin exited?): %w: %w", ErrUnavailable, err)
		}
		events = events[:0]
		for _, e := range batch.GetEvents() {
			events = append(events, eventFromProto(e))
		}
		if err := sink(ctx, events); err != nil {
			return err
		}
	}
}

// aLongTimeAgo is a deadline in the past: it makes a blocked read return.
var aLongTimeAgo = time.Unix(1, 0)

// linkData is the plugin's Link on the data plane: events from Impl.Link
// are written to conn, commands read from it go to exec; the gRPC stream
// stays open, carrying nothing, until the link ends. The last frame
// follows every event, and the handler's status (returned next) says how
// the link ended.
func (s *TransportGRPCServer) linkData(ctx context.Context, cancel context.CancelFunc, conn net.Conn, exec func(context.Context, []Command) error) error {
	defer conn.Close()
	rd := newFrameReader(conn)
	recv := func() (*tetherv1.CommandBatch, error) {
		batch := &tetherv1.CommandBatch{}
		err := rd.next(batch)
		if errors.Is(err, net.ErrClosed) {
			err = io.EOF // the link ended here
		}
		return batch, err
	}
	w := &frameWriter{conn: conn}
	err := s.runLink(ctx, cancel, exec, recv, func(b *tetherv1.EventBatch) error { return w.write(b) })
	_ = w.end()
	return ToGRPC(err)
}
