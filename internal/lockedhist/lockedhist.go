// Package lockedhist owns the Prometheus histogram a package keeps under
// its own lock, beside the other numbers of what it counts, and exports at
// scrape time as a constant histogram: the speculative store's latencies
// and TTFT, the peer mesh's lag.
package lockedhist

import "github.com/prometheus/client_golang/prometheus"

// Histogram counts observations in buckets. It is not safe for concurrent
// use: its owner's lock guards it.
type Histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative; the last is +Inf
	sum    float64
	n      uint64
}

// New is an empty histogram with the given upper bounds, ascending.
func New(bounds []float64) Histogram {
	return Histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

// Observe counts v.
func (h *Histogram) Observe(v float64) {
	i := 0
	for i < len(h.bounds) && v > h.bounds[i] {
		i++
	}
	h.counts[i]++
	h.sum += v
	h.n++
}

// Count is the number of observations.
func (h *Histogram) Count() uint64 { return h.n }

// Metric is the histogram now as a constant metric of d with labels.
func (h *Histogram) Metric(d *prometheus.Desc, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.bounds))
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i]
		buckets[b] = cum
	}
	m, err := prometheus.NewConstHistogram(d, h.n, h.sum, buckets, labels...)
	if err != nil {
		return prometheus.NewInvalidMetric(d, err)
	}
	return m
}
