package owners

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tether-agent/tether/host/internal/cluster/bus"
)

// PTYsBucket is the KV bucket that places the cluster's PTYs: one entry
// per attach token, naming the host that got its first attach.
const PTYsBucket = "tether_ptys"

// ptyPlace is a PTY's entry: its host, and that host's process instance
// when it claimed the token.
type ptyPlace struct {
	Host     string `json:"host"`
	Instance string `json:"instance"`
}

// PTYPlaces places PTYs on hosts (ptyroute.Remote's Locate).
type PTYPlaces struct {
	kv  jetstream.KeyValue
	reg *Registry
}

// OpenPTYPlaces opens the PTYs bucket, creating it if needed.
func OpenPTYPlaces(ctx context.Context, js jetstream.JetStream, reg *Registry, replicas int) (*PTYPlaces, error) {
	kv, err := bus.OpenLeaderKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      PTYsBucket,
		Description: "tether PTYs: the host of each attach token",
		History:     1,
		Replicas:    max(replicas, 1),
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, err
	}
	return &PTYPlaces{kv: kv, reg: reg}, nil
}

// Locate claims token for this host with a KV Create (of two first
// attaches on two hosts at once, one creates the entry and the other
// finds it), or returns the live host holding it and that host's process
// now. A token belongs to its host, not to one process of it (a restarted
// host reattaches its PTY plugin, PTYs included); one whose host left the cluster is taken over by a
// revision-checked update, so its next attach starts a PTY here.
func (p *PTYPlaces) Locate(ctx context.Context, token string) (host, inst string, err error) {
	self, selfInst := p.reg.Self()
	mine, _ := json.Marshal(ptyPlace{Host: self, Instance: selfInst})
	for range maxTakeoverTries {
		_, err := p.kv.Create(ctx, token, mine)
		if err == nil {
			return "", "", nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", "", fmt.Errorf("claim pty %s: %w", token, err)
		}
		e, err := p.kv.Get(ctx, token)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return "", "", fmt.Errorf("pty %s: %w", token, err)
		}
		var at ptyPlace
		if err := json.Unmarshal(e.Value(), &at); err != nil {
			return "", "", fmt.Errorf("pty %s: entry: %w", token, err)
		}
		if at.Host == self {
			return "", "", nil
		}
		alive, err := p.reg.HostAlive(ctx, at.Host)
		if err != nil {
			return "", "", err
		}
		if alive {
			return at.Host, p.reg.Instance(at.Host), nil
		}
		if _, err := p.kv.Update(ctx, token, mine, e.Revision()); err == nil {
			return "", "", nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) && !bus.WrongLastSequence(err) {
			return "", "", fmt.Errorf("take pty %s: %w", token, err)
		}
	}
	return "", "", fmt.Errorf("pty %s: its entry kept changing", token)
}
