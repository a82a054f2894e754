package e2e_test

import (
	"testing"

	"github.com/tether-agent/tether/testing/e2e"
)

// TestMetricsFromStart scrapes a fresh host, before any call: every
// series a dashboard or an alert rule watches is there from the start, at
// 0 (or empty), not only once something happened. A missing series fails
// (presence is checked, not a sum that reads 0 for a missing one).
func TestMetricsFromStart(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--admin-listen", "127.0.0.1:0"}})
	series := [][]string{
		{"tether_build_info"},
		{"tether_store_errors_total"},
		{"tether_plugin_restarts_total", "plugin=ws", "reason=crashed"},
		{"tether_plugin_restarts_total", "plugin=ws", "reason=unresponsive"},
		{"tether_plugin_restarts_total", "plugin=pty", "reason=crashed"},
		{"tether_plugin_restarts_total", "plugin=pty", "reason=unresponsive"},
		{"tether_plugin_reloads_total", "plugin=ws"},
		{"tether_pty_attach_duration_seconds_count"},
		{"tether_cluster_hosts", "state=alive"},
		{"tether_cluster_hosts", "state=gone"},
		{"tether_cluster_relay_legs", "direction=in"},
		{"tether_cluster_relay_legs", "direction=out"},
		{"tether_cluster_fenced"},
		{"tether_cluster_takeovers_total"},
	}
	for _, m := range []string{"session.create", "session.branch", "session.resume", "session.activate", "session.close",
		"session.active_list", "session.list", "session.events.since", "prompt.submit", "session.runs", "session.interrupt", "permission.respond"} {
		series = append(series,
			[]string{"tether_rpc_duration_seconds_count", "method=" + m},
			[]string{"tether_rpc_duration_seconds_bucket", "method=" + m, "le=+Inf"})
	}
	for _, sr := range series {
		if !s.HasMetric(t, sr[0], sr[1:]...) {
			t.Errorf("a fresh host has no %s%v series", sr[0], sr[1:])
		} else if sr[0] != "tether_build_info" {
			if v := s.Metric(t, sr[0], sr[1:]...); v != 0 {
				t.Errorf("a fresh host: %s%v = %v, want 0", sr[0], sr[1:], v)
			}
		}
	}
	if v := s.Metric(t, "tether_build_info"); v != 1 {
		t.Errorf("tether_build_info = %v, want 1", v)
	}
}

// TestMetricsGroupCommit: the store's group-commit series count the
// host's own writes: after a create and a prompt, writes were made, in
// at least one transaction and at most one each.
func TestMetricsGroupCommit(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--admin-listen", "127.0.0.1:0", "--pty-command", ""}})
	c := s.Dial(t)
	var snap snapshot
	call(t, c, "session.create", map[string]any{"title": "counted"}, &snap)
	call(t, c, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": "one two"}, nil)
	waitComplete(t, c, snap.SessionID)
	// Both counters from one scrape: the run's journal and cursor writes
	// go on after the prompt is answered.
	status, body := s.AdminGet(t, "/metrics")
	if status != 200 {
		t.Fatalf("GET /metrics: %d", status)
	}
	writes, werr := e2e.SumMetric(body, "tether_store_writes_total")
	commits, cerr := e2e.SumMetric(body, "tether_store_commits_total")
	if werr != nil || cerr != nil {
		t.Fatalf("parse /metrics: %v, %v", werr, cerr)
	}
	if writes < 2 || commits < 1 || commits > writes {
		t.Errorf("tether_store_writes_total = %v, tether_store_commits_total = %v; want at least 2 writes (the create, the turn) in 1 to %v transactions", writes, commits, writes)
	}
	if g := s.Metric(t, "tether_store_group_max"); g < 1 {
		t.Errorf("tether_store_group_max = %v, want at least 1", g)
	}
	if !s.HasMetric(t, "tether_store_overloaded_total") {
		t.Error("no tether_store_overloaded_total series")
	}
}
