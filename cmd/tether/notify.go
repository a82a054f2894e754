package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/tether-agent/tether/host"
)

// notifyFlags are tether serve's notification flags (docs/NOTIFICATIONS.md).
type notifyFlags struct {
	webhooks   strList
	secretFile string
	// push, pushSubject, pushInsecure: --notify-push and its options.
	push         bool
	pushSubject  string
	pushInsecure bool

	secret  []byte            // read by validate
	plugins []host.PluginSpec // --plugin notify:NAME=PATH
}

// addPlugin adds the notifier plugin of flag (--plugin notify:NAME=PATH).
func (n *notifyFlags) addPlugin(flag, name string, spec host.PluginSpec) error {
	if err := host.CheckTransportName(name); err != nil {
		return fmt.Errorf("--plugin %s: %w", flag, err)
	}
	if slices.ContainsFunc(n.plugins, func(p host.PluginSpec) bool { return p.Name == name }) {
		return fmt.Errorf("--plugin %s: notifier %s given twice", flag, name)
	}
	spec.Name = name
	n.plugins = append(n.plugins, spec)
	return nil
}

func addNotifyFlags(fs *flag.FlagSet) *notifyFlags {
	n := &notifyFlags{}
	fs.Var(&n.webhooks, "notify-webhook", "an http(s) `URL` sent a signed JSON POST of each notification: a permission request, a run completed or failed, a terminal exited (repeatable; see docs/NOTIFICATIONS.md)")
	fs.StringVar(&n.secretFile, "notify-secret-file", "", "`file` (mode 0600, at least 16 bytes) holding the secret the webhooks' bodies are signed with (X-Tether-Signature: sha256=HMAC)")
	fs.BoolVar(&n.push, "notify-push", false, "offer Web Push to the page (\"Notify me\"): VAPID keys made once in the state dir; a browser is pushed what happens while nobody is connected, within its credential's scope (needs the page on https://, see docs/NOTIFICATIONS.md)")
	fs.StringVar(&n.pushSubject, "notify-push-subject", "", "the VAPID `subject` push services may contact: mailto:ADDRESS or an https:// URL (default: --public-url when it is https://, else mailto:tether@localhost)")
	fs.BoolVar(&n.pushInsecure, "notify-push-insecure-endpoints", false, "for tests only: accept http:// push endpoints on loopback (a local push receiver)")
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
	if n.pushSubject != "" && !strings.HasPrefix(n.pushSubject, "mailto:") && !strings.HasPrefix(n.pushSubject, "https://") {
		return fmt.Errorf("--notify-push-subject: want mailto:ADDRESS or an https:// URL, got %q", n.pushSubject)
	}
	if (n.pushSubject != "" || n.pushInsecure) && !n.push {
		return errors.New("--notify-push-subject and --notify-push-insecure-endpoints go with --notify-push")
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

const notifyUsage = `usage: tether notify test [--state-dir DIR] [--timeout D]

Sends one test notification (type "test", not stored nor retried) through
every notifier of the host running on the state dir (--notify-webhook),
through its control socket, and prints what each one answered. Exits 1
when any failed, or when the host has no notifier.

flags:
`

// notifyCmd is `tether notify test`.
func notifyCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tether notify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), notifyUsage)
		fs.PrintDefaults()
	}
	if len(args) == 0 || args[0] != "test" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fs.SetOutput(stdout)
			fs.Usage()
			return 0
		}
		fs.Usage()
		return 2
	}
	stateDir := fs.String("state-dir", defaultStateDir(), "state dir of the running host")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the host and its notifiers")
	if err := parseFlags(fs, args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "tether notify test:", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tether notify test: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	resp, err := host.Control(ctx, *stateDir, host.ControlRequest{Op: host.OpNotifyTest})
	if err != nil {
		fmt.Fprintln(stderr, "tether notify test:", err)
		return 1
	}
	if len(resp.Notifiers) == 0 {
		fmt.Fprintln(stderr, "tether notify test: the host has no notifier (give tether serve --notify-webhook URL or --notify-push)")
		return 1
	}
	code := 0
	for _, r := range resp.Notifiers {
		if r.Error != "" {
			code = 1
			fmt.Fprintf(stdout, "%s: failed: %s\n", r.Notifier, r.Error)
			continue
		}
		fmt.Fprintf(stdout, "%s: ok: %s\n", r.Notifier, r.Answer)
	}
	return code
}
