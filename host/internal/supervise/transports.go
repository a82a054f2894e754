package supervise

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// PrimaryTransport is the name of the transport that serves --listen: the
// built-in WebSocket transport, or the external one given with --plugin
// transport=PATH.
const PrimaryTransport = "ws"

// TransportSpec is one transport plugin the host runs, under its name.
type TransportSpec struct {
	PluginSpec
	// Listen is the address it serves: a TCP host:port (numeric port) is
	// bound by the host and handed to every process of the transport as
	// fd:3; anything else (unix:PATH, say) is passed as it is and the
	// transport binds it. Empty: unix:<state-dir>/<name>.sock.
	Listen string
}

// Transport registry errors.
var (
	// ErrTransportExists: a transport of that name is loaded already.
	ErrTransportExists = errors.New("a transport of that name is loaded")
	// ErrNoTransport: no transport of that name is loaded.
	ErrNoTransport = errors.New("no transport of that name")
	// ErrBadTransportName: the name is not a valid transport name.
	ErrBadTransportName = errors.New("bad transport name")
)

// transportName is what a transport may be called: short, lower case,
// usable in a file name and a metric label.
var transportName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)

// CheckTransportName reports whether name may name an added transport:
// lower-case letters, digits, '-' and '_', starting with a letter, at
// most 32 bytes, and neither the primary's name nor the PTY backend's.
func CheckTransportName(name string) error {
	switch {
	case !transportName.MatchString(name):
		return fmt.Errorf("%q: want a lower-case letter, then up to 31 of [a-z0-9_-]: %w", name, ErrBadTransportName)
	case name == PrimaryTransport:
		return fmt.Errorf("%q is the primary transport (it serves --listen; --plugin transport=PATH replaces it): %w", name, ErrTransportExists)
	case name == "pty":
		return fmt.Errorf("%q is the PTY backend's name: %w", name, ErrBadTransportName)
	}
	return nil
}

// instanceIDs issues the instance ids of transport plugin processes, and
// never the same one twice in the host's life, across every transport and
// every restart: a transport identity (instance, connection) is then never
// reused even though each process numbers its connections
// from 1. (Ids are 64 random bits, so they do not repeat across hosts
// either in practice; no identity outlives its host anyway.)
type instanceIDs struct {
	mu   sync.Mutex
	seen map[string]string // id → transport name
	gen  func() string     // contract.NewInstanceID; replaceable in tests
}

func newInstanceIDs() *instanceIDs {
	return &instanceIDs{seen: make(map[string]string), gen: contract.NewInstanceID}
}

// next returns a fresh instance id for a process of transport name.
func (r *instanceIDs) next(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		id := r.gen()
		if _, dup := r.seen[id]; !dup {
			r.seen[id] = name
			return id
		}
	}
}

// Transports is the set of transport plugins the host runs, each under
// its own supervisor. Transports are added and removed while the host
// serves; the primary one is there for the host's whole life.
type Transports struct {
	opts Options
	ids  *instanceIDs

	mu       sync.Mutex // guards the fields below
	sups     map[string]*Transport
	pending  map[string]bool // names being loaded or unloaded
	stopping bool
}

func NewTransports(opts Options) *Transports {
	return &Transports{
		opts:    opts,
		ids:     newInstanceIDs(),
		sups:    make(map[string]*Transport),
		pending: make(map[string]bool),
	}
}

// defaultListen is an added transport's address when none is given.
func (ts *Transports) defaultListen(name string) string {
	return "unix:" + filepath.Join(ts.opts.StateDir, name+".sock")
}

// Load starts transport spec and adds it; ln is the host's listener for
// it when the caller bound it already (the primary's, bound before
// anything else starts), else nil. The transport is added only once its
// first process is up and linked; if that fails, nothing is left behind.
func (ts *Transports) Load(ctx context.Context, spec TransportSpec, ln *net.TCPListener) (*Transport, error) {
	if spec.Listen == "" {
		spec.Listen = ts.defaultListen(spec.Name)
	}
	ts.mu.Lock()
	switch {
	case ts.stopping:
		ts.mu.Unlock()
		return nil, ErrStopping
	case ts.sups[spec.Name] != nil || ts.pending[spec.Name]:
		ts.mu.Unlock()
		return nil, fmt.Errorf("transport %s: %w (unload it first, or reload it to swap its binary)", spec.Name, ErrTransportExists)
	}
	ts.pending[spec.Name] = true
	ts.mu.Unlock()
	defer func() {
		ts.mu.Lock()
		delete(ts.pending, spec.Name)
		ts.mu.Unlock()
	}()

	if ln == nil && HostListens(spec.Listen) {
		var lc net.ListenConfig
		l, err := lc.Listen(ctx, "tcp", spec.Listen)
		if err != nil {
			return nil, fmt.Errorf("transport %s: listen on %s: %w", spec.Name, spec.Listen, err)
		}
		ln = l.(*net.TCPListener)
	}
	sup := newTransport(ts.opts, spec, ln, ts.ids)
	if err := sup.start(ctx); err != nil {
		if ln != nil {
			_ = ln.Close()
		}
		return nil, err
	}
	ts.mu.Lock()
	if ts.stopping {
		ts.mu.Unlock()
		sup.stop(context.WithoutCancel(ctx), wire.CloseGoingAway, ReasonShutdown)
		return nil, ErrStopping
	}
	ts.sups[spec.Name] = sup
	ts.mu.Unlock()
	ts.opts.Log.Debug().Str("plugin", spec.Name).Str("addr", sup.Addr()).Str("path", spec.Path).Msg("transport loaded")
	return sup, nil
}

// Unload stops transport name and removes it: its sockets are closed with
// 1012 and their sessions parked (never closed), so their clients resume
// them on another transport or once it is loaded again. The primary
// transport cannot be unloaded (reload it instead).
func (ts *Transports) Unload(ctx context.Context, name string) error {
	if name == PrimaryTransport {
		return fmt.Errorf("transport %s serves --listen and cannot be unloaded; reload it to swap it for a fresh process", name)
	}
	ts.mu.Lock()
	sup := ts.sups[name]
	switch {
	case ts.stopping:
		ts.mu.Unlock()
		return ErrStopping
	case sup == nil || ts.pending[name]:
		ts.mu.Unlock()
		return fmt.Errorf("transport %q: %w (loaded: %s)", name, ErrNoTransport, strings.Join(ts.names(), ", "))
	}
	ts.pending[name] = true
	ts.mu.Unlock()
	sup.stop(ctx, wire.CloseServiceRestart, reasonUnloaded)
	ts.mu.Lock()
	delete(ts.sups, name)
	delete(ts.pending, name)
	ts.mu.Unlock()
	ts.opts.Log.Info().Str("plugin", name).Msg("transport unloaded")
	return nil
}

// Get returns the supervisor of transport name, or nil.
func (ts *Transports) Get(name string) *Transport {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.pending[name] {
		return nil
	}
	return ts.sups[name]
}

// List returns every transport's supervisor, the primary first, then by
// name.
func (ts *Transports) List() []*Transport {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	out := make([]*Transport, 0, len(ts.sups))
	for _, name := range ts.names() {
		out = append(out, ts.sups[name])
	}
	return out
}

// names is the loaded transports' names, the primary first. Call with mu
// held.
func (ts *Transports) names() []string {
	names := make([]string, 0, len(ts.sups))
	for name := range ts.sups {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		if (names[i] == PrimaryTransport) != (names[j] == PrimaryTransport) {
			return names[i] == PrimaryTransport
		}
		return names[i] < names[j]
	})
	return names
}

// Drain makes every transport refuse new connections (with 1001).
func (ts *Transports) Drain() {
	for _, sup := range ts.List() {
		sup.drain()
	}
}

// Stop closes every socket of every transport with 1001 and stops them
// all, side by side, within ctx. No transport is loaded after it began.
func (ts *Transports) Stop(ctx context.Context) {
	ts.mu.Lock()
	ts.stopping = true
	ts.mu.Unlock()
	var wg sync.WaitGroup
	for _, sup := range ts.List() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sup.stop(ctx, wire.CloseGoingAway, ReasonShutdown)
		}()
	}
	wg.Wait()
}
