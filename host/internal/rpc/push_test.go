package rpc

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/notify"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/testing/pushtest"
	"github.com/tether-agent/tether/wire"
)

// TestPushMethods: push.key answers the VAPID key; push.subscribe
// stores the subscription as the caller's credential's; a bad one is
// -32602; push.unsubscribe deletes only the caller's own.
func TestPushMethods(t *testing.T) {
	w := newScopeWorld(t)
	st := w.gw.store.(*store.Store)
	keys, err := notify.LoadVAPIDKeys(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p, err := notify.NewWebPush(notify.PushConfig{Keys: keys, Subject: "mailto:ops@example.com", Store: st, Insecure: true,
		Reach: func(string, string, string) bool { return false }, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	w.gw.SetPush(p)
	a, b := w.conn(t, "session:A"), w.conn(t, "session:B")
	var key wire.PushKey
	w.call(t, a, wire.MethodPushKey, `{}`, &key)
	if key.Key != keys.Public {
		t.Errorf("push.key: got %q, want %q", key.Key, keys.Public)
	}
	r := pushtest.NewReceiver(t)
	sub, _ := json.Marshal(wire.PushSubscribeParams{Endpoint: r.Endpoint, Keys: wire.PushKeys{P256dh: r.P256dh, Auth: r.Auth}})
	w.call(t, a, wire.MethodPushSubscribe, string(sub), nil)
	subs, err := st.PushSubscriptions(context.Background())
	if err != nil || len(subs) != 1 || subs[0].Credential != w.who["session:A"].Credential || subs[0].Endpoint != r.Endpoint {
		t.Fatalf("stored: got %+v, %v; want one subscription of session:A's credential %s", subs, err, w.who["session:A"].Credential)
	}
	bad, _ := json.Marshal(wire.PushSubscribeParams{Endpoint: "http://push.example/x", Keys: wire.PushKeys{P256dh: r.P256dh, Auth: r.Auth}})
	if _, rerr := w.do(t, a, wire.MethodPushSubscribe, string(bad)); rerr == nil || rerr.Code != wire.CodeInvalidParams {
		t.Errorf("push.subscribe of an http:// endpoint: got %+v, want %d", rerr, wire.CodeInvalidParams)
	}
	unsub := `{"endpoint":"` + r.Endpoint + `"}`
	var res wire.PushUnsubscribed
	w.call(t, b, wire.MethodPushUnsubscribe, unsub, &res)
	if res.Deleted {
		t.Error("push.unsubscribe by another credential: deleted, want kept")
	}
	w.call(t, a, wire.MethodPushUnsubscribe, unsub, &res)
	if !res.Deleted {
		t.Error("push.unsubscribe by its credential: kept, want deleted")
	}
}
