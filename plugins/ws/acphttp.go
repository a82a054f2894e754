package ws

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// ACP over Streamable HTTP (docs/PROTOCOL.md, "ACP over Streamable
// HTTP"): the framing of /acp without a WebSocket upgrade. An initialize
// POST opens one contract connection, reported exactly as an upgrade of
// /acp would be; later POSTs are its frames, and what the host sends on
// it is routed to the connection's SSE streams.

// Headers of the ACP transports RFD.
const (
	headerConnectionID = "Acp-Connection-Id"
	headerSessionID    = "Acp-Session-Id"
)

// DefaultSSEKeepAlive is how often an idle SSE stream gets a comment.
const DefaultSSEKeepAlive = 15 * time.Second

// maxHTTPBody bounds one POSTed message (a prompt's 16 MiB of content).
const maxHTTPBody = 16 << 20

// resumePrefix starts the JSON-RPC id of the session/resume the
// transport sends for a Last-Event-ID; its answer is swallowed.
const resumePrefix = `"tether-sse-resume-`

// errQueueFull closes a connection whose streams hold too much.
var errQueueFull = errors.New("send queue full")

// acpHTTP is the Server's table of HTTP connections, guarded by
// Server.mu.
type acpHTTP struct {
	conns    map[uint64]*hconn // by connection id
	keys     map[string]*hconn // by Acp-Connection-Id, once initialized
	stopping bool              // Stop began: no new connection
}

// hconn is one /acp connection over Streamable HTTP.
type hconn struct {
	s    *Server
	id   uint64
	key  string // Acp-Connection-Id
	done chan struct{}

	mu       sync.Mutex // guards the fields below
	cred     [32]byte   // digest of the initialize's credential, once admitted
	bind     binding    // what the host's admit binds besides the credential
	admitted chan struct{}
	isAdmit  bool
	closed   bool
	code     int    // the close code, once closed
	reason   string // the close reason, once closed
	initID   string // the initialize request's id, until answered
	initResp chan []byte
	streams  map[string]*sseStream // "" is the connection's stream
	queued   int64                 // bytes held by every stream
	reqs     map[string]string     // request id → the session it was posted for
	nResume  int
	lastUse  time.Time
}

// sseStream is one stream of a connection: what waits for its GET, and
// the GET that holds it.
type sseStream struct {
	items []sseItem
	wake  chan struct{} // 1-buffered: items or gen changed
	gen   int           // the GET that holds it; a later GET supersedes
	taken chan struct{} // closed when a later GET takes the stream
	open  bool          // a GET holds it
	// Last-Event-ID: seq ≤ floor is never sent again; while resuming
	// (the transport's session/resume unanswered) updates are held and
	// go out sorted once it is answered.
	floor     uint64
	resuming  string // the id of that session/resume
	held      []sseItem
	heldOther []sseItem // messages without a seq that came meanwhile
	// The answers written on the stream, each with the highest seq
	// written before it (at most maxAnswersKept): a Last-Event-ID at or
	// below that seq may have missed the answer, which is sent again.
	lastSent uint64
	answers  []sentAnswer
}

type sseItem struct {
	data   []byte
	seq    uint64 // 0: not an update with a tether seq
	answer bool   // a response to a request of the client
}

// sentAnswer is an answer written on a stream after the update of seq
// after.
type sentAnswer struct {
	it    sseItem
	after uint64
}

// maxAnswersKept bounds the answers a stream keeps to send again.
const maxAnswersKept = 64

// acpMsg is what routing reads of a message the host sends.
type acpMsg struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		SessionID string `json:"sessionId"`
		Meta      struct {
			Seq *uint64 `json:"tether/seq"`
		} `json:"_meta"`
	} `json:"params"`
}

// newConnKey returns a random connection id of 128 bits.
func newConnKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// binding is what binds a connection besides its credential, as the
// host's admit said (docs/PROTOCOL.md 14.15): the reverse proxy's user
// header, read only from a peer in from (from any other it counts as
// absent, as the host ignores it there). The zero binding is none.
type binding struct {
	header string
	from   []netip.Prefix
}

// parseBinding reads the binding of an Admit's header; values that do
// not parse are left out (a prefix left out trusts fewer peers).
func parseBinding(h map[string][]string) binding {
	var b binding
	if v := h[contract.AdmitBindHeader]; len(v) == 1 && v[0] != "" {
		b.header = http.CanonicalHeaderKey(v[0])
	}
	for _, v := range h[contract.AdmitBindFrom] {
		if pre, err := netip.ParsePrefix(v); err == nil {
			b.from = append(b.from, pre)
		}
	}
	return b
}

// trusts reports whether remote (a peer's host:port) is in b.from.
func (b binding) trusts(remote string) bool {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap().WithZone("")
	return slices.ContainsFunc(b.from, func(pre netip.Prefix) bool { return pre.Contains(ip) })
}

// credential digests what a request presents as its credential: the
// Authorization header, tether's cookies (tether_*), ?token= and, when
// b names one and r comes from b's peers, the proxy's user header.
// None at all reports false.
func credential(r *http.Request, bd binding) ([32]byte, bool) {
	var b strings.Builder
	auth := r.Header.Get("Authorization")
	b.WriteString(auth)
	b.WriteByte(0)
	var cookies []string
	for _, c := range r.Cookies() {
		if strings.HasPrefix(c.Name, "tether_") {
			cookies = append(cookies, c.Name+"="+c.Value)
		}
	}
	sort.Strings(cookies)
	b.WriteString(strings.Join(cookies, ";"))
	b.WriteByte(0)
	tok := r.URL.Query().Get("token")
	b.WriteString(tok)
	b.WriteByte(0)
	user, proxied := r.Header[bd.header]
	proxied = proxied && bd.header != "" && bd.trusts(r.RemoteAddr)
	if proxied {
		b.WriteByte(1) // apart from "trusted, no value"
		for _, v := range user {
			b.WriteString(strconv.Quote(v))
		}
	}
	return sha256.Sum256([]byte(b.String())), auth != "" || len(cookies) > 0 || tok != "" || proxied
}

// serveACPHTTP serves /acp without an upgrade.
func (s *Server) serveACPHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
		s.acpPost(w, r)
	case http.MethodGet:
		s.acpGet(w, r)
	case http.MethodDelete:
		hc := s.acpConn(w, r)
		if hc == nil {
			return
		}
		hc.close(wire.CloseNormal, "deleted by the client")
		w.WriteHeader(http.StatusAccepted)
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

// acpConn finds the connection of r's Acp-Connection-Id, answering 400
// (none), 404 (unknown or closed), 401 (no credential) or 403 (another
// credential than the initialize's) when there is none r may use.
func (s *Server) acpConn(w http.ResponseWriter, r *http.Request) *hconn {
	key := r.Header.Get(headerConnectionID)
	if key == "" {
		http.Error(w, "missing "+headerConnectionID, http.StatusBadRequest)
		return nil
	}
	s.mu.Lock()
	hc := s.acp.keys[key]
	s.mu.Unlock()
	if hc == nil {
		http.Error(w, "unknown "+headerConnectionID, http.StatusNotFound)
		return nil
	}
	hc.mu.Lock()
	want, bind := hc.cred, hc.bind
	hc.mu.Unlock()
	cred, has := credential(r, bind)
	if subtle.ConstantTimeCompare(cred[:], want[:]) != 1 {
		if !has {
			http.Error(w, "this connection needs the credential its initialize carried", http.StatusUnauthorized)
		} else {
			http.Error(w, "not the credential this connection was opened with", http.StatusForbidden)
		}
		return nil
	}
	hc.mu.Lock()
	hc.lastUse = time.Now()
	hc.mu.Unlock()
	return hc
}

// acpPost serves a POST: an initialize opens a connection, anything else
// is a frame of one.
func (s *Server) acpPost(w http.ResponseWriter, r *http.Request) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		http.Error(w, "Content-Type must be application/json", http.StatusUnsupportedMediaType)
		return
	}
	if r.ContentLength > maxHTTPBody {
		http.Error(w, "message over 16 MiB", http.StatusRequestEntityTooLarge)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxHTTPBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, "message over 16 MiB", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		http.Error(w, "batches are not supported", http.StatusNotImplemented)
		return
	}
	var m acpMsg
	if json.Unmarshal(body, &m) != nil || len(body) == 0 || body[0] != '{' {
		http.Error(w, "the body is not one JSON-RPC message", http.StatusBadRequest)
		return
	}
	if r.Header.Get(headerConnectionID) == "" && m.Method == "initialize" && len(m.ID) > 0 {
		s.acpInitialize(w, r, body, idKey(m.ID))
		return
	}
	hc := s.acpConn(w, r)
	if hc == nil {
		return
	}
	if sessionScoped[m.Method] && r.Header.Get(headerSessionID) == "" {
		http.Error(w, m.Method+" needs "+headerSessionID, http.StatusBadRequest)
		return
	}
	if m.Method != "" && len(m.ID) > 0 {
		sid := r.Header.Get(headerSessionID)
		if sid == "" {
			sid = m.Params.SessionID
		}
		hc.mu.Lock()
		hc.reqs[idKey(m.ID)] = sid
		if st := hc.streams[sid]; st != nil && (m.Method == "session/load" || m.Method == "session/resume") {
			st.floor = 0 // the client asks for a replay
		}
		hc.mu.Unlock()
	}
	if !hc.frame(body) {
		http.Error(w, "connection closed", http.StatusNotFound)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// sessionScoped is the methods whose POST must carry Acp-Session-Id
// (the RFD; the SDK's client sends it with these).
var sessionScoped = map[string]bool{
	"session/cancel": true, "session/close": true, "session/delete": true, "session/fork": true,
	"session/load": true, "session/prompt": true, "session/resume": true,
	"session/set_config_option": true, "session/set_mode": true, "session/set_model": true,
}

// idKey is a JSON-RPC id as a map key: its JSON text, compacted.
func idKey(id json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, id) != nil {
		return string(id)
	}
	return b.String()
}

// frame hands body to the host as a frame of hc, waiting for room in
// the event queue; false when hc is closed.
func (hc *hconn) frame(body []byte) bool {
	return hc.s.events.PushFrame(contract.Event{Kind: contract.EventFrame, Conn: hc.id, Data: body}, hc.open)
}

// open reports that hc is not closed.
func (hc *hconn) open() bool {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	return !hc.closed
}

// acpInitialize opens a connection for an initialize POST, reports it
// to the host as an upgrade of /acp would be, and answers with the
// host's initialize response.
func (s *Server) acpInitialize(w http.ResponseWriter, r *http.Request, body []byte, id string) {
	hc := &hconn{
		s: s, key: newConnKey(), done: make(chan struct{}),
		admitted: make(chan struct{}), initID: id, initResp: make(chan []byte, 1),
		streams: make(map[string]*sseStream), reqs: make(map[string]string), lastUse: time.Now(),
	}
	s.mu.Lock()
	cfg := s.cfg
	if s.acp.conns == nil {
		s.acp.conns, s.acp.keys = make(map[uint64]*hconn), make(map[string]*hconn)
	}
	if s.stopped || s.acp.stopping {
		s.mu.Unlock()
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	if s.lim != nil && int64(len(s.acp.conns)) >= s.lim.max {
		// They hold no socket of their own: bound them as sockets are.
		s.mu.Unlock()
		http.Error(w, fmt.Sprintf("too many ACP connections over HTTP (%d, --max-connections)", s.lim.max), http.StatusServiceUnavailable)
		return
	}
	s.lastID++
	hc.id = s.lastID
	s.acp.conns[hc.id] = hc
	s.events.Push(contract.Event{
		Kind: contract.EventOpened, Conn: hc.id, Path: r.URL.Path, Query: r.URL.RawQuery,
		Header: r.Header.Clone(), Remote: r.RemoteAddr, Host: r.Host,
	})
	s.mu.Unlock()
	s.log.Debug().Uint64("conn", hc.id).Str("remote", r.RemoteAddr).Msg("acp over http opened")

	timer := time.NewTimer(cfg.peerTimeout)
	defer timer.Stop()
	select {
	case <-hc.admitted:
	case <-hc.done:
		code, reason := hc.closeCode()
		status := http.StatusServiceUnavailable
		switch code {
		case wire.CloseUnauthorized:
			status = http.StatusUnauthorized
		case wire.CloseForbidden, wire.CloseNotLoopback:
			status = http.StatusForbidden
		}
		http.Error(w, reason, status)
		return
	case <-timer.C:
		hc.close(wire.CloseTryAgainLater, "admit timeout")
		http.Error(w, "admit timeout", http.StatusServiceUnavailable)
		return
	case <-r.Context().Done():
		hc.close(wire.CloseGoingAway, "client gone")
		return
	}
	// Bound now, with what the admit binds: the connection has no key
	// for another request yet.
	hc.mu.Lock()
	hc.cred, _ = credential(r, hc.bind)
	hc.mu.Unlock()
	if !hc.frame(body) {
		http.Error(w, "connection closed", http.StatusServiceUnavailable)
		return
	}
	var resp []byte
	select {
	case resp = <-hc.initResp:
	case <-hc.done:
		_, reason := hc.closeCode()
		http.Error(w, reason, http.StatusServiceUnavailable)
		return
	case <-timer.C:
		hc.close(wire.CloseTryAgainLater, "initialize unanswered")
		http.Error(w, "initialize unanswered", http.StatusServiceUnavailable)
		return
	case <-r.Context().Done():
		hc.close(wire.CloseGoingAway, "client gone")
		return
	}
	s.mu.Lock()
	if _, ok := s.acp.conns[hc.id]; ok {
		s.acp.keys[hc.key] = hc
	}
	s.mu.Unlock()
	w.Header().Set(headerConnectionID, hc.key)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(resp)
}

// closeCode returns the code and reason hc was closed with.
func (hc *hconn) closeCode() (int, string) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	return hc.code, hc.reason
}

// exec applies one host command to hc.
func (hc *hconn) exec(cmd *contract.Command, clone bool) {
	switch cmd.Kind {
	case contract.CommandAdmit:
		hc.mu.Lock()
		if !hc.isAdmit && !hc.closed {
			hc.isAdmit = true
			hc.bind = parseBinding(cmd.Header)
			close(hc.admitted)
		}
		hc.mu.Unlock()
	case contract.CommandSend:
		data := cmd.Data
		if clone {
			data = bytes.Clone(data)
		}
		if err := hc.route(data); err != nil {
			hc.close(wire.CloseTryAgainLater, err.Error())
		}
	case contract.CommandClose:
		code := cmd.Code
		if code == 0 {
			code = wire.CloseNormal
		}
		hc.close(code, cmd.Reason)
	}
}

// route queues a message of the host on the stream it belongs to: a
// response on the stream of the session its request was posted for, a
// message with params.sessionId on that session's, anything else on
// the connection's.
func (hc *hconn) route(data []byte) error {
	var m acpMsg
	_ = json.Unmarshal(data, &m)
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.closed {
		return nil
	}
	sid := m.Params.SessionID
	if m.Method == "" && len(m.ID) > 0 {
		key := idKey(m.ID)
		if hc.initID != "" && key == hc.initID {
			hc.initID = ""
			hc.initResp <- data
			return nil
		}
		if strings.HasPrefix(key, resumePrefix) {
			hc.resumedLocked(key)
			return nil
		}
		sid = hc.reqs[key]
		delete(hc.reqs, key)
	}
	it := sseItem{data: data, answer: m.Method == "" && len(m.ID) > 0}
	if m.Method == "session/update" && m.Params.Meta.Seq != nil {
		it.seq = *m.Params.Meta.Seq
	}
	st := hc.streamLocked(sid)
	switch {
	case it.seq != 0 && st.resuming != "":
		st.held = append(st.held, it)
	case st.resuming != "":
		st.heldOther = append(st.heldOther, it)
	case it.seq != 0 && it.seq <= st.floor:
		return nil // sent before the Last-Event-ID, or replayed again
	default:
		st.items = append(st.items, it)
	}
	hc.queued += int64(len(data))
	if hc.queued > hc.s.cfg.sendQueue {
		return fmt.Errorf("%w: over %d bytes wait for a GET", errQueueFull, hc.s.cfg.sendQueue)
	}
	st.kick()
	return nil
}

// resumedLocked ends the Last-Event-ID resumption whose session/resume
// was answered: the updates held meanwhile (its replay, and live ones
// that may repeat it) go out in seq order, each once.
func (hc *hconn) resumedLocked(key string) {
	for _, st := range hc.streams {
		if st.resuming != key {
			continue
		}
		st.resuming = ""
		held := st.held
		st.held = nil
		kept := dedupe(held, st.floor)
		for _, it := range held {
			hc.queued -= int64(len(it.data))
		}
		for _, it := range kept {
			hc.queued += int64(len(it.data))
		}
		st.items = append(st.items, kept...)
		if n := len(kept); n > 0 {
			st.floor = kept[n-1].seq
		}
		st.items = append(st.items, st.heldOther...)
		st.heldOther = nil
		st.kick()
	}
}

// dedupe returns the updates of held above floor in seq order, each
// once. The items of one seq (a prompt's blocks share its seq) arrive as
// a whole copy each time the seq is sent — live, replayed, or both — so
// a seq's items in arrival order are one copy repeated: the shortest
// prefix that repeats to all of them is the copy kept.
func dedupe(held []sseItem, floor uint64) []sseItem {
	bySeq := make(map[uint64][]sseItem)
	var seqs []uint64
	for _, it := range held {
		if it.seq <= floor {
			continue
		}
		if _, ok := bySeq[it.seq]; !ok {
			seqs = append(seqs, it.seq)
		}
		bySeq[it.seq] = append(bySeq[it.seq], it)
	}
	slices.Sort(seqs)
	var out []sseItem
	for _, seq := range seqs {
		g := bySeq[seq]
		out = append(out, g[:period(g)]...)
	}
	return out
}

// period is the length of the shortest prefix of g that repeated makes
// g (len(g) when none shorter does).
func period(g []sseItem) int {
	for p := 1; p < len(g); p++ {
		if len(g)%p != 0 {
			continue
		}
		ok := true
		for i := p; i < len(g) && ok; i++ {
			ok = bytes.Equal(g[i].data, g[i%p].data)
		}
		if ok {
			return p
		}
	}
	return len(g)
}

// streamLocked returns the stream of session sid ("" for the
// connection's), making it.
func (hc *hconn) streamLocked(sid string) *sseStream {
	st := hc.streams[sid]
	if st == nil {
		st = &sseStream{wake: make(chan struct{}, 1)}
		hc.streams[sid] = st
	}
	return st
}

func (st *sseStream) kick() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// close ends hc with code: its streams end once they have sent what
// was queued before, later requests get 404, and its one Closed event
// is queued.
func (hc *hconn) close(code int, reason string) {
	hc.mu.Lock()
	if hc.closed {
		hc.mu.Unlock()
		return
	}
	hc.closed = true
	hc.code, hc.reason = code, reason
	close(hc.done)
	hc.mu.Unlock()
	s := hc.s
	s.mu.Lock()
	delete(s.acp.conns, hc.id)
	if s.acp.keys[hc.key] == hc {
		delete(s.acp.keys, hc.key)
	}
	s.events.Push(contract.Event{Kind: contract.EventClosed, Conn: hc.id, Code: code, Reason: reason})
	s.mu.Unlock()
	s.events.Wake() // a POST waiting for event space drops its frame
	s.log.Debug().Uint64("conn", hc.id).Int("code", code).Str("reason", reason).Msg("acp over http closed")
}

// acpGet serves a GET of /acp that is not an upgrade: the SSE stream of
// the connection, or with Acp-Session-Id of one of its sessions.
func (s *Server) acpGet(w http.ResponseWriter, r *http.Request) {
	if !acceptsEventStream(r) {
		http.Error(w, "Accept must include text/event-stream", http.StatusNotAcceptable)
		return
	}
	hc := s.acpConn(w, r)
	if hc == nil {
		return
	}
	sid := r.Header.Get(headerSessionID)
	var after *uint64
	if v := r.Header.Get("Last-Event-ID"); v != "" && sid != "" {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			http.Error(w, "Last-Event-ID must be a tether seq", http.StatusBadRequest)
			return
		}
		after = &n
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	hc.mu.Lock()
	if hc.closed {
		hc.mu.Unlock()
		http.Error(w, "unknown "+headerConnectionID, http.StatusNotFound)
		return
	}
	st := hc.streamLocked(sid)
	st.gen++
	gen := st.gen
	if st.taken != nil {
		close(st.taken) // the GET that held it ends
	}
	st.taken = make(chan struct{})
	taken := st.taken
	st.open = true
	var resume []byte
	if after != nil {
		resume = hc.resumeLocked(st, sid, *after)
	}
	st.kick()
	hc.mu.Unlock()
	defer func() {
		hc.mu.Lock()
		if st.gen == gen {
			st.open = false
			hc.lastUse = time.Now()
		}
		hc.mu.Unlock()
	}()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	if resume != nil && !hc.frame(resume) {
		return
	}
	every := s.SSEKeepAlive
	if every <= 0 {
		every = DefaultSSEKeepAlive
	}
	keep := time.NewTicker(every)
	defer keep.Stop()
	var buf bytes.Buffer
	for {
		hc.mu.Lock()
		if st.gen != gen {
			hc.mu.Unlock()
			return // a later GET of the same stream took it
		}
		items := st.items
		st.items = nil
		for _, it := range items {
			hc.queued -= int64(len(it.data))
			st.sentLocked(it)
		}
		closed := hc.closed
		hc.mu.Unlock()
		if len(items) > 0 {
			buf.Reset()
			for _, it := range items {
				writeEvent(&buf, it)
			}
			if _, err := w.Write(buf.Bytes()); err != nil {
				return
			}
			flusher.Flush()
			continue
		}
		if closed {
			return
		}
		select {
		case <-st.wake:
		case <-taken:
			return
		case <-hc.done:
		case <-keep.C:
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil {
				return
			}
			flusher.Flush()
		case <-r.Context().Done():
			return
		}
	}
}

// resumeLocked starts a Last-Event-ID resumption of st after seq:
// queued updates are dropped (the journal sends them again), the
// updates that come until the returned session/resume is answered are
// held, and none at or below after is sent again.
func (hc *hconn) resumeLocked(st *sseStream, sid string, after uint64) []byte {
	kept := st.items[:0]
	for _, it := range st.items {
		if it.seq == 0 {
			kept = append(kept, it)
		} else {
			hc.queued -= int64(len(it.data))
		}
	}
	st.items = kept
	for _, it := range st.held {
		hc.queued -= int64(len(it.data))
	}
	st.held = nil
	st.items = append(st.items, st.heldOther...)
	st.heldOther = nil
	// The answers written after the client's last update may not have
	// reached it: they go again after the replay (a client ignores an
	// answer to a request it is not waiting for).
	kept2 := st.answers[:0]
	for _, a := range st.answers {
		if a.after >= after {
			kept2 = append(kept2, a)
			st.heldOther = append(st.heldOther, a.it)
			hc.queued += int64(len(a.it.data))
		}
	}
	st.answers = kept2
	st.floor = after
	hc.nResume++
	st.resuming = resumePrefix + strconv.Itoa(hc.nResume) + `"`
	msg, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"id":      json.RawMessage(st.resuming),
		"method":  "session/resume",
		"params": map[string]any{
			"sessionId": sid,
			"cwd":       "/",
			"_meta":     map[string]any{"tether/after": after},
		},
	})
	return msg
}

// sentLocked records that it is written on st (hc.mu held).
func (st *sseStream) sentLocked(it sseItem) {
	switch {
	case it.seq > st.lastSent:
		st.lastSent = it.seq
	case it.answer:
		for _, a := range st.answers {
			if bytes.Equal(a.it.data, it.data) {
				return // sent again after a resumption: kept once
			}
		}
		if len(st.answers) == maxAnswersKept {
			st.answers = slices.Delete(st.answers, 0, 1)
		}
		st.answers = append(st.answers, sentAnswer{it: it, after: st.lastSent})
	}
}

// writeEvent writes it as one SSE event: id: its seq (updates only),
// and its JSON, one data: line per line.
func writeEvent(b *bytes.Buffer, it sseItem) {
	if it.seq != 0 {
		b.WriteString("id: ")
		b.WriteString(strconv.FormatUint(it.seq, 10))
		b.WriteByte('\n')
	}
	for _, line := range bytes.Split(it.data, []byte("\n")) {
		b.WriteString("data: ")
		b.Write(bytes.TrimSuffix(line, []byte("\r")))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
}

// acceptsEventStream reports whether r's Accept includes
// text/event-stream (or any type).
func acceptsEventStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err == nil && (mt == "text/event-stream" || mt == "*/*" || mt == "text/*") {
				return true
			}
		}
	}
	return false
}

// acpUpgradeHeader is the header of the 101 answering r: an
// Acp-Connection-Id for /acp (the ACP transports RFD), none elsewhere.
func acpUpgradeHeader(r *http.Request) http.Header {
	if r.URL.Path != "/acp" {
		return nil
	}
	return http.Header{headerConnectionID: {newConnKey()}}
}

// isUpgrade reports whether r asks for a WebSocket.
func isUpgrade(r *http.Request) bool {
	for _, v := range r.Header.Values("Upgrade") {
		for _, p := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(p), "websocket") {
				return true
			}
		}
	}
	return false
}

// tickHTTP closes the HTTP connections that were idle — no stream open,
// no request — for PeerTimeout (1006 "peer timeout").
func (s *Server) tickHTTP(now time.Time, cfg *config) {
	s.mu.Lock()
	hcs := make([]*hconn, 0, len(s.acp.conns))
	for _, hc := range s.acp.conns {
		hcs = append(hcs, hc)
	}
	s.mu.Unlock()
	for _, hc := range hcs {
		hc.mu.Lock()
		idle := hc.isAdmit && now.Sub(hc.lastUse) > cfg.peerTimeout
		for _, st := range hc.streams {
			idle = idle && !st.open
		}
		hc.mu.Unlock()
		if idle {
			hc.close(wire.CloseAbnormal, "peer timeout")
		}
	}
}

// stopHTTP closes every HTTP connection with code, and refuses new ones.
func (s *Server) stopHTTP(code int, reason string) {
	s.mu.Lock()
	s.acp.stopping = true
	hcs := make([]*hconn, 0, len(s.acp.conns))
	for _, hc := range s.acp.conns {
		hcs = append(hcs, hc)
	}
	s.mu.Unlock()
	for _, hc := range hcs {
		hc.close(code, reason)
	}
}
