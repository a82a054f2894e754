package notify

import (
	"testing"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/testing/notifytest"
)

// TestWebhookConformance runs the notifiers' conformance kit against the
// built-in webhook.
func TestWebhookConformance(t *testing.T) {
	notifytest.Run(t, func(t *testing.T, r *notifytest.Receiver) contract.Notifier {
		w, err := NewWebhook(r.URL, []byte("0123456789abcdef"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Close)
		return w
	})
}
