package metrics

import "github.com/prometheus/client_golang/prometheus"

// NotifyMetrics are the notifications' series (host/internal/notify).
type NotifyMetrics struct {
	// Pending counts the notifications waiting in the outbox, over
	// every notifier (one notification for two notifiers counts 2).
	Pending prometheus.Gauge
	// Sent counts notifications delivered, by notifier.
	Sent *prometheus.CounterVec
	// Failed counts notifications given up (not delivered within a
	// day, or dropped because the outbox was full or closed), by notifier.
	Failed *prometheus.CounterVec
	// Retries counts failed attempts that are retried, by notifier.
	Retries *prometheus.CounterVec
}

func newNotifyMetrics() NotifyMetrics {
	return NotifyMetrics{
		Pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_notifications_pending", Help: "Notifications stored in the outbox and not yet delivered, one per notifier."}),
		Sent:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_notifications_sent_total", Help: "Notifications delivered (the receiver answered with success), by notifier."}, []string{"notifier"}),
		Failed:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_notifications_failed_total", Help: "Notifications given up: not delivered within 24 h of their event, or dropped because the outbox was full or closed; by notifier."}, []string{"notifier"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_notification_retries_total", Help: "Attempts to deliver a notification that failed and are retried with backoff, by notifier."}, []string{"notifier"}),
	}
}

func (n NotifyMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{n.Pending, n.Sent, n.Failed, n.Retries}
}

// Init makes the series of the notifier named name, at 0.
func (n NotifyMetrics) Init(name string) {
	n.Sent.WithLabelValues(name)
	n.Failed.WithLabelValues(name)
	n.Retries.WithLabelValues(name)
}
