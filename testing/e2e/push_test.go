package e2e_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/tether-agent/tether/testing/pushtest"
	"github.com/tether-agent/tether/testing/wsclient"
	"github.com/tether-agent/tether/wire"
)

// pushSubscribe subscribes r's endpoint on c (push.subscribe).
func pushSubscribe(t *testing.T, c *wsclient.Client, r *pushtest.Receiver) {
	t.Helper()
	call(t, c, wire.MethodPushSubscribe, wire.PushSubscribeParams{Endpoint: r.Endpoint, Keys: wire.PushKeys{P256dh: r.P256dh, Auth: r.Auth}}, nil)
}

// TestNotifyWebPush: subscriptions made over /api/ws by scoped
// credentials; a permission request of session A while its viewer is
// connected pushes nothing; one asked while nobody is connected is one
// push to session A's subscription, decrypted at the local endpoint
// (VAPID JWT checked) to the event with its link. session B's
// subscription and a revoked credential's get nothing.
func TestNotifyWebPush(t *testing.T) {
	h := startACPHost(t, acpHostConfig{Args: []string{"--notify-push", "--notify-push-insecure-endpoints", "--public-url", "https://tether.example/t"}})
	admin := h.Dial(t)
	var key wire.PushKey
	call(t, admin, wire.MethodPushKey, nil, &key)
	if key.Key == "" {
		t.Fatal("push.key: empty")
	}
	var a, b struct {
		SessionID  string `json:"session_id"`
		SessionKey string `json:"session_key"`
	}
	call(t, admin, "session.create", map[string]any{"title": "A"}, &a)
	call(t, admin, "session.create", map[string]any{"title": "B"}, &b)
	credA := tokenCreate(t, h.Server, "pa", "--scope", "session:"+a.SessionKey+":view")
	credB := tokenCreate(t, h.Server, "pb", "--scope", "session:"+b.SessionKey)
	credGone := tokenCreate(t, h.Server, "pgone", "--scope", "session:"+a.SessionKey)
	rA, rB, rGone := pushtest.NewReceiver(t), pushtest.NewReceiver(t), pushtest.NewReceiver(t)
	// A's last: a push to the others, were it made, would come first.
	pushSubscribe(t, as(h.Server, credB.Secret).Dial(t), rB)
	pushSubscribe(t, as(h.Server, credGone.Secret).Dial(t), rGone)
	pushSubscribe(t, as(h.Server, credA.Secret).Dial(t), rA)
	tokenRevoke(t, h.Server, "pgone")

	// With its viewer connected: a permission request and the run's end
	// push nothing.
	call(t, admin, "prompt.submit", map[string]any{"session_id": a.SessionID, "text": "permission"}, nil)
	pr, _ := waitPermissionEvent(t, admin, "permission.request")
	var reqID string
	if err := json.Unmarshal(pr.RequestID, &reqID); err != nil {
		t.Fatal(err)
	}
	call(t, admin, "permission.respond", map[string]any{"session_id": a.SessionID, "request_id": reqID, "option_id": "allow"}, nil)
	waitComplete(t, admin, a.SessionID)

	// Nobody connected: the agent asks once the viewer is gone.
	gate := filepath.Join(t.TempDir(), "ask")
	var sub struct {
		RunID string `json:"run_id"`
	}
	call(t, admin, "prompt.submit", map[string]any{"session_id": a.SessionID, "text": "permission " + gate}, &sub)
	admin.Close()
	obs := h.Dial(t)
	waitViewers(t, obs, a.SessionKey, 0)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p := rA.Wait(t, 1)
	var ev struct {
		ID, Type, Session, Link string
		RequestID               string `json:"request_id"`
		RunID                   string `json:"run_id"`
	}
	if err := json.Unmarshal(p[0].Payload, &ev); err != nil {
		t.Fatalf("decrypted payload %q: %v", p[0].Payload, err)
	}
	if ev.Type != "permission.requested" || ev.Session != a.SessionKey || ev.RunID != sub.RunID || ev.RequestID == "" || ev.ID == "" {
		t.Errorf("push: got %s, want permission.requested of run %s in session %s", p[0].Payload, sub.RunID, a.SessionKey)
	}
	if want := "https://tether.example/t/?session=" + a.SessionKey; ev.Link != want {
		t.Errorf("push link: got %q, want %q", ev.Link, want)
	}
	if p[0].VAPIDKey != key.Key {
		t.Errorf("push signed by %s, want push.key's %s", p[0].VAPIDKey, key.Key)
	}
	if n := len(rA.Pushes()); n != 1 {
		t.Errorf("session A's subscription: %d pushes, want 1 (none while its viewer was connected)", n)
	}
	if n := len(rB.Pushes()); n != 0 {
		t.Errorf("session B's subscription: %d pushes about session A, want 0", n)
	}
	if n := len(rGone.Pushes()); n != 0 {
		t.Errorf("a revoked credential's subscription: %d pushes, want 0", n)
	}
}
