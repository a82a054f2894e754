package notifytest_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/hashicorp/go-plugin"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/testing/notifytest"
)

// poster is a reference notifier plugin: it posts each notification to
// a URL.
type poster struct {
	url    string
	client *http.Client
}

func (p poster) Notify(ctx context.Context, id string, body []byte) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("X-Tether-Event-Id", id)
	resp, err := p.client.Do(req)
	if err != nil {
		return "", err
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return resp.Status, errors.New(resp.Status)
	}
	return resp.Status, nil
}

// TestPluginConformance runs the kit against a notifier served through
// the go-plugin gRPC contract in memory: what the host's side of a
// notifier plugin sees.
func TestPluginConformance(t *testing.T) {
	notifytest.Run(t, func(t *testing.T, r *notifytest.Receiver) contract.Notifier {
		tr := &http.Transport{}
		t.Cleanup(tr.CloseIdleConnections)
		// Closing the client stops the server (go-plugin's helper).
		client, _ := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
			contract.KindNotify: &contract.NotifyPlugin{Impl: poster{url: r.URL, client: &http.Client{Transport: tr}}},
		})
		t.Cleanup(func() { _ = client.Close() })
		raw, err := client.Dispense(contract.KindNotify)
		if err != nil {
			t.Fatal(err)
		}
		return raw.(*contract.NotifyGRPCClient)
	})
}
