// Package metrics defines the host's Prometheus metrics on a registry of
// their own, so that every part of the host counts into one place that
// the admin listener serves.
package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the host's Prometheus metrics, on a registry of their own.
type Metrics struct {
	Registry *prometheus.Registry

	LiveSessions     prometheus.Gauge
	ParkedSessions   prometheus.Gauge
	Viewers          prometheus.Gauge
	AgentBuilds      prometheus.Counter
	AgentDiscards    prometheus.Counter
	AgentCloses      prometheus.Counter
	CASConflicts     prometheus.Counter
	OwnerErrors      prometheus.Counter
	Connections      prometheus.Gauge
	Refused          *prometheus.CounterVec
	FramesIn         prometheus.Counter
	FramesOut        prometheus.Counter
	BytesIn          prometheus.Counter
	BytesOut         prometheus.Counter
	PluginRestarts   *prometheus.CounterVec
	PluginReloads    *prometheus.CounterVec
	PluginLogDropped *prometheus.CounterVec
	Supersedes       prometheus.Counter
	BadResizes       prometheus.Counter
	PTYs             prometheus.GaugeFunc
	ScreenRebuilds   prometheus.CounterFunc
	BuildInfo        *prometheus.GaugeVec
	TransportRefused *prometheus.CounterVec
	TransportConns   *prometheus.GaugeVec
	StoreErrors      prometheus.Counter
	RPCDuration      *prometheus.HistogramVec
	PTYAttach        prometheus.Histogram
	// Notify are the notifications' series (notify.go).
	Notify NotifyMetrics

	ptySource   atomic.Pointer[func() PTYStats]   // describes the live PTYs; nil: none
	writeSource atomic.Pointer[func() WriteStats] // describes the store's group commits; nil: none
	cluster     clusterMetrics
}

// New registers the host's metrics on a new registry.
func New() *Metrics {
	m := &Metrics{
		Registry:         prometheus.NewRegistry(),
		LiveSessions:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_live_sessions", Help: "Live sessions in the table, parked ones included."}),
		ParkedSessions:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_parked_sessions", Help: "Live sessions with no viewer, waiting for a reap or a rebind."}),
		Viewers:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_viewers", Help: "Viewer bindings across all live sessions."}),
		AgentBuilds:      prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_agent_builds_total", Help: "Agents built for live sessions."}),
		AgentDiscards:    prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_agent_discards_total", Help: "Agents built by a losing resume (or during shutdown) and closed unused."}),
		AgentCloses:      prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_agent_closes_total", Help: "Agents of released sessions closed."}),
		CASConflicts:     prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_teardown_cas_conflicts_total", Help: "Teardowns refused by their compare-and-swap: the binding had moved on since the caller looked, so a close, reap, eviction or PTY detach did not happen (the caller only dropped its own viewer, or nothing)."}),
		OwnerErrors:      prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_owner_errors_total", Help: "Teardowns whose new binding the ownership store did not record (it refused or could not be reached)."}),
		Connections:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_connections", Help: "Admitted client connections."}),
		Refused:          prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_refused_total", Help: "Connections refused by the access checks, by close code."}, []string{"code"}),
		FramesIn:         prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_frames_in_total", Help: "Data frames received from clients."}),
		FramesOut:        prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_frames_out_total", Help: "Data frames queued to clients."}),
		BytesIn:          prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_bytes_in_total", Help: "Payload bytes received from clients."}),
		BytesOut:         prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_bytes_out_total", Help: "Payload bytes queued to clients."}),
		PluginRestarts:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_plugin_restarts_total", Help: "Plugin processes restarted, by reason: crashed (exited, or its connection broke) or unresponsive (alive, but no answer to the health ping in time: killed)."}, []string{"plugin", "reason"}),
		PluginReloads:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_plugin_reloads_total", Help: "Plugins swapped for a fresh process on request (tether plugins reload, SIGHUP)."}, []string{"plugin"}),
		BadResizes:       prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_pty_bad_resizes_total", Help: "Frames starting with the resize escape that were not a valid resize, or asked for a size over --pty-max-size, dropped (never written to the PTY)."}),
		PluginLogDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_plugin_log_lines_dropped_total", Help: "Plugin stderr lines not re-emitted because the plugin wrote more than 1000 a second."}, []string{"plugin"}),
		Supersedes:       prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_pty_supersedes_total", Help: "PTY writers closed with 4409 because a newer writer attached."}),
	}
	m.BuildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tether_build_info", Help: "Always 1; the labels say which tether and Go built this host."}, []string{"version", "go_version"})
	m.TransportRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_transport_refused_total", Help: "Connections a transport refused because --max-connections were open (HTTP 503), or because it ran out of file descriptors; read at each health ping."}, []string{"plugin"})
	m.TransportConns = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tether_transport_open_connections", Help: "TCP connections a transport holds open, upgraded or not (read at each health ping)."}, []string{"plugin"})
	m.StoreErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_store_errors_total", Help: "Failed writes to the state database (disk full, I/O error, read-only file system, …)."})
	m.RPCDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "tether_rpc_duration_seconds",
		Help:    "Time from a JSON-RPC request's arrival at the gateway to its response being queued, by method.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2.5, 12),
	}, []string{"method"})
	m.PTYAttach = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "tether_pty_attach_duration_seconds",
		Help:    "Time from an /api/pty socket's admission to the last byte of its replay or snapshot being queued.",
		Buckets: prometheus.ExponentialBuckets(100e-6, 2.5, 12),
	})
	m.PTYs = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tether_ptys", Help: "Live PTYs in the PTY backend (asked at scrape time)."}, func() float64 {
		return float64(max(m.ptyStats().PTYs, 0))
	})
	m.ScreenRebuilds = prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tether_pty_screen_rebuilds", Help: "Times a PTY's screen model fell too far behind its output and was rebuilt from the ring's tail (what was skipped is missing from its snapshots), over every PTY, exited ones included (asked at scrape time)."}, func() float64 {
		return float64(m.ptyStats().ScreenRebuilds)
	})
	m.Registry.MustRegister(m.LiveSessions, m.ParkedSessions, m.Viewers, m.AgentBuilds, m.AgentDiscards,
		m.AgentCloses, m.CASConflicts, m.OwnerErrors, m.Connections, m.Refused, m.FramesIn, m.FramesOut, m.BytesIn,
		m.BytesOut, m.PluginRestarts, m.PluginReloads, m.PluginLogDropped, m.Supersedes, m.BadResizes, m.PTYs, m.ScreenRebuilds, m.BuildInfo, m.TransportRefused, m.TransportConns, m.StoreErrors, m.RPCDuration, m.PTYAttach)
	m.Registry.MustRegister(newClusterMetrics(m)...)
	m.Registry.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tether_store_commits_total", Help: "Transactions the state database's writer committed (or tried); a burst of writes is committed in groups, so fewer than tether_store_writes_total (asked at scrape time)."}, func() float64 {
			return float64(m.writeStats().Commits)
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tether_store_writes_total", Help: "Writes (calls) the state database's writer committed in those transactions (asked at scrape time)."}, func() float64 {
			return float64(m.writeStats().Writes)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tether_store_group_max", Help: "The most writes one transaction of the state database has carried since the host started (asked at scrape time)."}, func() float64 {
			return float64(m.writeStats().MaxGroup)
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tether_store_overloaded_total", Help: "Writes that waited for the state database's writer until their call's time ran out and were answered 5003 with data.retry_after_ms, unmade (asked at scrape time)."}, func() float64 {
			return float64(m.writeStats().Abandoned)
		}),
	)
	m.Notify = newNotifyMetrics()
	m.Registry.MustRegister(m.Notify.collectors()...)
	return m
}

// PTYStats is what the PTY gauges report, asked at scrape time.
type PTYStats struct {
	// PTYs is the live PTYs (-1 when the backend cannot tell).
	PTYs int
	// ScreenRebuilds counts the screen model rebuilds of every PTY, exited
	// ones included; it never decreases.
	ScreenRebuilds int64
}

// WriteStats is what the store's group-commit series report, asked at
// scrape time (store.WriteStats).
type WriteStats struct {
	Commits, Writes, Abandoned uint64
	MaxGroup                   int
}

// SetWriteSource sets the function the store's group-commit series ask
// at scrape time.
func (m *Metrics) SetWriteSource(f func() WriteStats) { m.writeSource.Store(&f) }

func (m *Metrics) writeStats() WriteStats {
	if f := m.writeSource.Load(); f != nil {
		return (*f)()
	}
	return WriteStats{}
}

// SetPTYSource sets the function the PTY gauges ask at scrape time.
func (m *Metrics) SetPTYSource(f func() PTYStats) { m.ptySource.Store(&f) }

func (m *Metrics) ptyStats() PTYStats {
	if f := m.ptySource.Load(); f != nil {
		return (*f)()
	}
	return PTYStats{}
}
