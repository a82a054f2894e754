package owners

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/cluster/bus"
)

// HostsBucket is the KV bucket of the cluster's hosts: one entry per
// running host, rewritten by its heartbeat.
const HostsBucket = "tether_hosts"

// HostInfo is a host's entry in the hosts bucket, as its last heartbeat
// wrote it.
type HostInfo struct {
	// ID is the host's --host-id.
	ID string `json:"id"`
	// Instance is new with each start of the host's process.
	Instance string `json:"instance"`
	// Listen is the address its public listener serves.
	Listen string `json:"listen"`
	// Sessions and PTYs are what it had live at the heartbeat.
	Sessions int `json:"sessions"`
	PTYs     int `json:"ptys"`
	// Started is when the process started; Beat when it wrote the entry
	// (its own clock).
	Started time.Time `json:"started"`
	Beat    time.Time `json:"heartbeat"`
}

// RegistryConfig configures a Registry.
type RegistryConfig struct {
	// Bucket is the hosts bucket's name (default HostsBucket).
	Bucket string
	// Self is this host's entry (ID, Instance, Listen, Started); the
	// heartbeat fills in the rest.
	Self HostInfo
	// TTL: a host whose entry has not changed for this long is gone, and
	// its sessions and PTYs are the others' to take. This host's
	// heartbeat is written every TTL/3.
	TTL time.Duration
	// Replicas of the bucket (default 1).
	Replicas int
	// Stats gives the heartbeat's session and PTY counts (nil: zeros).
	Stats func() (sessions, ptys int)
	// OnFenced is called (once per outage) when this host could not write
	// its heartbeat for TTL/2: before the others take its sessions, it
	// must stop serving them. OnRestored is called when a heartbeat is
	// written again after that.
	OnFenced, OnRestored func()
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	Log zerolog.Logger
}

// Registry is this host's heartbeat in the hosts bucket and its view of
// every other host's. Whether a host is alive is decided on this host's
// own clock: when this host last saw the host's entry change (a watch),
// never by comparing another host's clock with ours.
type Registry struct {
	kv   jetstream.KeyValue
	cfg  RegistryConfig
	self HostInfo // guarded by mu after start

	mu     sync.Mutex // guards the fields below
	seen   map[string]seenHost
	lastOK time.Time // the last heartbeat written
	fenced bool

	stop chan struct{}
	// life ends when Close starts, cutting a heartbeat in flight short.
	life   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// seenHost is a host's last entry and when this host saw it change.
type seenHost struct {
	info HostInfo
	at   time.Time
	rev  uint64 // the entry's revision
}

// ErrHostGone: the owner host of an entry is no longer in the cluster.
var ErrHostGone = errors.New("host gone from the cluster")

// OpenRegistry opens the hosts bucket (creating it if needed), writes this
// host's first heartbeat, and starts the heartbeat and the watch of the
// others. Close stops them and removes this host's entry.
func OpenRegistry(ctx context.Context, js jetstream.JetStream, cfg RegistryConfig) (*Registry, error) {
	if cfg.TTL <= 0 {
		return nil, fmt.Errorf("registry: ttl %v must be positive", cfg.TTL)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Stats == nil {
		cfg.Stats = func() (int, int) { return 0, 0 }
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Bucket == "" {
		cfg.Bucket = HostsBucket
	}
	if !bus.ValidToken(cfg.Self.ID) {
		return nil, fmt.Errorf("registry: host id %q: letters, digits, '_' and '-' only", cfg.Self.ID)
	}
	kv, err := bus.OpenLeaderKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "tether hosts: one heartbeat entry per running host",
		History:     1,
		Replicas:    cfg.Replicas,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, err
	}
	r := &Registry{kv: kv, cfg: cfg, self: cfg.Self, seen: make(map[string]seenHost), stop: make(chan struct{})}
	r.life, r.cancel = context.WithCancel(context.Background())
	if err := r.beat(ctx); err != nil {
		r.cancel()
		return nil, fmt.Errorf("registry: first heartbeat: %w", err)
	}
	// The watch lives until Close (a watch ends with its context).
	w, err := kv.WatchAll(context.WithoutCancel(ctx))
	if err != nil {
		r.cancel()
		return nil, fmt.Errorf("registry: watch hosts: %w", err)
	}
	r.wg.Add(2)
	go r.watch(w)
	go r.heartbeat()
	return r, nil
}

// beat writes this host's entry once.
func (r *Registry) beat(ctx context.Context) error {
	r.mu.Lock()
	info := r.self
	r.mu.Unlock()
	info.Sessions, info.PTYs = r.cfg.Stats()
	info.Beat = r.cfg.Now()
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	if _, err := r.kv.Put(ctx, info.ID, b); err != nil {
		return err
	}
	r.mu.Lock()
	r.lastOK = r.cfg.Now()
	restored := r.fenced
	r.fenced = false
	r.mu.Unlock()
	if restored && r.cfg.OnRestored != nil {
		r.cfg.Log.Warn().Msg("cluster heartbeat written again: serving binds")
		r.cfg.OnRestored()
	}
	return nil
}

// heartbeat writes the entry every TTL/3 until Close, and fences this
// host when none got through for TTL/2.
func (r *Registry) heartbeat() {
	defer r.wg.Done()
	every := r.cfg.TTL / 3
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(r.life, every)
		err := r.beat(ctx)
		cancel()
		if err == nil {
			continue
		}
		r.mu.Lock()
		late := r.cfg.Now().Sub(r.lastOK) >= r.cfg.TTL/2
		fence := late && !r.fenced
		if fence {
			r.fenced = true
		}
		r.mu.Unlock()
		r.cfg.Log.Warn().Err(err).Msg("cluster heartbeat not written")
		if fence && r.cfg.OnFenced != nil {
			r.cfg.Log.Error().Str("ttl", r.cfg.TTL.String()).Msg("no heartbeat for ttl/2: releasing every live session before another host takes them")
			r.cfg.OnFenced()
		}
	}
}

// watch records when each host's entry was last seen to change.
func (r *Registry) watch(w jetstream.KeyWatcher) {
	defer r.wg.Done()
	defer bus.StopWatch(w)
	initial := true
	for {
		select {
		case <-r.stop:
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				initial = false
				continue
			}
			r.saw(e, initial)
		}
	}
}

// saw records entry e. An entry present when this host started is taken
// as seen at its write time by the server's clock, or now if that is
// later: a host already gone for TTL before this one started is gone at
// once, and one still beating is seen again within TTL/3.
func (r *Registry) saw(e jetstream.KeyValueEntry, initial bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(r.seen, e.Key())
		return
	}
	var info HostInfo
	if json.Unmarshal(e.Value(), &info) != nil {
		return
	}
	at := r.cfg.Now()
	if initial && e.Created().Before(at) {
		at = e.Created()
	}
	if old, ok := r.seen[e.Key()]; ok && old.rev == e.Revision() {
		return // the same entry, read again: no sign of life
	}
	r.seen[e.Key()] = seenHost{info: info, at: at, rev: e.Revision()}
}

// Alive reports whether the process instance of host is still in the
// cluster: its entry names that instance and changed within TTL. A host
// the watch says is gone is asked about once more from the bucket's
// leader: a watch that fell behind must not make a live host look dead
// (only an entry unchanged for the TTL does).
func (r *Registry) Alive(ctx context.Context, host, instance string) (bool, error) {
	if host == r.cfg.Self.ID {
		return instance == r.cfg.Self.Instance, nil
	}
	if alive, known := r.aliveSeen(host, instance); known && alive {
		return true, nil
	}
	e, err := r.kv.Get(ctx, host)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		r.mu.Lock()
		delete(r.seen, host)
		r.mu.Unlock()
		return false, nil
	case err != nil:
		return false, fmt.Errorf("host %s: %w", host, err)
	}
	r.saw(e, true)
	alive, _ := r.aliveSeen(host, instance)
	return alive, nil
}

// HostAlive reports whether host is in the cluster, whichever process of
// it runs: what belongs to the host rather than to one process of it (its
// PTYs, kept by a PTY plugin that outlives the host process) is still its
// own after a restart.
func (r *Registry) HostAlive(ctx context.Context, host string) (bool, error) {
	if host == r.cfg.Self.ID {
		return true, nil
	}
	fresh := func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		s, ok := r.seen[host]
		return ok && r.cfg.Now().Sub(s.at) < r.cfg.TTL
	}
	if fresh() {
		return true, nil
	}
	// Gone by the watch: ask the bucket's leader, as Alive does.
	e, err := r.kv.Get(ctx, host)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("host %s: %w", host, err)
	}
	r.saw(e, true)
	return fresh(), nil
}

// aliveSeen is Alive as the watch has it; known is false for a host it
// has not seen.
func (r *Registry) aliveSeen(host, instance string) (alive, known bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.seen[host]
	if !ok {
		return false, false
	}
	return s.info.Instance == instance && r.cfg.Now().Sub(s.at) < r.cfg.TTL, true
}

// Instance is the process instance of host as last seen ("" if unseen).
func (r *Registry) Instance(host string) string {
	if host == r.cfg.Self.ID {
		return r.cfg.Self.Instance
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[host].info.Instance
}

// Fenced reports whether this host could not write its heartbeat for
// TTL/2 (and not since).
func (r *Registry) Fenced() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fenced
}

// HostView is one host as this host sees it: its entry, and how long ago
// this host saw it change.
type HostView struct {
	HostInfo
	// Age is how long ago the entry last changed, on this host's clock.
	Age time.Duration `json:"-"`
	// Alive: Age is within the TTL.
	Alive bool `json:"alive"`
}

// Hosts lists the hosts in the bucket, this one first, then by id.
func (r *Registry) Hosts() []HostView {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.cfg.Now()
	out := make([]HostView, 0, len(r.seen)+1)
	self := r.self
	self.Sessions, self.PTYs = r.cfg.Stats()
	self.Beat = r.lastOK
	out = append(out, HostView{HostInfo: self, Age: now.Sub(r.lastOK), Alive: !r.fenced})
	for id, s := range r.seen {
		if id == self.ID {
			continue
		}
		age := now.Sub(s.at)
		out = append(out, HostView{HostInfo: s.info, Age: age, Alive: age < r.cfg.TTL})
	}
	sort.Slice(out[1:], func(i, j int) bool { return out[1+i].ID < out[1+j].ID })
	return out
}

// Self is this host's id and instance.
func (r *Registry) Self() (id, instance string) { return r.cfg.Self.ID, r.cfg.Self.Instance }

// SetListen records the address the public listener serves (known once
// the transport is up).
func (r *Registry) SetListen(addr string) {
	r.mu.Lock()
	r.self.Listen = addr
	r.mu.Unlock()
}

// Halt stops the heartbeat and the watch and leaves this host's entry in
// the bucket, as a host that was killed does: the others see it gone once
// the entry is TTL old. A later Close does nothing.
func (r *Registry) Halt() {
	select {
	case <-r.stop:
		return
	default:
		close(r.stop)
	}
	r.cancel()
	r.wg.Wait()
}

// Close stops the heartbeat and the watch, then removes this host's
// entry, so that the others know at once it is gone (a clean stop hands
// its sessions back with no TTL wait).
func (r *Registry) Close(ctx context.Context) error {
	select {
	case <-r.stop:
		return nil
	default:
		close(r.stop)
	}
	r.cancel()
	r.wg.Wait()
	if err := r.kv.Delete(ctx, r.cfg.Self.ID); err != nil {
		return fmt.Errorf("registry: remove %s: %w", r.cfg.Self.ID, err)
	}
	return nil
}
