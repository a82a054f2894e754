package client_test

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// TestOverloadRetried: a call answered 5003 with data.retry_after_ms is
// sent again after it, at most Options.OverloadRetries times, and only
// if a second try cannot double the first (prompt.submit: not
// session.create); a 5003 without it (a storage fault) is not retried.
func TestOverloadRetried(t *testing.T) {
	overloaded := &wire.ErrorObject{Code: wire.CodeStorageUnavailable, Message: "storage overloaded; retry after 1 ms (nothing was written)", Data: json.RawMessage(`{"retry_after_ms":1}`)}
	fault := &wire.ErrorObject{Code: wire.CodeStorageUnavailable, Message: "storage unavailable: disk full"}
	var mu sync.Mutex
	seen := map[string]int{} // requests by text (or method)
	refuse := map[string]int{"twice": 2, "always": 100}
	h := newFakeHost(t)
	c, _ := dialGateway(t, h, h.URL, client.Options{OverloadRetries: 3}, func(req wire.Request) (any, *wire.ErrorObject) {
		var p wire.SubmitParams
		_ = json.Unmarshal(req.Params, &p)
		what := req.Method
		if p.Text != "" {
			what = p.Text
		}
		mu.Lock()
		seen[what]++
		n := seen[what]
		mu.Unlock()
		switch {
		case what == "fault":
			return nil, fault
		case req.Method == wire.MethodCreate || n <= refuse[what]:
			return nil, overloaded
		}
		return wire.SubmitResult{Status: "streaming", RunID: "r1"}, nil
	})
	ctx := ctxT(t)
	tests := []struct {
		name     string
		call     func() error
		key      string
		requests int
		retry    bool // the error, if any, is an overload
		ok       bool
	}{
		{"submit served on the third try", func() error { _, err := c.Submit(ctx, "s", "twice"); return err }, "twice", 3, false, true},
		{"submit gives up after the retries", func() error { _, err := c.Submit(ctx, "s", "always"); return err }, "always", 4, true, false},
		{"a storage fault is not retried", func() error { _, err := c.Submit(ctx, "s", "fault"); return err }, "fault", 1, false, false},
		{"create is not retried", func() error { _, err := c.Create(ctx, wire.CreateParams{}); return err }, wire.MethodCreate, 1, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if (err == nil) != tt.ok {
				t.Fatalf("got error %v, want ok=%v", err, tt.ok)
			}
			if d, ok := client.RetryAfter(err); ok != tt.retry || (ok && d != time.Millisecond) {
				t.Errorf("RetryAfter(%v): got %v, %v; want %v", err, d, ok, tt.retry)
			}
			mu.Lock()
			got := seen[tt.key]
			mu.Unlock()
			if got != tt.requests {
				t.Errorf("requests: got %d, want %d", got, tt.requests)
			}
		})
	}
}
