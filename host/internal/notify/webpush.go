package notify

import (
	"context"
	"crypto/ecdh"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	webpush "github.com/SherClockHolmes/webpush-go"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/internal/statedir"
)

// Web Push's limits and settings (docs/NOTIFICATIONS.md, "Web Push").
const (
	// VAPIDFile holds the host's VAPID key pair, in the state dir.
	VAPIDFile = "vapid.json"
	// MaxPushSubscriptions caps the subscriptions of one credential; a
	// push.subscribe past it is refused.
	MaxPushSubscriptions = 10
	// maxEndpoint bounds an endpoint URL's length.
	maxEndpoint = 2048
	// pushTTL is how long a push service keeps a push for a browser that
	// is offline (RFC 8030 TTL).
	pushTTL = 12 * time.Hour
	// maxPushText bounds each text of a push's payload, in bytes.
	maxPushText = 200
	// maxSent bounds the endpoints remembered as pushed for events not
	// yet delivered to every subscription.
	maxSent = 10000
)

// Errors of Web Push subscriptions.
var (
	// ErrBadSubscription: an endpoint or keys a subscription cannot
	// have (not https://, keys that are not a P-256 point and a 16-byte
	// secret).
	ErrBadSubscription = errors.New("bad push subscription")
	// ErrTooManySubscriptions: the credential has MaxPushSubscriptions.
	ErrTooManySubscriptions = errors.New("too many push subscriptions for this credential")
	// ErrNotPushable: the endpoint's address is not a public one (an
	// SSRF guard); refused when dialled.
	ErrNotPushable = errors.New("push endpoint address is not public")
)

// VAPIDKeys is the host's VAPID key pair (RFC 8292), base64url without
// padding: Public is the page's applicationServerKey.
type VAPIDKeys struct {
	Public  string `json:"public"`
	Private string `json:"private"`
}

// LoadVAPIDKeys reads the key pair of dir's VAPIDFile, making it (mode
// 0600) the first time. The file is opened with the state dir's rules:
// never through a link, ours, closed to others.
func LoadVAPIDKeys(dir string) (VAPIDKeys, error) {
	path := filepath.Join(dir, VAPIDFile)
	b, err := statedir.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return makeVAPIDKeys(path)
	}
	if err != nil {
		return VAPIDKeys{}, fmt.Errorf("web push: %w", err)
	}
	var k VAPIDKeys
	if err := json.Unmarshal(b, &k); err != nil {
		return VAPIDKeys{}, fmt.Errorf("web push: %s: %w", path, err)
	}
	if err := k.check(); err != nil {
		return VAPIDKeys{}, fmt.Errorf("web push: %s: %w", path, err)
	}
	return k, nil
}

// makeVAPIDKeys makes a key pair and stores it at path: written whole
// to a file of its own, then linked into place, so that a crash leaves
// no half file and two hosts starting at once keep the first.
func makeVAPIDKeys(path string) (VAPIDKeys, error) {
	priv, pub, err := webpush.GenerateVAPIDKeys()
	if err != nil {
		return VAPIDKeys{}, fmt.Errorf("web push: make the VAPID keys: %w", err)
	}
	k := VAPIDKeys{Public: pub, Private: priv}
	b, _ := json.Marshal(k)
	tmp := path + "." + contract.RandomHex(4) + ".tmp"
	f, err := statedir.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return VAPIDKeys{}, fmt.Errorf("web push: %w", err)
	}
	defer os.Remove(tmp)
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(tmp, path)
	}
	if errors.Is(err, os.ErrExist) {
		return LoadVAPIDKeys(filepath.Dir(path))
	}
	if err != nil {
		return VAPIDKeys{}, fmt.Errorf("web push: store the VAPID keys: %w", err)
	}
	return k, nil
}

// check reports whether k is a P-256 key pair.
func (k VAPIDKeys) check() error {
	priv, err := base64.RawURLEncoding.DecodeString(k.Private)
	if err != nil {
		return fmt.Errorf("VAPID private key: %w", err)
	}
	key, err := ecdh.P256().NewPrivateKey(priv)
	if err != nil {
		return fmt.Errorf("VAPID private key: %w", err)
	}
	if base64.RawURLEncoding.EncodeToString(key.PublicKey().Bytes()) != k.Public {
		return errors.New("VAPID public key is not the private key's")
	}
	return nil
}

// PushConfig configures a WebPush notifier.
type PushConfig struct {
	// Keys is the host's VAPID key pair (LoadVAPIDKeys).
	Keys VAPIDKeys
	// Subject is the VAPID sub: an https:// URL (the host's public URL)
	// or a mailto: address.
	Subject string
	// Store keeps the subscriptions.
	Store store.PushStore
	// Reach reports whether the credential id, now, may view the
	// session of key id (kind "session"), the PTY of token id (kind
	// "pty"), or is admin (kind "admin", id ""); false once it is
	// revoked, expired or unknown. The host answers it from its
	// credential book (host/notify.go).
	Reach func(credential, kind, id string) bool
	// Insecure lets endpoints be http:// and loopback addresses: for
	// tests with a local push endpoint only.
	Insecure bool
	Log      zerolog.Logger
}

// WebPush is the built-in Web Push notifier (RFC 8030, 8291, 8292): it
// pushes each event to the page subscriptions whose credential may see
// its session or terminal, and only events of which nobody was
// connected (Event.Unattended) — and tether notify test's to admin
// credentials. A subscription the push service says is gone (404, 410)
// is deleted; any other failure fails Send, which the outbox retries
// (the subscriptions already pushed to are not pushed again).
type WebPush struct {
	cfg    PushConfig
	client *http.Client
	subs   sync.Mutex // serialises Subscribe's count-then-put

	mu   sync.Mutex                 // guards the fields below
	sent map[string]map[string]bool // event id → endpoints pushed to
}

var _ Notifier = (*WebPush)(nil)

// NewWebPush returns the Web Push notifier of cfg.
func NewWebPush(cfg PushConfig) (*WebPush, error) {
	if err := cfg.Keys.check(); err != nil {
		return nil, fmt.Errorf("web push: %w", err)
	}
	if !strings.HasPrefix(cfg.Subject, "https://") && !strings.HasPrefix(cfg.Subject, "mailto:") {
		return nil, fmt.Errorf("web push: VAPID subject %q: want an https:// URL or a mailto: address", cfg.Subject)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	d := &net.Dialer{Timeout: 10 * time.Second, Control: func(_, address string, _ syscall.RawConn) error {
		return dialable(address, cfg.Insecure)
	}}
	tr.DialContext = d.DialContext
	return &WebPush{cfg: cfg, sent: map[string]map[string]bool{}, client: &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, nil
}

// dialable refuses to connect to an address that is not public (what
// the endpoint's name resolved to): loopback, private, link-local,
// unspecified, multicast — unless insecure, which allows loopback.
func dialable(address string, insecure bool) error {
	hp, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrNotPushable, address)
	}
	a := hp.Addr().Unmap()
	if insecure && a.IsLoopback() {
		return nil
	}
	if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() || !a.IsGlobalUnicast() {
		return fmt.Errorf("%w: %s", ErrNotPushable, a)
	}
	return nil
}

// Close closes the notifier's idle connections.
func (w *WebPush) Close() { w.client.CloseIdleConnections() }

// Name implements Notifier.
func (w *WebPush) Name() string { return "webpush" }

// PublicKey is the VAPID public key, the page's applicationServerKey.
func (w *WebPush) PublicKey() string { return w.cfg.Keys.Public }

// CheckSubscription checks a subscription's endpoint and keys: an
// https:// URL with a host and no user info (http:// to a loopback
// address only when Insecure), a P-256 public key and a 16-byte
// secret, base64url as the browser gives them.
func (w *WebPush) CheckSubscription(endpoint, p256dh, auth string) error {
	u, err := url.Parse(endpoint)
	if err != nil || len(endpoint) > maxEndpoint || u.Host == "" || u.User != nil || u.Fragment != "" {
		return fmt.Errorf("%w: the endpoint is not a URL of at most %d bytes with a host", ErrBadSubscription, maxEndpoint)
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && w.cfg.Insecure && isLoopbackHost(u.Hostname()):
	default:
		return fmt.Errorf("%w: the endpoint must be https://", ErrBadSubscription)
	}
	if ip, err := netip.ParseAddr(u.Hostname()); err == nil && dialable(netip.AddrPortFrom(ip, 443).String(), w.cfg.Insecure) != nil {
		return fmt.Errorf("%w: the endpoint's address %s is not public", ErrBadSubscription, ip)
	}
	key, err := decodeKey(p256dh)
	if err == nil {
		_, err = ecdh.P256().NewPublicKey(key)
	}
	if err != nil {
		return fmt.Errorf("%w: keys.p256dh is not a P-256 public key", ErrBadSubscription)
	}
	if secret, err := decodeKey(auth); err != nil || len(secret) != 16 {
		return fmt.Errorf("%w: keys.auth is not a 16-byte secret", ErrBadSubscription)
	}
	return nil
}

func isLoopbackHost(h string) bool {
	ip, err := netip.ParseAddr(h)
	return err == nil && ip.IsLoopback()
}

// decodeKey decodes base64url, padded or not.
func decodeKey(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}

// Subscribe stores the subscription of credential (checked with
// CheckSubscription; at most MaxPushSubscriptions per credential, one
// that subscribes again counting once).
func (w *WebPush) Subscribe(ctx context.Context, credential, endpoint, p256dh, auth string) error {
	if credential == "" {
		return fmt.Errorf("%w: only a stored credential may subscribe", ErrBadSubscription)
	}
	if err := w.CheckSubscription(endpoint, p256dh, auth); err != nil {
		return err
	}
	w.subs.Lock()
	defer w.subs.Unlock()
	all, err := w.cfg.Store.PushSubscriptions(ctx)
	if err != nil {
		return fmt.Errorf("web push: %w", err)
	}
	n := 0
	for _, s := range all {
		if s.Endpoint == endpoint && s.Credential != credential {
			// Another's endpoint is not taken over: it is that
			// browser's, and only its subscriber may change it.
			return fmt.Errorf("%w: the endpoint is another credential's", ErrBadSubscription)
		}
		if s.Credential == credential && s.Endpoint != endpoint {
			n++
		}
	}
	if n >= MaxPushSubscriptions {
		return ErrTooManySubscriptions
	}
	if err := w.cfg.Store.PutPushSubscription(ctx, store.PushSubscription{Endpoint: endpoint, P256dh: p256dh, Auth: auth, Credential: credential, Created: time.Now()}); err != nil {
		return fmt.Errorf("web push: %w", err)
	}
	return nil
}

// Unsubscribe deletes the subscription of endpoint when it is
// credential's (or admin is true); it reports whether one was deleted.
func (w *WebPush) Unsubscribe(ctx context.Context, credential, endpoint string, admin bool) (bool, error) {
	w.subs.Lock()
	defer w.subs.Unlock()
	all, err := w.cfg.Store.PushSubscriptions(ctx)
	if err != nil {
		return false, fmt.Errorf("web push: %w", err)
	}
	for _, s := range all {
		if s.Endpoint == endpoint && (admin || s.Credential == credential) {
			if err := w.cfg.Store.DeletePushSubscription(ctx, endpoint); err != nil {
				return false, fmt.Errorf("web push: %w", err)
			}
			return true, nil
		}
	}
	return false, nil
}

// The kinds of Reach.
const (
	ReachAdmin   = "admin"
	ReachSession = "session"
	ReachPTY     = "pty"
)

// pushable reports whether ev is pushed to a subscription of
// credential: a test event to admin only; others only when nobody was
// connected, and to a credential that may view the session or the
// terminal (reach is PushConfig.Reach).
func pushable(reach func(credential, kind, id string) bool, credential string, ev Event) bool {
	if ev.Type == TypeTest {
		return reach(credential, ReachAdmin, "")
	}
	if !ev.Unattended {
		return false
	}
	switch {
	case ev.Session != "":
		return reach(credential, ReachSession, ev.Session)
	case ev.PTY != "":
		return reach(credential, ReachPTY, ev.PTY)
	}
	return false
}

// pushPayload is what a push carries: the event's JSON, small (a push
// holds about 4 KiB), its texts cut to maxPushText bytes.
func pushPayload(ev Event) ([]byte, error) {
	p := Event{ID: ev.ID, Type: ev.Type, Session: ev.Session, Title: cut(ev.Title), RunID: ev.RunID, By: cut(ev.By),
		Time: ev.Time, Link: ev.Link, RequestID: ev.RequestID, Tool: cut(ev.Tool), Reason: cut(ev.Reason),
		PTY: ev.PTY, ExitCode: ev.ExitCode, Unattended: ev.Unattended}
	if len(p.Link) > maxEndpoint {
		p.Link = ""
	}
	return encode(p)
}

// cut shortens s to at most maxPushText bytes, on a rune's boundary.
func cut(s string) string {
	if len(s) <= maxPushText {
		return s
	}
	n := maxPushText
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// Send implements Notifier: it pushes body's event to every
// subscription it is for. It answers how many it pushed to.
func (w *WebPush) Send(ctx context.Context, id string, body []byte) (string, error) {
	var ev Event
	if err := json.Unmarshal(body, &ev); err != nil {
		return "", fmt.Errorf("webpush: %w", err)
	}
	payload, err := pushPayload(ev)
	if err != nil {
		return "", err
	}
	all, err := w.cfg.Store.PushSubscriptions(ctx)
	if err != nil {
		return "", fmt.Errorf("webpush: %w", err)
	}
	var errs []error
	pushed, gone := 0, 0
	for _, s := range all {
		if !pushable(w.cfg.Reach, s.Credential, ev) || w.wasSent(id, s.Endpoint) {
			continue
		}
		status, err := w.push(ctx, id, ev, payload, s)
		switch {
		case err != nil:
			errs = append(errs, err)
		case status == http.StatusNotFound || status == http.StatusGone:
			gone++
			if derr := w.cfg.Store.DeletePushSubscription(ctx, s.Endpoint); derr != nil {
				errs = append(errs, fmt.Errorf("webpush: %w", derr))
				continue
			}
			w.cfg.Log.Info().Str("credential", s.Credential).Msg("a push subscription is gone: deleted")
		case status < 200 || status > 299:
			errs = append(errs, fmt.Errorf("webpush: the push service answered %d: %w", status, ErrRejected))
		default:
			pushed++
			w.markSent(id, s.Endpoint)
		}
	}
	answer := fmt.Sprintf("pushed to %d subscriptions", pushed)
	if gone > 0 {
		answer += fmt.Sprintf(", %d gone (deleted)", gone)
	}
	if err := errors.Join(errs...); err != nil {
		return answer, err
	}
	w.mu.Lock()
	delete(w.sent, id)
	w.mu.Unlock()
	return answer, nil
}

// push sends one push and returns the push service's status.
func (w *WebPush) push(ctx context.Context, id string, ev Event, payload []byte, s store.PushSubscription) (int, error) {
	urgency := webpush.UrgencyNormal
	if ev.Type == TypePermissionRequested {
		urgency = webpush.UrgencyHigh
	}
	subject := w.cfg.Subject
	if m, ok := strings.CutPrefix(subject, "mailto:"); ok {
		subject = m // the library adds mailto: to what is not https:
	}
	opts := &webpush.Options{
		HTTPClient:      idClient{w.client, id},
		Subscriber:      subject,
		TTL:             int(pushTTL / time.Second),
		Urgency:         urgency,
		VAPIDPublicKey:  w.cfg.Keys.Public,
		VAPIDPrivateKey: w.cfg.Keys.Private,
	}
	if len(id) <= 32 && !strings.ContainsFunc(id, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
	}) {
		opts.Topic = id // a push service keeps one of the retries of a pending push
	}
	resp, err := webpush.SendNotificationWithContext(ctx, payload, &webpush.Subscription{
		Endpoint: s.Endpoint, Keys: webpush.Keys{P256dh: s.P256dh, Auth: s.Auth}}, opts)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // not the endpoint: it is the browser's capability
		}
		return 0, fmt.Errorf("webpush: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// idClient adds the event's id (IDHeader) to a push's request.
type idClient struct {
	c  *http.Client
	id string
}

func (c idClient) Do(r *http.Request) (*http.Response, error) {
	r.Header.Set(IDHeader, c.id)
	r.Header.Set("User-Agent", "tether-notify")
	return c.c.Do(r)
}

func (w *WebPush) wasSent(id, endpoint string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent[id][endpoint]
}

func (w *WebPush) markSent(id, endpoint string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.sent) >= maxSent {
		clear(w.sent) // at worst, a retry pushes again (at least once)
	}
	if w.sent[id] == nil {
		w.sent[id] = map[string]bool{}
	}
	w.sent[id][endpoint] = true
}

var _ contract.Notifier = (*WebPush)(nil)

// Notify implements contract.Notifier (what testing/notifytest checks):
// it is Send.
func (w *WebPush) Notify(ctx context.Context, id string, body []byte) (string, error) {
	return w.Send(ctx, id, body)
}
