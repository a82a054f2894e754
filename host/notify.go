package host

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/notify"
	"github.com/tether-agent/tether/host/internal/supervise"
	"github.com/tether-agent/tether/host/store"
)

// outboxFile is a cluster member's outbox, in its state dir: a cluster's
// notifications are each host's own (the host that runs a session's
// agent tells of it), kept where that host alone reads them.
const outboxFile = "outbox.db"

// startNotify makes the notifiers (--notify-webhook, and the notifier
// plugins, started here) and starts the
// outbox, which sends what the last host left in it. On a single host
// the outbox is in state.db; a cluster member keeps its own in
// <state-dir>/outbox.db.
func (h *hostParts) startNotify(ctx context.Context) error {
	var ns []notify.Notifier
	for _, u := range h.cfg.NotifyWebhooks {
		w, err := notify.NewWebhook(u, h.cfg.NotifySecret)
		if err != nil {
			return err
		}
		ns = append(ns, w)
	}
	for _, spec := range h.cfg.Notifiers {
		sup := supervise.NewNotifier(h.supervise(), spec)
		if err := sup.Start(ctx); err != nil {
			h.stopNotifyPlugins(ctx)
			return err
		}
		h.notifyPlugins = append(h.notifyPlugins, sup)
		ns = append(ns, pluginNotifier{sup})
	}
	if len(ns) == 0 && !h.cfg.NotifyPush {
		return nil
	}
	if len(h.cfg.NotifyWebhooks) > 0 && len(h.cfg.NotifySecret) == 0 {
		h.cfg.Log.Warn().Msg("webhook notifications are not signed: give --notify-secret-file")
	}
	ob, ok := h.st.(store.Outbox)
	ps, _ := h.st.(store.PushStore)
	if h.node != nil || !ok || ps == nil {
		st, err := store.Open(ctx, filepath.Join(h.cfg.StateDir, outboxFile))
		if err != nil {
			h.stopNotifyPlugins(ctx)
			return fmt.Errorf("notifications: open the outbox: %w", err)
		}
		h.notifyStore, ob, ps = st, st, st
	}
	if h.cfg.NotifyPush {
		w, err := h.newWebPush(ps)
		if err != nil {
			if h.notifyStore != nil {
				_ = h.notifyStore.Close()
			}
			h.stopNotifyPlugins(ctx)
			return err
		}
		h.push = w
		ns = append(ns, w)
	}
	o, err := notify.New(notify.Config{Store: ob, Notifiers: ns, LinkBase: h.cfg.PublicURL, Log: h.cfg.Log.With().Str("part", "notify").Logger(), Metrics: h.m})
	if err == nil {
		err = o.Start(ctx)
	}
	if err != nil {
		if h.notifyStore != nil {
			_ = h.notifyStore.Close()
		}
		h.stopNotifyPlugins(ctx)
		return err
	}
	h.outbox = o
	return nil
}

// newWebPush makes the Web Push notifier of --notify-push: its VAPID
// keys made once in the state dir, its subscriptions in ps (a cluster
// member's own outbox.db: each host pushes of the sessions it runs, to
// the subscriptions made on it), each pushed what its credential may
// see at the time of the push.
func (h *hostParts) newWebPush(ps store.PushStore) (*notify.WebPush, error) {
	keys, err := notify.LoadVAPIDKeys(h.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	subject := h.cfg.NotifyPushSubject
	if subject == "" {
		subject = "mailto:tether@localhost"
		if strings.HasPrefix(h.cfg.PublicURL, "https://") {
			subject = h.cfg.PublicURL
		}
	}
	return notify.NewWebPush(notify.PushConfig{Keys: keys, Subject: subject, Store: ps, Reach: pushReach(h.creds),
		Insecure: h.cfg.NotifyPushInsecure, Log: h.cfg.Log.With().Str("part", "notify").Str("notifier", "webpush").Logger()})
}

// pushReach is Web Push's scope rule, from the credential book: a
// subscription is pushed an event of a session or PTY only while its
// credential (not revoked, not expired) may view it; a test event only
// when it is admin.
func pushReach(b *access.Book) func(credential, kind, id string) bool {
	return func(credential, kind, id string) bool {
		if b == nil {
			return false
		}
		scopes := b.Scopes(credential) // nil once revoked or expired
		switch kind {
		case notify.ReachAdmin:
			return access.IsAdmin(scopes)
		case notify.ReachSession:
			return access.Can(scopes, access.ScopeSession, id, false)
		case notify.ReachPTY:
			return access.Can(scopes, access.ScopePTY, id, false)
		}
		return false
	}
}

// pluginNotifier is a notifier plugin as the outbox sends to it.
type pluginNotifier struct{ sup *supervise.Notifier }

func (p pluginNotifier) Name() string { return "plugin:" + p.sup.Name() }

func (p pluginNotifier) Send(ctx context.Context, id string, body []byte) (string, error) {
	return p.sup.Notify(ctx, id, body)
}

// stopNotifyPlugins stops the notifier plugins.
func (h *hostParts) stopNotifyPlugins(ctx context.Context) {
	for _, sup := range h.notifyPlugins {
		sup.Stop(ctx)
	}
	h.notifyPlugins = nil
}

// stopNotify stops the outbox (what is not yet delivered stays stored
// for the next host).
func (h *hostParts) stopNotify(ctx context.Context) error {
	if h.outbox != nil {
		h.outbox.Close()
	}
	h.stopNotifyPlugins(ctx)
	if h.notifyStore != nil {
		return h.notifyStore.Close()
	}
	return nil
}

// notifyFunc is the session table's Config.Notify: nil with no notifier.
func (h *hostParts) notifyFunc() func(notify.Event) {
	if h.outbox == nil {
		return nil
	}
	return h.outbox.Enqueue
}

// ptyExitFunc tells the outbox of a PTY's exit; nil with no notifier.
func (h *hostParts) ptyExitFunc() func(token string, code int, attended bool) {
	if h.outbox == nil {
		return nil
	}
	return func(token string, code int, attended bool) {
		h.outbox.Enqueue(notify.Event{Type: notify.TypePTYExited, PTY: token, ExitCode: &code, Unattended: !attended})
	}
}

// NotifyResult is one notifier's answer to tether notify test.
type NotifyResult struct {
	Notifier string `json:"notifier"`
	Answer   string `json:"answer,omitempty"`
	Error    string `json:"error,omitempty"`
}

// testNotify sends one test notification to every notifier.
func (h *hostParts) testNotify(ctx context.Context) []NotifyResult {
	if h.outbox == nil {
		return nil
	}
	var out []NotifyResult
	for _, r := range h.outbox.Test(ctx) {
		nr := NotifyResult{Notifier: r.Notifier, Answer: r.Answer}
		if r.Err != nil {
			nr.Error = r.Err.Error()
		}
		out = append(out, nr)
	}
	return out
}

// MinNotifySecretBytes is the shortest secret --notify-secret-file may
// hold.
const MinNotifySecretBytes = 16

// ReadNotifySecret reads --notify-secret-file: a regular file of this
// user's, readable and writable by nobody else, of at least
// MinNotifySecretBytes (surrounding white space aside).
func ReadNotifySecret(path string) ([]byte, error) {
	b, err := readOwnFile("--notify-secret-file", path, os.Getuid())
	if err != nil {
		return nil, err
	}
	if len(b) < MinNotifySecretBytes {
		return nil, fmt.Errorf("--notify-secret-file %s: %d bytes, want at least %d (make one with: (umask 077; openssl rand -hex 32 > FILE))", path, len(b), MinNotifySecretBytes)
	}
	return b, nil
}

// notifyControl answers OpNotifyTest on the control socket, adds the
// notifier plugins to OpList's, reloads a notifier plugin (OpReload of
// its name: a fresh process, of Path when given), and hands every other
// request to next. A notifier plugin is not stopped or unloaded on its
// own: what it would deliver would pile up in the outbox.
func (h *hostParts) notifyControl(next func(context.Context, ControlRequest) (ControlResponse, error)) func(context.Context, ControlRequest) (ControlResponse, error) {
	var handle func(context.Context, ControlRequest) (ControlResponse, error)
	handle = func(ctx context.Context, req ControlRequest) (ControlResponse, error) {
		switch req.Op {
		case OpList:
			resp, err := next(ctx, req)
			for _, sup := range h.notifyPlugins {
				resp.Plugins = append(resp.Plugins, sup.Status())
			}
			return resp, err
		case OpNotifyTest:
			return ControlResponse{Notifiers: h.testNotify(ctx)}, nil
		case OpReload, OpStop, OpUnload:
			sup := h.notifyPlugin(req.Name)
			if sup == nil {
				return next(ctx, req)
			}
			if req.Op != OpReload {
				return ControlResponse{}, fmt.Errorf("plugin %s is a notifier: it is not stopped on its own (its notifications would pile up); reload it to swap it for a fresh process", req.Name)
			}
			var spec *supervise.PluginSpec
			if req.Path != "" {
				if !filepath.IsAbs(req.Path) {
					return ControlResponse{}, fmt.Errorf("plugin path %q is not absolute", req.Path)
				}
				spec = &supervise.PluginSpec{Path: req.Path, SHA256: req.SHA256}
			}
			if _, err := sup.Reload(ctx, spec); err != nil {
				return ControlResponse{}, fmt.Errorf("reload %s: %w", req.Name, err)
			}
			return handle(ctx, ControlRequest{Op: OpList})
		}
		return next(ctx, req)
	}
	return handle
}

// notifyPlugin is the notifier plugin named name, or nil.
func (h *hostParts) notifyPlugin(name string) *supervise.Notifier {
	for _, sup := range h.notifyPlugins {
		if sup.Name() == name {
			return sup
		}
	}
	return nil
}
