package ptyroute

import (
	"context"
	"sync"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/wire"
)

// Remote places the PTYs of a cluster: a PTY stays on the host that got
// its attach token's first attach, and a socket on any other host reaches
// it through a leg relayed to that host, which serves it like a socket of
// its own (offsets, replay, 4409 and 4410 included).
type Remote interface {
	// Locate claims token for this host when no live host holds it (a
	// first attach) and returns host "" then; else it returns the host
	// holding it and its process instance.
	Locate(ctx context.Context, token string) (host, inst string, err error)
	// Dial opens a leg to /api/pty on host with query; what that host's
	// endpoint sends the leg's connection arrives at onCommand in order.
	// who is the identity of the socket the leg carries, which that host
	// applies; query carries no credential.
	Dial(ctx context.Context, host, inst, query string, who access.Identity, onCommand func(contract.Command)) (Leg, error)
}

// Leg is a socket's leg to the host of its PTY.
type Leg interface {
	Send(data []byte, binary bool) error
	Close()
}

// SetRemote makes the router a cluster host's (see Remote).
func (r *Router) SetRemote(rem Remote) {
	r.mu.Lock()
	r.remote = rem
	r.mu.Unlock()
}

// locateTimeout bounds finding (or claiming) a PTY's host and reaching it.
const locateTimeout = 5 * time.Second

// clusterConn is an /api/pty socket of a cluster host while its PTY is
// being located, then the socket of a PTY of this host or a relay to the
// PTY's host. The transport reads no frame before the socket is admitted,
// and it is admitted only once it knows which.
type clusterConn struct {
	mu     sync.Mutex
	del    link.Conn
	closed bool
}

// OnFrame implements link.Conn.
func (c *clusterConn) OnFrame(data []byte, binary bool) {
	c.mu.Lock()
	del := c.del
	c.mu.Unlock()
	if del != nil {
		del.OnFrame(data, binary)
	}
}

// OnClosed implements link.Conn.
func (c *clusterConn) OnClosed() {
	c.mu.Lock()
	c.closed = true
	del := c.del
	c.mu.Unlock()
	if del != nil {
		del.OnClosed()
	}
}

// become makes del the socket's connection; false if it closed first.
func (c *clusterConn) become(del link.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.del = del
	return true
}

// legConn relays a socket to the host of its PTY.
type legConn struct{ leg Leg }

func (l legConn) OnFrame(data []byte, binary bool) { _ = l.leg.Send(data, binary) }
func (l legConn) OnClosed()                        { l.leg.Close() }

// openClustered opens a socket on a cluster host: it locates the PTY
// (claiming the token for this host on a first attach), then serves the
// socket here or relays it. A PTY's host that cannot be reached closes
// the socket with 1013 (try again). create is Router.authorize's: a
// socket served here is refused a PTY that exists (and granted one it
// makes) as on a single host; a relayed one, by the PTY's host.
func (r *Router) openClustered(rem Remote, id contract.TransportID, who access.Identity, create bool, q PTYQuery, out link.FlowSender) link.Conn {
	cc := &clusterConn{}
	r.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), locateTimeout)
		defer cancel()
		host, inst, err := rem.Locate(ctx, q.Attach)
		if err != nil {
			r.log.Warn().Err(err).Msg("locating a PTY in the cluster")
			out.Send(contract.Command{Kind: contract.CommandClose, Conn: id.Conn, Code: wire.CloseTryAgainLater, Reason: "pty host unreachable; retry"})
			return
		}
		if host == "" {
			c := r.newConn(id, q, out)
			c.who = who
			c.create = create
			if cc.become(c) {
				c.start()
			}
			return
		}
		leg, err := rem.Dial(ctx, host, inst, q.Encode(), who, func(cmd contract.Command) {
			if cmd.Kind == contract.CommandAdmit {
				return
			}
			cmd.Conn = id.Conn
			out.Send(cmd)
		})
		if err != nil {
			r.log.Warn().Err(err).Str("host", host).Msg("reaching a PTY's host")
			out.Send(contract.Command{Kind: contract.CommandClose, Conn: id.Conn, Code: wire.CloseTryAgainLater, Reason: "pty host unreachable; retry"})
			return
		}
		if !cc.become(legConn{leg}) {
			leg.Close()
			return
		}
		out.Send(contract.Command{Kind: contract.CommandAdmit, Conn: id.Conn})
	})
	return cc
}
