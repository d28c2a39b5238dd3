package tokenize

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the package's Prometheus series. Labels stay bounded: model
// names come from configuration, mode and reason from fixed sets.
type metrics struct {
	requests    *prometheus.CounterVec
	errors      *prometheus.CounterVec
	seconds     *prometheus.HistogramVec
	switches    *prometheus.CounterVec
	comparisons *prometheus.CounterVec
	mode        *prometheus.GaugeVec
	cacheHits   prometheus.Counter
	cacheMisses prometheus.Counter
	msgHits     prometheus.Counter
	msgMisses   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_tokenize_requests_total",
			Help: "Tokenizations by model and the mode that produced the ids (local or remote).",
		}, []string{"model", "mode"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_tokenize_errors_total",
			Help: "Failed tokenizations (template raised, remote failed, bad input) by model and mode.",
		}, []string{"model", "mode"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prefixrouter_tokenize_seconds",
			Help:    "Time to tokenize one request, by model and mode.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 4, 10),
		}, []string{"model", "mode"}),
		switches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_tokenize_remote_switches_total",
			Help: "Models moved to remote tokenization, by reason (mismatch, prompt_mismatch, local_error, template_compile, hub_unavailable).",
		}, []string{"model", "reason"}),
		comparisons: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_tokenize_comparisons_total",
			Help: "Auto-mode background comparisons against the pod, by outcome (match, mismatch, prompt_mismatch, remote_error, skipped).",
		}, []string{"model", "reason"}),
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "prefixrouter_tokenize_mode",
			Help: "1 for the model's current tokenizer mode (local, remote, auto), 0 otherwise.",
		}, []string{"model", "mode"}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixrouter_tokenize_segment_cache_hits_total",
			Help: "Text segments whose ids came from the segment cache.",
		}),
		cacheMisses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixrouter_tokenize_segment_cache_misses_total",
			Help: "Text segments encoded because the segment cache did not hold them.",
		}),
		msgHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixrouter_tokenize_message_cache_hits_total",
			Help: "Chat messages and tool definitions whose decoded value came from the message cache.",
		}),
		msgMisses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixrouter_tokenize_message_cache_misses_total",
			Help: "Chat messages and tool definitions decoded because the message cache did not hold them.",
		}),
	}
	if reg != nil {
		m.requests = register(reg, m.requests)
		m.errors = register(reg, m.errors)
		m.seconds = register(reg, m.seconds)
		m.switches = register(reg, m.switches)
		m.comparisons = register(reg, m.comparisons)
		m.mode = register(reg, m.mode)
		m.cacheHits = register(reg, m.cacheHits)
		m.cacheMisses = register(reg, m.cacheMisses)
		m.msgHits = register(reg, m.msgHits)
		m.msgMisses = register(reg, m.msgMisses)
	}
	return m
}

// register adds c to reg; when a second Registry shares the Registerer it
// reuses the collector already there instead of panicking.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(fmt.Sprintf("tokenize: register metric: %v", err))
	}
	return c
}

func (m *metrics) setMode(model string, mode Mode) {
	for _, x := range []Mode{ModeLocal, ModeRemote, ModeAuto} {
		v := 0.0
		if x == mode {
			v = 1
		}
		m.mode.WithLabelValues(model, x.String()).Set(v)
	}
}
