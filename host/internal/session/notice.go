package session

import (
	"encoding/json"

	"github.com/tether-agent/tether/host/internal/notify"
)

// notifyLocked returns the notification of ev in s, filled with the
// session's key and title, whether nobody is connected to it (no page
// or client bound: Web Push pushes only those) and, when ev names a
// run, who started it; s.mu is held. The caller sends it after
// unlocking (tell).
func (s *Session) notifyLocked(ev notify.Event) *notify.Event {
	if s.t.notify == nil {
		return nil
	}
	ev.Session, ev.Title = s.key, s.title
	ev.Unattended = len(s.viewers) == 0
	for _, r := range s.runs {
		if r.RunID == ev.RunID {
			ev.By = r.By
		}
	}
	return &ev
}

// tell hands ev (from notifyLocked) to Config.Notify, with no lock held.
func (t *Table) tell(ev *notify.Event) {
	if ev != nil {
		t.notify(*ev)
	}
}

// toolTitle is the title of an ACP tool call, or "".
func toolTitle(call json.RawMessage) string {
	var c struct {
		Title string `json:"title"`
	}
	_ = json.Unmarshal(call, &c)
	return c.Title
}
