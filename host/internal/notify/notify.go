// Package notify tells a person when a session needs them — a permission
// request, a run's end, a terminal's exit — through notifiers such as the
// built-in webhook (docs/PROTOCOL.md §19, docs/NOTIFICATIONS.md).
//
// Every notification goes through an outbox: it is stored (once per
// notifier) before it is sent and deleted once delivered, so that a host
// restart or a failing receiver loses none. Delivery is at least once;
// a receiver deduplicates by the event's id, which stays the same across
// attempts and restarts. A failed attempt is retried after 1 s, doubling
// up to a cap, until 24 h after the event; then it is given up.
package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/tether-agent/tether/contract"
)

// The event types.
const (
	// TypePermissionRequested: an agent asks for a permission and waits.
	TypePermissionRequested = "permission.requested"
	// TypeRunCompleted: a run ended with its answer.
	TypeRunCompleted = "run.completed"
	// TypeRunFailed: a run ended with an error.
	TypeRunFailed = "run.failed"
	// TypePTYExited: a terminal's process exited.
	TypePTYExited = "pty.exited"
	// TypeTest: sent by tether notify test, never stored.
	TypeTest = "test"
)

// Errors of the notifiers; test for them with errors.Is.
var (
	// ErrRejected: the receiver answered, but not with success (a webhook:
	// any status but 2xx); the notification is retried.
	ErrRejected = errors.New("notification rejected")
	// ErrClosed: the outbox is closed.
	ErrClosed = errors.New("outbox closed")
)

// Event is one notification, as every notifier receives it (its JSON is
// the webhook's body).
type Event struct {
	// ID is the event's id: the same on every attempt and after a
	// restart, for the receiver to deduplicate by.
	ID string `json:"id"`
	// Type is one of the Type constants.
	Type string `json:"type"`
	// Session is the session's key (not for pty.exited).
	Session string `json:"session,omitempty"`
	// Title is the session's title.
	Title string `json:"title,omitempty"`
	// RunID is the run the event belongs to.
	RunID string `json:"run_id,omitempty"`
	// By names who started the run (the credential's name; empty when
	// not known).
	By string `json:"by,omitempty"`
	// Time is when it happened.
	Time time.Time `json:"time"`
	// Link opens the page on the session or the terminal; it carries no
	// credential (the person signs in as themselves). Empty when the
	// host does not know its public URL.
	Link string `json:"link,omitempty"`
	// RequestID is a permission request's id (permission.requested).
	RequestID string `json:"request_id,omitempty"`
	// Tool names what the agent asks to do (permission.requested), as
	// the agent titled its tool call.
	Tool string `json:"tool,omitempty"`
	// Reason is why a run failed (run.failed).
	Reason string `json:"reason,omitempty"`
	// PTY is the terminal's attach token (pty.exited).
	PTY string `json:"pty,omitempty"`
	// ExitCode is the terminal's process's exit status (pty.exited).
	ExitCode *int `json:"exit_code,omitempty"`
	// Unattended is true when no page or client of the session (or the
	// terminal) was connected when it happened: Web Push pushes only
	// those (docs/NOTIFICATIONS.md, "Web Push").
	Unattended bool `json:"unattended,omitempty"`
}

// Notifier delivers notifications somewhere: a webhook, a plugin.
type Notifier interface {
	// Name names the notifier in logs, metrics and the outbox; it stays
	// the same across restarts for the same configuration.
	Name() string
	// Send delivers body, the JSON of the Event whose id is id, within
	// ctx. It returns the receiver's answer (a webhook: its status line)
	// and nil when the notification was delivered; any error is retried.
	Send(ctx context.Context, id string, body []byte) (answer string, err error)
}

// newID is a new event id.
func newID() string { return contract.RandomHex(16) }

// Link is the link of an event on base, the host's public URL: the page
// on the session key, or on the terminal token; "" when base is.
func Link(base, session, pty string) string {
	if base == "" {
		return ""
	}
	q := url.Values{}
	switch {
	case session != "":
		q.Set("session", session)
	case pty != "":
		q.Set("attach", pty)
	default:
		return strings.TrimRight(base, "/") + "/"
	}
	return strings.TrimRight(base, "/") + "/?" + q.Encode()
}

// encode is an event's body.
func encode(ev Event) ([]byte, error) {
	b, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encode notification %s: %w", ev.ID, err)
	}
	return b, nil
}
