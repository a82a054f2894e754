package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// ClusterStats is what the cluster gauges report, asked at scrape time
// (all zero on a single host).
type ClusterStats struct {
	// HostsAlive and HostsGone count the hosts this host sees in the
	// cluster, itself included, by whether their heartbeat is within the
	// TTL.
	HostsAlive, HostsGone int
	// Takeovers counts sessions this host took from hosts that left.
	Takeovers uint64
	// LegsIn and LegsOut are the connections relayed to this host by
	// others, and from this host to others.
	LegsIn, LegsOut int
	// Fenced: this host could not write its heartbeat for half the TTL
	// and let go of its sessions.
	Fenced bool
}

// clusterMetrics are the cluster's series, registered by New.
type clusterMetrics struct {
	source atomic.Pointer[func() ClusterStats]
	// Host is 1 with this host's id as label, once it joined a cluster.
	Host *prometheus.GaugeVec
}

// SetClusterSource sets the function the cluster gauges ask at scrape
// time, and this host's id.
func (m *Metrics) SetClusterSource(hostID string, f func() ClusterStats) {
	m.cluster.source.Store(&f)
	m.cluster.Host.WithLabelValues(hostID).Set(1)
}

func (m *Metrics) clusterStats() ClusterStats {
	if f := m.cluster.source.Load(); f != nil {
		return (*f)()
	}
	return ClusterStats{}
}

// newClusterMetrics makes the cluster's series on m.
func newClusterMetrics(m *Metrics) []prometheus.Collector {
	m.cluster.Host = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tether_cluster_host", Help: "1, labelled with this host's --host-id, when it runs in a cluster."}, []string{"host_id"})
	gauge := func(name, help string, labels prometheus.Labels, f func(ClusterStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 { return f(m.clusterStats()) })
	}
	return []prometheus.Collector{
		m.cluster.Host,
		gauge("tether_cluster_hosts", "Hosts this host sees in its cluster, itself included, by state: alive (heartbeat within the TTL) or gone.", prometheus.Labels{"state": "alive"}, func(s ClusterStats) float64 { return float64(s.HostsAlive) }),
		gauge("tether_cluster_hosts", "Hosts this host sees in its cluster, itself included, by state: alive (heartbeat within the TTL) or gone.", prometheus.Labels{"state": "gone"}, func(s ClusterStats) float64 { return float64(s.HostsGone) }),
		gauge("tether_cluster_relay_legs", "Connections relayed between this host and the others, by direction: in (others' clients served here) or out (this host's clients served elsewhere).", prometheus.Labels{"direction": "in"}, func(s ClusterStats) float64 { return float64(s.LegsIn) }),
		gauge("tether_cluster_relay_legs", "Connections relayed between this host and the others, by direction: in (others' clients served here) or out (this host's clients served elsewhere).", prometheus.Labels{"direction": "out"}, func(s ClusterStats) float64 { return float64(s.LegsOut) }),
		gauge("tether_cluster_fenced", "1 while this host cannot write its cluster heartbeat and has let go of its sessions.", nil, func(s ClusterStats) float64 {
			if s.Fenced {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tether_cluster_takeovers_total", Help: "Sessions this host took over from hosts that left the cluster (asked at scrape time)."}, func() float64 {
			return float64(m.clusterStats().Takeovers)
		}),
	}
}
