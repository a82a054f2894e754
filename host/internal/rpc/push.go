package rpc

import (
	"context"
	"errors"
	"time"

	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/notify"
	"github.com/tether-agent/tether/wire"
)

// Push is the host's Web Push, as push.* serve it (*notify.WebPush).
type Push interface {
	// PublicKey is the VAPID public key.
	PublicKey() string
	// Subscribe stores a subscription of the credential.
	Subscribe(ctx context.Context, credential, endpoint, p256dh, auth string) error
	// Unsubscribe deletes the subscription of endpoint when it is the
	// credential's (or admin).
	Unsubscribe(ctx context.Context, credential, endpoint string, admin bool) (bool, error)
}

var _ Push = (*notify.WebPush)(nil)

// SetPush gives the gateway the host's Web Push; without it push.*
// answer -32601. Call it before the first connection.
func (g *Gateway) SetPush(p Push) { g.push = p }

// errNoPush answers push.* on a host without Web Push.
var errNoPush = errorf(wire.CodeMethodNotFound, "web push is not enabled on this host (tether serve --notify-push)")

func (c *conn) pushKey(call, params) (any, error) {
	if c.gw.push == nil {
		return nil, errNoPush
	}
	return wire.PushKey{Key: c.gw.push.PublicKey()}, nil
}

// pushSubscribe stores the caller's browser's subscription, as its
// credential's: what it is pushed is what that credential may see, at
// the time of each push (docs/NOTIFICATIONS.md, "Web Push").
func (c *conn) pushSubscribe(_ call, p params) (any, error) {
	if c.gw.push == nil {
		return nil, errNoPush
	}
	var req wire.PushSubscribeParams
	if err := decodeInto(p, &req); err != nil {
		return nil, err
	}
	if c.who.Credential == "" {
		return nil, errorf(wire.CodeInvalidParams, "push.subscribe needs a credential of this host's (a token or a page sign-in), not a proxy's user")
	}
	ctx, cancel := context.WithTimeout(c.gw.ctx, 10*time.Second)
	defer cancel()
	err := c.gw.push.Subscribe(ctx, c.who.Credential, req.Endpoint, req.Keys.P256dh, req.Keys.Auth)
	switch {
	case errors.Is(err, notify.ErrBadSubscription), errors.Is(err, notify.ErrTooManySubscriptions):
		return nil, errorf(wire.CodeInvalidParams, "%v", err)
	case err != nil:
		return nil, errorf(wire.CodeStorageUnavailable, "storage unavailable: %v", err)
	}
	c.log.Info().Str("credential", c.who.Credential).Str("by", c.who.Name).Msg("push subscription stored")
	return map[string]bool{"subscribed": true}, nil
}

func (c *conn) pushUnsubscribe(_ call, p params) (any, error) {
	if c.gw.push == nil {
		return nil, errNoPush
	}
	var req wire.PushUnsubscribeParams
	if err := decodeInto(p, &req); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.gw.ctx, 10*time.Second)
	defer cancel()
	deleted, err := c.gw.push.Unsubscribe(ctx, c.who.Credential, req.Endpoint, access.IsAdmin(c.scopes()))
	if err != nil {
		return nil, errorf(wire.CodeStorageUnavailable, "storage unavailable: %v", err)
	}
	return wire.PushUnsubscribed{Deleted: deleted}, nil
}
