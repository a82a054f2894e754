package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"slices"

	"github.com/tether-agent/tether/host"
)

// notifyFlags are tether serve's notification flags (docs/NOTIFICATIONS.md).
type notifyFlags struct {
	webhooks   strList
	secretFile string

	secret []byte // read by validate
}

func addNotifyFlags(fs *flag.FlagSet) *notifyFlags {
	n := &notifyFlags{}
	fs.Var(&n.webhooks, "notify-webhook", "an http(s) `URL` sent a signed JSON POST of each notification: a permission request, a run completed or failed, a terminal exited (repeatable; see docs/NOTIFICATIONS.md)")
	fs.StringVar(&n.secretFile, "notify-secret-file", "", "`file` (mode 0600, at least 16 bytes) holding the secret the webhooks' bodies are signed with (X-Tether-Signature: sha256=HMAC)")
	return n
}

// validate checks the webhooks' URLs and reads the secret file.
func (n *notifyFlags) validate() error {
	for i, u := range n.webhooks {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.Fragment != "" {
			return fmt.Errorf("--notify-webhook: want http(s)://HOST[:PORT][/PATH], got %q", redacted(u))
		}
		if slices.Contains(n.webhooks[:i], u) {
			return fmt.Errorf("--notify-webhook %s given twice", redacted(u))
		}
	}
	if n.secretFile == "" {
		return nil
	}
	if len(n.webhooks) == 0 {
		return errors.New("--notify-secret-file goes with --notify-webhook")
	}
	var err error
	n.secret, err = host.ReadNotifySecret(n.secretFile)
	return err
}

// redacted is u with no path or query (they may hold a secret, as
// Slack's webhook URLs do).
func redacted(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable)"
	}
	return p.Scheme + "://" + p.Host + "/…"
}
