package acpgw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/coder/acp-go-sdk"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/ownership"
	"github.com/tether-agent/tether/wire"
)

// Remote reaches the /acp endpoints of the other hosts of a cluster. A
// connection whose session/load or session/resume finds the session live
// on another host opens a leg to that host's /acp (one per host and
// connection), initializes it as the client initialized this one, and
// from then on passes every message that names that session to the leg
// as the client sent it; what the leg sends comes back to the client as
// it is (the far host's requests to the client under ids of their own),
// so the session stays one, driven where it lives, with no 5000.
type Remote interface {
	// Dial opens a leg to the /acp endpoint of host (process inst).
	// What that endpoint sends the leg's connection arrives at onCommand
	// in order; it must not block. who is the identity of the connection
	// the leg carries, which that host applies.
	Dial(ctx context.Context, host, inst string, who access.Identity, onCommand func(contract.Command)) (RemoteLeg, error)
}

// RemoteLeg is a connection's leg to another host.
type RemoteLeg interface {
	Send(data []byte, binary bool) error
	Close()
}

// SetRemote makes the gateway a cluster host's (see Remote). Call it
// before the gateway has a connection.
func (g *Gateway) SetRemote(r Remote) { g.remote = r }

// legDialTimeout bounds opening a leg to another host.
const legDialTimeout = 2 * time.Second

// legInitID is the id of the initialize a leg is opened with; its answer
// is the leg's own and never reaches the client.
const legInitID = `"tether/relay-init"`

// leg is a connection's leg to one host.
type leg struct {
	host string
	n    int // numbers the ids of the far host's requests (legAsk)
	l    RemoteLeg
}

// legAsk is a request the far host sent the client through a leg: the
// client answers it under the id the connection gave it, which goes back
// to the leg as the far host's own.
type legAsk struct {
	leg *leg
	id  json.RawMessage
}

// remoteState is what a connection of a cluster host keeps to relay;
// guarded by conn.mu.
type remoteState struct {
	init     json.RawMessage            // the client's initialize params
	binds    map[string]json.RawMessage // per session key, the latest session/load or session/resume line
	legs     map[string]*leg            // by host
	relays   map[string]*leg            // by session key
	suppress map[string]bool            // ids whose answer from this host's handler is dropped: the leg answers
	asks     map[string]legAsk          // by the compact id the client sees
	nlegs    int
}

// fromClient routes a client message of a cluster host's connection
// before the protocol reader sees it, and reports whether it was relayed:
// a message naming a relayed session, or an answer to a request a leg
// sent, goes to its leg; an initialize and a load or resume are noted
// (a leg is initialized alike, a relayed bind sends the line as it came).
func (c *conn) fromClient(data []byte, method string, id json.RawMessage) bool {
	var m struct {
		Params json.RawMessage `json:"params"`
	}
	if method == "" {
		c.mu.Lock()
		a, ok := c.rs.asks[compactID(id)]
		if ok {
			delete(c.rs.asks, compactID(id))
		}
		c.mu.Unlock()
		if !ok {
			return false
		}
		return c.toLeg(a.leg, withID(data, a.id))
	}
	if json.Unmarshal(data, &m) != nil {
		return false
	}
	if method == "initialize" {
		c.mu.Lock()
		c.rs.init = m.Params
		c.mu.Unlock()
		return false
	}
	var p struct {
		SessionID string `json:"sessionId"`
	}
	if json.Unmarshal(m.Params, &p) != nil || p.SessionID == "" {
		return false
	}
	c.mu.Lock()
	l := c.rs.relays[p.SessionID]
	if l == nil && (method == "session/load" || method == "session/resume") {
		if c.rs.binds == nil {
			c.rs.binds = make(map[string]json.RawMessage)
		}
		c.rs.binds[p.SessionID] = data
	}
	c.mu.Unlock()
	if l == nil {
		return false
	}
	return c.toLeg(l, data)
}

// toLeg sends data to l; a leg that cannot take it is ended (and with it
// the client's connection, which then loads its sessions again).
func (c *conn) toLeg(l *leg, data []byte) bool {
	if err := l.l.Send(data, false); err != nil {
		c.log.Debug().Err(err).Str("host", l.host).Msg("acp leg lost")
		c.legEnded(l, wire.CloseGoingAway, "the host of a session went away")
	}
	c.g.cfg.Metrics.FramesOut.Inc() // relayed on the client's behalf
	return true
}

// heldBy returns the other host holding the session a bind failed on, or
// nil on a host that relays nothing.
func (c *conn) heldBy(err error) *ownership.HeldError {
	var held *ownership.HeldError
	if c.g.remote == nil || !errors.As(err, &held) {
		return nil
	}
	return held
}

// relayBind relays the client's session/load or session/resume of key,
// which another live host holds, to that host: the leg's answer (and the
// replay before it) reaches the client, and this handler's own answer is
// dropped. An error (5002) when the host cannot be reached.
func (c *conn) relayBind(key string, held *ownership.HeldError) error {
	c.mu.Lock()
	line := c.rs.binds[key]
	delete(c.rs.binds, key)
	l := c.rs.legs[held.Host]
	init := c.rs.init
	c.mu.Unlock()
	var id struct {
		ID json.RawMessage `json:"id"`
	}
	if line == nil || json.Unmarshal(line, &id) != nil || len(id.ID) == 0 {
		return &acp.RequestError{Code: wire.CodeOwnerUnreachable, Message: "owner unreachable; retry: session live on host " + held.Host}
	}
	if l == nil {
		var err error
		if l, err = c.dialLeg(held, init); err != nil {
			return &acp.RequestError{Code: wire.CodeOwnerUnreachable, Message: fmt.Sprintf("owner unreachable; retry: session live on host %s: %v", held.Host, err)}
		}
	}
	c.mu.Lock()
	if c.rs.suppress == nil {
		c.rs.suppress = make(map[string]bool)
	}
	if c.rs.relays == nil {
		c.rs.relays = make(map[string]*leg)
	}
	c.rs.suppress[compactID(id.ID)] = true
	c.rs.relays[key] = l
	c.mu.Unlock()
	c.toLeg(l, line)
	return nil
}

// dialLeg opens a leg to the host of held and initializes it with the
// client's initialize params.
func (c *conn) dialLeg(held *ownership.HeldError, init json.RawMessage) (*leg, error) {
	c.mu.Lock()
	c.rs.nlegs++
	l := &leg{host: held.Host, n: c.rs.nlegs}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(c.g.ctx, legDialTimeout)
	defer cancel()
	rl, err := c.g.remote.Dial(ctx, held.Host, held.Instance, c.who, func(cmd contract.Command) { c.fromLeg(l, cmd) })
	if err != nil {
		return nil, err
	}
	l.l = rl
	if len(init) == 0 {
		init = json.RawMessage(`{"protocolVersion":1}`)
	}
	msg := []byte(`{"jsonrpc":"2.0","id":` + legInitID + `,"method":"initialize","params":` + string(init) + `}`)
	if err := rl.Send(msg, false); err != nil {
		rl.Close()
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		rl.Close()
		return nil, errors.New("connection closed")
	}
	if c.rs.legs == nil {
		c.rs.legs = make(map[string]*leg)
	}
	c.rs.legs[held.Host] = l
	return l, nil
}

// fromLeg takes what the far host sent the leg's connection: the answer
// to the leg's initialize is dropped, the far host's requests go to the
// client under ids of this connection's (legAsk), everything else as it
// came; a close ends the leg and closes the client's connection the same
// way, so that it loads its sessions again (here, once the session is
// handed back).
func (c *conn) fromLeg(l *leg, cmd contract.Command) {
	switch cmd.Kind {
	case contract.CommandSend:
		var probe struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(cmd.Data, &probe) != nil {
			return
		}
		data := cmd.Data
		switch {
		case probe.Method == "" && compactID(probe.ID) == legInitID:
			return
		case probe.Method == cancelRequestMethod:
			data = withCancelledID(data, l)
		case probe.Method != "" && len(probe.ID) > 0 && string(probe.ID) != "null":
			mine := l.clientID(probe.ID)
			c.mu.Lock()
			if c.rs.asks == nil {
				c.rs.asks = make(map[string]legAsk)
			}
			c.rs.asks[string(mine)] = legAsk{leg: l, id: probe.ID}
			c.mu.Unlock()
			data = withID(data, mine)
		}
		c.sendFrame(data)
	case contract.CommandClose:
		code, reason := cmd.Code, cmd.Reason
		if code == 0 || code == wire.CloseNormal {
			code, reason = wire.CloseGoingAway, "the host of a session went away"
		}
		c.legEnded(l, code, reason)
	}
}

// cancelRequestMethod withdraws a request (the ACP library's
// $/cancel_request notification, params {"requestId": ID}).
const cancelRequestMethod = "$/cancel_request"

// clientID is the id the client sees for the far host's request id.
func (l *leg) clientID(id json.RawMessage) json.RawMessage {
	mine, _ := json.Marshal(fmt.Sprintf("relay%d:%s", l.n, compactID(id)))
	return mine
}

// withCancelledID rewrites a $/cancel_request from l to name the id the
// client saw.
func withCancelledID(data []byte, l *leg) []byte {
	var m map[string]json.RawMessage
	var params map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil || json.Unmarshal(m["params"], &params) != nil || len(params["requestId"]) == 0 {
		return data
	}
	params["requestId"] = l.clientID(params["requestId"])
	m["params"], _ = json.Marshal(params)
	b, err := json.Marshal(m)
	if err != nil {
		return data
	}
	return b
}

// legEnded forgets l and closes the client's connection with code.
func (c *conn) legEnded(l *leg, code int, reason string) {
	c.mu.Lock()
	if c.rs.legs[l.host] != l {
		c.mu.Unlock()
		return
	}
	delete(c.rs.legs, l.host)
	for k, r := range c.rs.relays {
		if r == l {
			delete(c.rs.relays, k)
		}
	}
	c.mu.Unlock()
	l.l.Close()
	c.closeWith(code, reason)
}

// closeLegs ends every leg of a connection that has ended.
func (c *conn) closeLegs() {
	c.mu.Lock()
	legs := c.rs.legs
	c.rs.legs, c.rs.relays = nil, nil
	c.mu.Unlock()
	for _, l := range legs {
		l.l.Close()
	}
}

// dropAnswer reports whether a response this host's protocol writer
// wrote answers a request a leg answers instead (relayBind).
func (c *conn) dropAnswer(id json.RawMessage) bool {
	k := compactID(id)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.rs.suppress[k] {
		return false
	}
	delete(c.rs.suppress, k)
	return true
}

// withID returns the JSON-RPC message data with its id replaced.
func withID(data []byte, id json.RawMessage) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return data
	}
	m["id"] = id
	b, err := json.Marshal(m)
	if err != nil {
		return data
	}
	return b
}
