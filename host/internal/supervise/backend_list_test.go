package supervise

import (
	"context"
	"errors"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/ptyroute"
)

func TestBackendListNotServing(t *testing.T) {
	b := NewBackend(Options{StateDir: t.TempDir(), Log: zerolog.Nop()}, PluginSpec{Name: "pty", Path: "/nonexistent"},
		contract.BackendConfig{}, ptyroute.New(zerolog.Nop(), metrics.New(), 0, 0))
	ptys, err := b.List(context.Background())
	if !errors.Is(err, ErrNotServing) || ptys != nil {
		t.Errorf("List before Start: %v, %v; want ErrNotServing", ptys, err)
	}
}
