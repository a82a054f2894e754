package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/ownership"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/wire"
)

// Remote reaches the live sessions of the other hosts of a cluster. A
// connection whose resume finds the session live on another host opens a
// leg to that host (one per host and connection) and relays to it every
// request that names that session; the other host serves the leg like a
// connection of its own, so the session stays one, with one runtime id,
// and its events reach the client through the leg.
type Remote interface {
	// Dial opens a leg to the /api/ws endpoint of host (process inst).
	// What that endpoint sends the leg's connection arrives at onCommand
	// in order (sends, then at most one close); it must not block.
	// who is the identity of the connection the leg carries, which that
	// host applies.
	Dial(ctx context.Context, host, inst string, who access.Identity, onCommand func(contract.Command)) (RemoteLeg, error)
	// Active lists the live sessions of every other live host.
	Active(ctx context.Context) []session.ActiveEntry
	// Hosts lists the cluster's hosts (cluster.hosts).
	Hosts() []wire.ClusterHost
}

// RemoteLeg is a connection's leg to another host.
type RemoteLeg interface {
	Send(data []byte, binary bool) error
	Close()
}

// dialTimeout bounds opening a leg to another host.
const dialTimeout = 2 * time.Second

// leg is a connection's leg to one host: the requests it relayed whose
// answer names a session to relay from then on.
type leg struct {
	host    string
	l       RemoteLeg
	pending map[string]bool // ids of relayed binds, as JSON text
}

// SetRemote makes the gateway a cluster host's: a resume of a session
// live on another host is relayed there (see Remote). Call it before the
// gateway has a connection.
func (g *Gateway) SetRemote(r Remote) { g.remote = r }

// relayed returns the leg the requests naming session sid go to, or nil
// for a session of this host.
func (c *conn) relayed(sid string) *leg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.remote[sid]
}

// relayBind relays a bind request (cl) that found its session held by
// another live host to that host, whose answer reaches the client
// through the leg. 5002 when the host cannot be reached.
func (c *conn) relayBind(cl call, held *ownership.HeldError) error {
	c.mu.Lock()
	l := c.legs[held.Host]
	c.mu.Unlock()
	if l == nil {
		l = &leg{host: held.Host, pending: make(map[string]bool)}
		ctx, cancel := context.WithTimeout(c.gw.ctx, dialTimeout)
		rl, err := c.gw.remote.Dial(ctx, held.Host, held.Instance, c.who, func(cmd contract.Command) { c.fromLeg(l, cmd) })
		cancel()
		if err != nil {
			return errorf(wire.CodeOwnerUnreachable, "owner unreachable; retry: session live on host %s: %v", held.Host, err)
		}
		l.l = rl
		c.mu.Lock()
		if c.closed || c.legs[held.Host] != nil {
			other := c.legs[held.Host]
			c.mu.Unlock()
			rl.Close()
			if other == nil {
				return errReplied // the connection closed meanwhile
			}
			l = other
		} else {
			c.legs[held.Host] = l
			c.mu.Unlock()
		}
	}
	c.mu.Lock()
	l.pending[string(cl.id)] = true
	c.mu.Unlock()
	if err := l.l.Send(cl.raw, false); err != nil {
		return errorf(wire.CodeOwnerUnreachable, "owner unreachable; retry: %v", err)
	}
	c.gw.metrics.FramesOut.Inc() // relayed on the client's behalf
	return errReplied
}

// heldBy returns the other host holding the session a bind failed on, or
// nil.
func (c *conn) heldBy(err error) *ownership.HeldError {
	var held *ownership.HeldError
	if c.gw.remote == nil || !errors.As(err, &held) {
		return nil
	}
	return held
}

// fromLeg takes what the far host sent the leg's connection: frames go to
// the client as they are (a relayed bind's answer first teaches the
// connection which session to relay); a close ends the leg and closes
// the client's socket the same way, so that it resumes (on this host
// once the session is handed back).
func (c *conn) fromLeg(l *leg, cmd contract.Command) {
	switch cmd.Kind {
	case contract.CommandSend:
		c.mu.Lock()
		if len(l.pending) > 0 {
			var resp struct {
				ID     json.RawMessage `json:"id"`
				Result struct {
					SessionID string `json:"session_id"`
				} `json:"result"`
			}
			if json.Unmarshal(cmd.Data, &resp) == nil && len(resp.ID) > 0 && l.pending[string(resp.ID)] {
				delete(l.pending, string(resp.ID))
				if resp.Result.SessionID != "" && !c.closed {
					c.remote[resp.Result.SessionID] = l
				}
			}
		}
		c.mu.Unlock()
		c.Send(cmd.Data)
	case contract.CommandClose:
		c.mu.Lock()
		if c.legs[l.host] == l {
			delete(c.legs, l.host)
		}
		for sid, r := range c.remote {
			if r == l {
				delete(c.remote, sid)
			}
		}
		closed := c.closed
		c.mu.Unlock()
		if !closed {
			code, reason := cmd.Code, cmd.Reason
			if code == 0 {
				code, reason = wire.CloseGoingAway, "owner host gone; resume"
			}
			c.out.Send(contract.Command{Kind: contract.CommandClose, Conn: c.id.Conn, Code: code, Reason: reason})
		}
	}
}

// closeLegs ends every leg of a closing connection.
func (c *conn) closeLegs() {
	c.mu.Lock()
	legs := c.legs
	c.legs, c.remote = nil, nil
	c.mu.Unlock()
	for _, l := range legs {
		l.l.Close()
	}
}

// relaysMethod reports whether a request of method name that names a
// session of another host goes to that host.
func relaysMethod(name string) bool {
	switch name {
	case wire.MethodCreate, wire.MethodList, wire.MethodActiveList, wire.MethodResume:
		return false
	}
	return true
}
