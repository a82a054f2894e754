package acpagent

import (
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/internal/metrics"
)

// TestRestartSeriesFromStart: with an ACP agent configured, its restart
// series (crashed, unresponsive) exist at 0 before anything happened, so
// a rate() or an alert on them works from the start.
func TestRestartSeriesFromStart(t *testing.T) {
	m := metrics.New()
	New(Config{Argv: []string{"true"}, Log: zerolog.Nop(), Metrics: m})
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "tether_plugin_restarts_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["plugin"] == "agent" {
				found[labels["reason"]] = s.GetCounter().GetValue()
			}
		}
	}
	for _, reason := range []string{"crashed", "unresponsive"} {
		if v, ok := found[reason]; !ok || v != 0 {
			t.Errorf("tether_plugin_restarts_total{plugin=agent,reason=%s}: present %v, value %v; want present at 0", reason, ok, v)
		}
	}
}
