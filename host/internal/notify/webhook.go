package notify

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/tether-agent/tether/contract"
)

// SignatureHeader carries a webhook body's signature:
// "sha256=" and the lower-case hex HMAC-SHA256 of the body with the
// secret of --notify-secret-file.
const SignatureHeader = "X-Tether-Signature"

// IDHeader repeats the event's id, for receivers that deduplicate before
// reading the body.
const IDHeader = "X-Tether-Event-Id"

// Webhook is the built-in notifier of --notify-webhook: a JSON POST of
// each event, signed when it has a secret. Any answer but 2xx, a
// redirect included, is a failure (retried).
type Webhook struct {
	url    string
	name   string
	secret []byte
	client *http.Client
}

var _ Notifier = (*Webhook)(nil)

// NewWebhook returns the webhook posting to rawURL (http or https),
// signing with secret (none: unsigned).
func NewWebhook(rawURL string, secret []byte) (*Webhook, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("notify webhook: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("notify webhook %q: want an http:// or https:// URL", u.Redacted())
	}
	sum := sha256.Sum256([]byte(rawURL))
	return &Webhook{
		url: rawURL,
		// The URL may hold a secret (Slack's do): the name shows its host
		// and a digest of the rest.
		name:   "webhook:" + u.Host + ":" + hex.EncodeToString(sum[:4]),
		secret: secret,
		client: &http.Client{
			Transport:     http.DefaultTransport.(*http.Transport).Clone(),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}, nil
}

// Close closes the webhook's idle connections.
func (w *Webhook) Close() { w.client.CloseIdleConnections() }

// Name implements Notifier: "webhook:HOST:DIGEST", where DIGEST is the
// start of the URL's SHA-256.
func (w *Webhook) Name() string { return w.name }

// Sign is the value of SignatureHeader for body signed with secret.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Send implements Notifier: it POSTs body and answers the status line.
func (w *Webhook) Send(ctx context.Context, id string, body []byte) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("%s: %w", w.name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "tether-notify")
	req.Header.Set(IDHeader, id)
	if len(w.secret) > 0 {
		req.Header.Set(SignatureHeader, Sign(w.secret, body))
	}
	resp, err := w.client.Do(req)
	if err != nil {
		// Not the *url.Error: it quotes the URL, which may hold a secret.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", fmt.Errorf("%s: %w", w.name, err)
	}
	// Read a little, so that the connection can be kept.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.Status, fmt.Errorf("%s answered %s: %w", w.name, resp.Status, ErrRejected)
	}
	return resp.Status, nil
}

var _ contract.Notifier = (*Webhook)(nil)

// Notify implements contract.Notifier (the notifier plugins' interface,
// which testing/notifytest checks): it is Send.
func (w *Webhook) Notify(ctx context.Context, id string, body []byte) (string, error) {
	return w.Send(ctx, id, body)
}
