// Package relay carries connections between the hosts of a cluster on
// NATS subjects (tether.relay.<host>.in and .back): a client's socket on
// one host that needs a session or a PTY another host has gets a leg to
// that host, which serves it through the same endpoint as its own
// sockets (link.RelayTransport).
package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/cluster/owners"
	"github.com/tether-agent/tether/host/internal/link"
)

// Relay carries connections between the hosts of a cluster over NATS
// subjects: a client's connection on host B that needs something only
// host A has (a session A owns) gets a leg to A, and A serves the leg
// like any connection of its own transports, through the same endpoint
// (link.Endpoint) under the transport name link.RelayTransport.
//
// Subjects: tether.relay.<host>.in carries what legs send to host (open,
// frames, close); tether.relay.<host>.back carries what host's legs get
// back (the commands the endpoint sent their connection: admit, send,
// close). One subscription each, so a leg's messages stay in order.
//
// A leg's far end is closed when the host that dialled it is gone from
// the registry, and a leg's near end gets a close (1001) when the host it
// reached is gone, so that no viewer is left bound by a dead host.
type Relay struct {
	nc   *nats.Conn
	reg  *owners.Registry
	self string
	inst string
	log  zerolog.Logger

	endpoints map[string]link.Endpoint
	nextLeg   atomic.Uint64

	mu  sync.Mutex // guards the fields below
	in  map[legKey]*inLeg
	out map[uint64]*Leg

	subs []*nats.Subscription
	stop chan struct{}
	wg   sync.WaitGroup
}

// legKey names a leg served here: the host that dialled it and its id
// there.
type legKey struct {
	from string
	id   uint64
}

// inLeg is a leg served here: the dialling host's instance and the
// endpoint's connection.
type inLeg struct {
	inst string
	conn link.Conn
}

// Relay message headers.
const (
	hdrKind     = "Tether-Kind"
	hdrLeg      = "Tether-Leg"
	hdrFrom     = "Tether-From"
	hdrInstance = "Tether-Instance"
	hdrPath     = "Tether-Path"
	hdrQuery    = "Tether-Query"
	hdrBinary   = "Tether-Binary"
	hdrCode     = "Tether-Code"
	hdrReason   = "Tether-Reason"
	// hdrIdentity carries, on a leg's open, the identity the dialling
	// host verified for the client (JSON of access.Identity): the host
	// serving the leg applies it, as it checked no credential itself.
	hdrIdentity = "Tether-Identity"
)

// relayPending bounds what a relay subscription may hold undelivered:
// past it NATS drops messages for this subscriber (a slow consumer).
const (
	relayPendingMsgs  = 1 << 20
	relayPendingBytes = 512 << 20
)

// ErrUnreachable: the host a leg was dialled to did not answer.
var ErrUnreachable = errors.New("host unreachable")

func inSubject(host string) string   { return "tether.relay." + host + ".in" }
func backSubject(host string) string { return "tether.relay." + host + ".back" }

// New subscribes this host's relay subjects and serves legs dialled
// to it through endpoints (by path). Close stops it.
func New(nc *nats.Conn, reg *owners.Registry, endpoints map[string]link.Endpoint, ttl time.Duration, log zerolog.Logger) (*Relay, error) {
	self, inst := reg.Self()
	r := &Relay{nc: nc, reg: reg, self: self, inst: inst, log: log, endpoints: endpoints,
		in: make(map[legKey]*inLeg), out: make(map[uint64]*Leg), stop: make(chan struct{})}
	for subj, h := range map[string]nats.MsgHandler{inSubject(self): r.onIn, backSubject(self): r.onBack} {
		sub, err := nc.Subscribe(subj, h)
		if err != nil {
			r.unsubscribe()
			return nil, fmt.Errorf("relay: subscribe %s: %w", subj, err)
		}
		if err := sub.SetPendingLimits(relayPendingMsgs, relayPendingBytes); err != nil {
			r.unsubscribe()
			return nil, fmt.Errorf("relay: %w", err)
		}
		r.subs = append(r.subs, sub)
	}
	if err := nc.Flush(); err != nil {
		r.unsubscribe()
		return nil, fmt.Errorf("relay: %w", err)
	}
	r.wg.Add(1)
	go r.sweep(ttl / 3)
	return r, nil
}

func (r *Relay) unsubscribe() {
	for _, s := range r.subs {
		_ = s.Unsubscribe()
	}
	r.subs = nil
}

// onIn serves a message sent to this host by a leg.
func (r *Relay) onIn(m *nats.Msg) {
	from := m.Header.Get(hdrFrom)
	id, err := strconv.ParseUint(m.Header.Get(hdrLeg), 10, 64)
	if from == "" || err != nil {
		return
	}
	k := legKey{from, id}
	switch m.Header.Get(hdrKind) {
	case "open":
		r.open(m, k)
	case "frame":
		r.mu.Lock()
		l := r.in[k]
		r.mu.Unlock()
		if l != nil {
			l.conn.OnFrame(m.Data, m.Header.Get(hdrBinary) == "1")
		}
	case "close":
		r.closeIn(k)
	}
}

// open admits a leg: the endpoint of its path opens a connection whose
// commands go back to the dialling host.
func (r *Relay) open(m *nats.Msg, k legKey) {
	path := m.Header.Get(hdrPath)
	ep := r.endpoints[path]
	if ep == nil {
		_ = m.Respond([]byte("no endpoint " + path))
		return
	}
	var who access.Identity
	if err := json.Unmarshal([]byte(m.Header.Get(hdrIdentity)), &who); err != nil || who.IsZero() {
		r.log.Warn().Str("from", k.from).Msg("relay: a leg with no client identity refused")
		_ = m.Respond([]byte("no identity"))
		return
	}
	out := &legSender{r: r, to: k.from, id: k.id}
	ev := &contract.Event{Kind: contract.EventOpened, Conn: k.id, Path: path, Query: m.Header.Get(hdrQuery), Host: r.self}
	tid := contract.TransportID{Instance: link.RelayTransport + ":" + k.from, Conn: k.id}
	conn := ep.Open(link.Opening{ID: tid, Transport: link.RelayTransport, Event: ev, Out: out, Who: who})
	if conn == nil {
		_ = m.Respond([]byte("refused"))
		return
	}
	r.mu.Lock()
	r.in[k] = &inLeg{inst: m.Header.Get(hdrInstance), conn: conn}
	r.mu.Unlock()
	_ = m.Respond([]byte("ok"))
}

// closeIn ends a leg served here: its connection is closed as if its
// socket had.
func (r *Relay) closeIn(k legKey) {
	r.mu.Lock()
	l := r.in[k]
	delete(r.in, k)
	r.mu.Unlock()
	if l != nil {
		l.conn.OnClosed()
	}
}

// legSender sends an endpoint's commands for a leg back to the host
// that dialled it.
type legSender struct {
	r  *Relay
	to string
	id uint64
}

// Send implements link.Sender.
func (s *legSender) Send(cmd contract.Command) {
	m := nats.NewMsg(backSubject(s.to))
	m.Header.Set(hdrLeg, strconv.FormatUint(s.id, 10))
	switch cmd.Kind {
	case contract.CommandAdmit:
		return // the leg's near end was admitted by its own transport
	case contract.CommandSend:
		m.Header.Set(hdrKind, "send")
		if cmd.Binary {
			m.Header.Set(hdrBinary, "1")
		}
		m.Data = cmd.Data
	case contract.CommandClose:
		m.Header.Set(hdrKind, "close")
		m.Header.Set(hdrCode, strconv.Itoa(cmd.Code))
		m.Header.Set(hdrReason, cmd.Reason)
		// The endpoint closed the connection: like a transport, report
		// it closed (later, off the endpoint's call).
		k := legKey{s.to, s.id}
		s.r.mu.Lock()
		l := s.r.in[k]
		delete(s.r.in, k)
		s.r.mu.Unlock()
		if l != nil {
			s.r.wg.Add(1)
			go func() {
				defer s.r.wg.Done()
				l.conn.OnClosed()
			}()
		}
	}
	if err := s.r.nc.PublishMsg(m); err != nil {
		s.r.log.Debug().Err(err).Str("to", s.to).Msg("relay: send back")
	}
}

// WaitRoom implements link.FlowSender: NATS buffers what is published,
// so there is always room.
func (s *legSender) WaitRoom(context.Context, time.Duration) bool { return true }

// Leg is this host's end of a connection relayed to another host.
type Leg struct {
	r    *Relay
	id   uint64
	host string
	inst string
	// onCommand gets what the far endpoint sent the leg's connection, in
	// order: sends, then at most one close.
	onCommand func(contract.Command)
	closed    atomic.Bool
}

// Host is the host the leg reaches.
func (l *Leg) Host() string { return l.host }

// Dial opens a leg to path on host, whose process instance is inst (the
// leg is closed with 1001 when that instance leaves the cluster), for a
// client whose identity this host verified as who (the far host applies
// it; query must carry no credential). What
// the far endpoint sends the connection arrives at onCommand, in order,
// on the relay's goroutine; it must not block. ErrUnreachable when the
// host does not answer within ctx.
func (r *Relay) Dial(ctx context.Context, host, inst, path, query string, who access.Identity, onCommand func(contract.Command)) (*Leg, error) {
	idj, err := json.Marshal(who)
	if err != nil || who.IsZero() {
		return nil, fmt.Errorf("relay to %s: no client identity: %w", host, ErrUnreachable)
	}
	l := &Leg{r: r, id: r.nextLeg.Add(1), host: host, inst: inst, onCommand: onCommand}
	r.mu.Lock()
	r.out[l.id] = l
	r.mu.Unlock()
	m := l.msg("open")
	m.Header.Set(hdrInstance, r.inst)
	m.Header.Set(hdrPath, path)
	m.Header.Set(hdrQuery, query)
	m.Header.Set(hdrIdentity, string(idj))
	reply, err := r.nc.RequestMsgWithContext(ctx, m)
	if err == nil && string(reply.Data) != "ok" {
		err = fmt.Errorf("%s refused the leg: %s", host, reply.Data)
	}
	if err != nil {
		r.mu.Lock()
		delete(r.out, l.id)
		r.mu.Unlock()
		l.closed.Store(true)
		return nil, fmt.Errorf("relay to %s: %v: %w", host, err, ErrUnreachable)
	}
	return l, nil
}

func (l *Leg) msg(kind string) *nats.Msg {
	m := nats.NewMsg(inSubject(l.host))
	m.Header.Set(hdrKind, kind)
	m.Header.Set(hdrFrom, l.r.self)
	m.Header.Set(hdrLeg, strconv.FormatUint(l.id, 10))
	return m
}

// Send relays one frame to the far connection.
func (l *Leg) Send(data []byte, binary bool) error {
	if l.closed.Load() {
		return fmt.Errorf("relay to %s: leg closed: %w", l.host, ErrUnreachable)
	}
	m := l.msg("frame")
	if binary {
		m.Header.Set(hdrBinary, "1")
	}
	m.Data = data
	if err := l.r.nc.PublishMsg(m); err != nil {
		return fmt.Errorf("relay to %s: %v: %w", l.host, err, ErrUnreachable)
	}
	return nil
}

// Close ends the leg: the far connection is closed as if its socket had.
// onCommand gets nothing more.
func (l *Leg) Close() {
	if l.closed.Swap(true) {
		return
	}
	l.r.mu.Lock()
	delete(l.r.out, l.id)
	l.r.mu.Unlock()
	if err := l.r.nc.PublishMsg(l.msg("close")); err != nil {
		l.r.log.Debug().Err(err).Str("to", l.host).Msg("relay: close leg")
	}
}

// onBack delivers a command for one of this host's legs.
func (r *Relay) onBack(m *nats.Msg) {
	id, err := strconv.ParseUint(m.Header.Get(hdrLeg), 10, 64)
	if err != nil {
		return
	}
	r.mu.Lock()
	l := r.out[id]
	r.mu.Unlock()
	if l == nil || l.closed.Load() {
		return
	}
	switch m.Header.Get(hdrKind) {
	case "send":
		l.onCommand(contract.Command{Kind: contract.CommandSend, Conn: id, Binary: m.Header.Get(hdrBinary) == "1", Data: m.Data})
	case "close":
		code, _ := strconv.Atoi(m.Header.Get(hdrCode))
		l.gone(code, m.Header.Get(hdrReason))
	}
}

// gone ends a leg whose far end closed it (or whose host left): it gets
// its close command.
func (l *Leg) gone(code int, reason string) {
	if l.closed.Swap(true) {
		return
	}
	l.r.mu.Lock()
	delete(l.r.out, l.id)
	l.r.mu.Unlock()
	l.onCommand(contract.Command{Kind: contract.CommandClose, Conn: l.id, Code: code, Reason: reason})
}

// sweep closes, every period, the legs whose other host left the cluster.
func (r *Relay) sweep(period time.Duration) {
	defer r.wg.Done()
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		r.sweepOnce()
	}
}

func (r *Relay) sweepOnce() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r.mu.Lock()
	var ins []legKey
	inst := make(map[legKey]string)
	for k, l := range r.in {
		ins = append(ins, k)
		inst[k] = l.inst
	}
	outs := make([]*Leg, 0, len(r.out))
	for _, l := range r.out {
		outs = append(outs, l)
	}
	r.mu.Unlock()
	for _, k := range ins {
		if alive, err := r.reg.Alive(ctx, k.from, inst[k]); err == nil && !alive {
			r.log.Info().Str("host", k.from).Msg("relay: the host of a leg left the cluster; closing its connection")
			r.closeIn(k)
		}
	}
	for _, l := range outs {
		if alive, err := r.reg.Alive(ctx, l.host, l.inst); err == nil && !alive {
			l.gone(1001, "owner host gone; resume")
		}
	}
}

// Legs counts the legs served here (in) and dialled from here (out).
func (r *Relay) Legs() (in, out int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.in), len(r.out)
}

// Drain closes every leg served here with code and reason, as a host's
// shutdown closes its sockets: the far ends get the close, and the
// connections here are closed.
func (r *Relay) Drain(code int, reason string) {
	r.mu.Lock()
	legs := r.in
	r.in = make(map[legKey]*inLeg)
	r.mu.Unlock()
	for k, l := range legs {
		(&legSender{r: r, to: k.from, id: k.id}).Send(contract.Command{Kind: contract.CommandClose, Conn: k.id, Code: code, Reason: reason})
		l.conn.OnClosed()
	}
	_ = r.nc.Flush()
}

// Close stops serving legs: the ones served here are drained with 1001,
// and the ones dialled from here closed.
func (r *Relay) Close() {
	select {
	case <-r.stop:
		return
	default:
		close(r.stop)
	}
	r.Drain(1001, "host shutting down")
	r.mu.Lock()
	outs := make([]*Leg, 0, len(r.out))
	for _, l := range r.out {
		outs = append(outs, l)
	}
	r.mu.Unlock()
	for _, l := range outs {
		l.Close()
	}
	r.unsubscribe()
	_ = r.nc.Flush()
	r.wg.Wait()
}
