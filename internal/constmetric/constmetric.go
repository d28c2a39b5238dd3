// Package constmetric owns the one way the project's Prometheus collectors
// turn a value read at scrape time into a metric: a constant metric, or,
// when the labels do not fit the description, an invalid metric that
// reports the error on that scrape instead of a panic in the collector.
package constmetric

import "github.com/prometheus/client_golang/prometheus"

// New is a constant metric of kind with value v and labels, or an invalid
// metric carrying the error.
func New(d *prometheus.Desc, kind prometheus.ValueType, v float64, labels ...string) prometheus.Metric {
	m, err := prometheus.NewConstMetric(d, kind, v, labels...)
	if err != nil {
		return prometheus.NewInvalidMetric(d, err)
	}
	return m
}
