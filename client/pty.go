package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"

	"github.com/tether-agent/tether/wire"
)

// maxPTYText bounds a text frame on /api/pty (the pty.replay header).
const maxPTYText = 64 << 10

// PTYOptions configure AttachPTY.
type PTYOptions struct {
	Options
	// HasCursor, Offset and Epoch are the client's cursor: it shows the
	// PTY's output of Epoch up to Offset and wants what follows. Without
	// one the host sends its whole ring, or a screen snapshot.
	HasCursor bool
	Offset    int64
	Epoch     string
	// View attaches read-only: the host drops input and resizes, and a
	// token with no live PTY is closed with wire.CloseNoSuchTerminal.
	View bool
	// Cols and Rows, both set, are the size of the writer's terminal:
	// the host resizes the PTY to it (a new one starts at it) before it
	// decides the replay, so that a screen snapshot is drawn for this
	// terminal. A host drops a size over its largest (--pty-max-size),
	// and one that predates the parameters ignores it: send the size
	// with Resize once attached as well. Ignored with View.
	Cols, Rows int
	// ReadTimeout, when positive, ends the connection when no frame (pong
	// included) has arrived for that long; send a Ping more often.
	ReadTimeout time.Duration
	// OnText, when set, is called from Read with each text frame after
	// pty.replay (the protocol defines none); nil ignores them.
	OnText func(frame []byte)
}

// PTY is one attachment to a PTY (GET /api/pty). It reads on the
// caller's goroutine, like a net.Conn: Read from one goroutine at a time;
// Write, Resize, Ping and Close from any.
//
// It keeps the cursor: Offset is the PTY offset just after the last byte
// Read returned, so a client that shows everything it reads and
// reattaches with Reattach sees every byte once, as long as it is back
// before the host's ring wraps. Bytes of a screen snapshot (Replay says
// how many) come first and do not move the offset; a Read never returns
// snapshot and live bytes together.
type PTY struct {
	ws          *wsConn
	replay      wire.Replay
	url         *url.URL // as dialed
	opts        PTYOptions
	readTimeout time.Duration
	closeWait   time.Duration
	onText      func([]byte)
	offset      atomic.Int64
	size        atomic.Int64  // the size last sent, cols<<32 | rows (0: none); Reattach sends it
	closing     atomic.Int64  // UnixNano read deadline set by Close; 0 before
	ended       chan struct{} // closed when the read side has ended
	endOnce     sync.Once
	closeOnce   sync.Once

	rmu      sync.Mutex // held by Read (or Close's drain); guards the fields below
	inFrame  bool       // a binary frame's payload is being read
	snapLeft int64      // snapshot bytes still to come
	err      error      // why reading ended; sticky
}

// AttachPTY attaches to the PTY of attachToken at the host at baseURL
// (as for Dial; "" attaches a PTY of the socket's own, ended with it) and
// returns once the pty.replay header has arrived. A host that refuses
// closes at once: AttachPTY then returns a *CloseError with the code
// (wire.CloseUnauthorized, wire.CloseNoSuchTerminal, wire.CloseInternalError
// when every PTY is attached, …).
func AttachPTY(ctx context.Context, baseURL, attachToken string, o PTYOptions) (*PTY, error) {
	if attachToken != "" && !wire.ValidAttachToken(attachToken) {
		return nil, ErrInvalidAttachToken
	}
	base, token, err := Endpoint(baseURL, "")
	if err != nil {
		return nil, err
	}
	if o.Token == "" {
		o.Token = token
	}
	q := wire.PTYQuery{Attach: attachToken, HasCursor: o.HasCursor, Offset: o.Offset, Epoch: o.Epoch, View: o.View}
	if !o.View && validSize(o.Cols, o.Rows) {
		q.Cols, q.Rows = o.Cols, o.Rows
	}
	return attach(ctx, wire.PTYURL(base, q), o)
}

// AttachURL is AttachPTY for a PTY endpoint URL used exactly as given,
// path and query included (see Endpoint and wire.PTYURL to build one, or
// DialURL): the attach token, view flag, cursor and size are the URL's
// own, and o's are ignored.
func AttachURL(ctx context.Context, endpoint string, o PTYOptions) (*PTY, error) {
	u, err := wsURL(endpoint)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	o.HasCursor, o.Offset, o.Epoch = false, 0, q.Get("epoch")
	if n, err := strconv.ParseInt(q.Get("offset"), 10, 64); err == nil && q.Has("offset") {
		o.HasCursor, o.Offset = true, n
	}
	o.View = q.Get("view") == "1"
	o.Cols, o.Rows = 0, 0
	if c, r, ok := wire.ParseSize(q.Get("cols"), q.Get("rows")); ok && !o.View {
		o.Cols, o.Rows = c, r
	}
	return attach(ctx, u, o)
}

// validSize reports whether cols×rows is a size a resize can ask for.
func validSize(cols, rows int) bool {
	return cols >= 1 && rows >= 1 && cols <= wire.MaxSize && rows <= wire.MaxSize
}

// packSize packs a size for PTY.size.
func packSize(cols, rows int) int64 { return int64(cols)<<32 | int64(rows) }

func attach(ctx context.Context, u *url.URL, o PTYOptions) (*PTY, error) {
	wc, first, err := dialWS(ctx, u, o.Options, o.readBuffer(32<<10))
	if err != nil {
		return nil, err
	}
	msg, err := wc.readFirst(ctx, first, maxPTYText)
	if err != nil {
		wc.abort()
		return nil, err
	}
	r, err := wire.DecodeReplay(msg)
	if err != nil {
		wc.abort()
		return nil, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	p := &PTY{
		ws:          wc,
		replay:      r,
		url:         u,
		opts:        o,
		readTimeout: max(o.ReadTimeout, 0),
		closeWait:   o.closeWait(),
		onText:      o.OnText,
		ended:       make(chan struct{}),
	}
	if !o.View && validSize(o.Cols, o.Rows) {
		p.size.Store(packSize(o.Cols, o.Rows))
	}
	switch {
	case r.Snapshot:
		p.offset.Store(r.ReplayEndOffset)
		p.snapLeft = r.SnapshotBytes
	case r.Reset:
		p.offset.Store(r.StartOffset)
	case !o.HasCursor || o.Offset < r.StartOffset || o.Offset > r.ReplayEndOffset:
		wc.abort()
		return nil, fmt.Errorf("%w: pty.replay resumes [%d, %d) for a cursor %v at %d",
			ErrProtocol, r.StartOffset, r.ReplayEndOffset, o.HasCursor, o.Offset)
	default:
		p.offset.Store(o.Offset)
	}
	return p, nil
}

// Replay returns the pty.replay header of the attachment.
func (p *PTY) Replay() wire.Replay { return p.replay }

// Epoch returns the PTY's epoch.
func (p *PTY) Epoch() string { return p.replay.Epoch }

// Offset returns the PTY offset after the last byte Read returned.
func (p *PTY) Offset() int64 { return p.offset.Load() }

// Read reads the PTY's output: first the replay (or snapshot), then live
// output. Pings are answered while it reads. When the connection ends
// it returns a *CloseError: wire.CloseProcessExited after the process's
// last byte, wire.CloseSuperseded when another writer took the token,
// wire.CloseAbnormal when the connection was lost (see Retryable).
func (p *PTY) Read(b []byte) (int, error) {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	return p.readLocked(b)
}

func (p *PTY) readLocked(b []byte) (int, error) {
	if p.err != nil {
		return 0, p.err
	}
	if len(b) == 0 {
		return 0, nil
	}
	for {
		if !p.inFrame {
			if dl := p.closing.Load(); dl != 0 {
				_ = p.ws.nc.SetReadDeadline(time.Unix(0, dl))
			} else if p.readTimeout > 0 {
				_ = p.ws.nc.SetReadDeadline(time.Now().Add(p.readTimeout))
			}
			h, err := p.ws.next()
			if err != nil {
				return 0, p.fail(err)
			}
			switch h.OpCode {
			case ws.OpBinary:
				p.inFrame = true
			case ws.OpText:
				msg, err := io.ReadAll(io.LimitReader(&p.ws.rd, maxPTYText+1))
				if err == nil && len(msg) > maxPTYText {
					err = fmt.Errorf("%w: a text frame over %d bytes", ErrProtocol, maxPTYText)
				}
				if err != nil {
					return 0, p.fail(err)
				}
				if p.onText != nil {
					p.onText(msg)
				}
				continue
			default:
				if err := p.ws.rd.Discard(); err != nil {
					return 0, p.fail(err)
				}
				continue
			}
		}
		q := b
		if p.snapLeft > 0 && int64(len(q)) > p.snapLeft {
			q = q[:p.snapLeft]
		}
		n, err := p.ws.rd.Read(q)
		if p.snapLeft > 0 {
			p.snapLeft -= int64(n)
		} else {
			p.offset.Add(int64(n))
		}
		switch {
		case err == io.EOF:
			p.inFrame = false
		case err != nil:
			err = p.fail(err)
			if n > 0 {
				return n, nil // the error comes with the next Read
			}
			return 0, err
		}
		if n > 0 {
			return n, nil
		}
	}
}

// fail ends the read side with err, as a *CloseError (a read timeout
// named as such), and closes the connection.
func (p *PTY) fail(err error) error {
	if p.readTimeout > 0 && p.closing.Load() == 0 {
		var ne interface{ Timeout() bool }
		if errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("nothing from the host for %v: %w", p.readTimeout, err)
		}
	}
	if errors.Is(err, ErrProtocol) {
		p.err = err
	} else {
		p.err = endErr(err)
	}
	_ = p.ws.nc.Close()
	p.endOnce.Do(func() { close(p.ended) })
	return p.err
}

// Write sends p as input (one binary frame). The host writes it to the
// PTY unless the attachment is a view or was superseded.
func (p *PTY) Write(b []byte) (int, error) {
	if err := p.ws.write(context.Background(), ws.OpBinary, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

// WriteText sends p as one text frame: input like Write, unless it starts
// with the resize escape (wire.IsResize), which is never input.
func (p *PTY) WriteText(b []byte) error {
	return p.ws.write(context.Background(), ws.OpText, b)
}

// Resize asks the host to resize the PTY to cols×rows (1–10000 each).
// A Reattach then asks for this size.
func (p *PTY) Resize(cols, rows int) error {
	if !validSize(cols, rows) {
		return fmt.Errorf("resize to %dx%d: %w", cols, rows, ErrInvalidSize)
	}
	if err := p.WriteText(wire.EncodeResize(cols, rows)); err != nil {
		return err
	}
	if !p.opts.View {
		p.size.Store(packSize(cols, rows))
	}
	return nil
}

// Ping sends a ping; the host's pong keeps PTYOptions.ReadTimeout from
// expiring on a quiet PTY.
func (p *PTY) Ping() error {
	return p.ws.write(context.Background(), ws.OpPing, nil)
}

// Close detaches: it sends a close frame with code 1000 and closes the
// connection once the host has answered or Options.CloseWait has passed.
// A Read in progress takes the answer (and returns a *CloseError);
// without one, Close reads and discards until it comes. It is idempotent
// and returns nil.
func (p *PTY) Close() error { return p.CloseWith(wire.CloseNormal, "") }

// CloseWith is Close with another close code and reason.
func (p *PTY) CloseWith(code int, reason string) error {
	p.closeOnce.Do(func() {
		dl := time.Now().Add(p.closeWait)
		p.closing.Store(dl.UnixNano())
		if p.ws.sendClose(code, reason, p.closeWait) {
			if p.rmu.TryLock() {
				// No Read runs: take the host's answer here.
				buf := make([]byte, 32<<10)
				for {
					if _, err := p.readLocked(buf); err != nil {
						break
					}
				}
				p.rmu.Unlock()
			} else {
				_ = p.ws.nc.SetReadDeadline(dl)
				t := time.NewTimer(p.closeWait)
				select {
				case <-p.ended:
				case <-t.C:
				}
				t.Stop()
			}
		}
		_ = p.ws.nc.Close()
	})
	return nil
}

// Abort ends the connection at once, without a close frame (the host
// sees a reset). A Read in progress returns an error.
func (p *PTY) Abort() {
	p.closeOnce.Do(p.ws.abort)
}

// Backoff is how long to wait before reattach attempt n (from 0); ok
// false gives up.
type Backoff func(attempt int) (wait time.Duration, ok bool)

// Reattach attaches again to p's PTY with p's cursor (Epoch, Offset), so
// that the host replays exactly what p's Reads had not returned, if its
// ring still holds it, and with the size last sent (PTYOptions' Cols and
// Rows, or the last Resize). Call it once p's Read has returned an error that
// Retryable accepts; p itself is not used again. Before each attempt it
// waits what backoff says; it retries while the attempt's error is
// Retryable, and returns the last error once backoff gives up, at the
// first error that is not, or when ctx ends. A nil backoff makes one
// attempt at once. A reattach that comes back with Reset (the PTY was
// restarted, or the ring wrapped) starts a new stream: clear the screen.
func (p *PTY) Reattach(ctx context.Context, backoff Backoff) (*PTY, error) {
	u := *p.url
	q := u.Query()
	q.Set("offset", strconv.FormatInt(p.Offset(), 10))
	q.Set("epoch", p.Epoch())
	o := p.opts
	o.HasCursor, o.Offset, o.Epoch = true, p.Offset(), p.Epoch()
	if size := p.size.Load(); size != 0 {
		o.Cols, o.Rows = int(size>>32), int(size&(1<<32-1))
		q.Set("cols", strconv.Itoa(o.Cols))
		q.Set("rows", strconv.Itoa(o.Rows))
	}
	u.RawQuery = q.Encode()

	lastErr := ErrGaveUp
	for attempt := 0; ; attempt++ {
		if backoff == nil {
			if attempt > 0 {
				return nil, lastErr
			}
		} else {
			wait, ok := backoff(attempt)
			if !ok {
				return nil, lastErr
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
		}
		np, err := attach(ctx, &u, o)
		if err == nil {
			return np, nil
		}
		if !Retryable(err) || ctx.Err() != nil {
			return nil, err
		}
		lastErr = err
	}
}
