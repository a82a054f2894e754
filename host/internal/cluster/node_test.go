package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/cluster/clustertest"
	"github.com/tether-agent/tether/host/internal/cluster/embedded"
)

// TestStartNodeCredentials: a host of an external cluster joins with the
// server's token; with a wrong one StartNode fails at once with an error
// that says the credentials were refused (errors.Is
// nats.ErrAuthorization) and does not quote them.
func TestStartNodeCredentials(t *testing.T) {
	url := clustertest.StartPlain(t, func(o *server.Options) {
		o.Authorization = "the-token"
		o.JetStream, o.StoreDir = true, t.TempDir()
	})
	cfg := NodeConfig{URLs: []string{url}, HostID: "h1", Instance: "i1", TTL: 3 * time.Second, Log: zerolog.Nop()}
	ctx, cancel := context.WithTimeout(t.Context(), clustertest.Timeout)
	defer cancel()

	cfg.Credentials = embedded.Credentials{Token: "a-wrong-token"}
	start := time.Now()
	n, err := StartNode(ctx, cfg)
	if err == nil {
		n.Close(ctx)
		t.Fatal("joined with a wrong token")
	}
	if !errors.Is(err, nats.ErrAuthorization) || !strings.Contains(err.Error(), "refused this host's credentials") || strings.Contains(err.Error(), "a-wrong-token") {
		t.Errorf("error %q, want a refusal of the credentials without them", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("refused after %v, want at once", took)
	}

	cfg.Credentials = embedded.Credentials{Token: "the-token"}
	n, err = StartNode(ctx, cfg)
	if err != nil {
		t.Fatalf("with the token: %v", err)
	}
	n.Close(ctx)
}

// TestJoinWait: a host waiting to join says so once at info level, and
// every later try at debug; one that never waited says nothing.
func TestJoinWait(t *testing.T) {
	var buf bytes.Buffer
	w := &joinWait{log: zerolog.New(&buf).Level(zerolog.DebugLevel)}
	if w.waited() != 0 || buf.Len() != 0 {
		t.Fatalf("before any wait: waited %v, log %q; want 0 and nothing", w.waited(), buf.String())
	}
	w.waiting("jetstream", nil)
	for range 20 {
		w.waiting("ownership bucket", errors.New("context deadline exceeded"))
	}
	var levels []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var e struct{ Level, Message string }
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatal(err)
		}
		if e.Level != "debug" {
			levels = append(levels, e.Level+" "+e.Message)
		}
	}
	if want := "info waiting for the cluster's other servers (quorum)…"; len(levels) != 1 || levels[0] != want {
		t.Errorf("lines above debug: %q, want only %q", levels, want)
	}
	if w.waited() <= 0 {
		t.Errorf("waited %v after waiting, want more than 0", w.waited())
	}
}
