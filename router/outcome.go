package router

import (
	"bytes"
	"time"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fastjson"
)

// metrics are the router's own numbers. Labels are bounded: target
// (endpoint#rank), model, policy, outcome, reason — never prompt text,
// token ids, hashes or request ids.
type metrics struct {
	requests       *prometheus.CounterVec   // model, policy, outcome
	rejected       *prometheus.CounterVec   // reason
	routed         *prometheus.CounterVec   // target, model, policy
	retries        *prometheus.CounterVec   // target (the one that failed)
	upstreamErrors *prometheus.CounterVec   // target, reason
	overhead       *prometheus.HistogramVec // policy
	ttft           *prometheus.HistogramVec // model, policy
	duration       *prometheus.HistogramVec // model, policy
	promptTokens   *prometheus.CounterVec   // target, model, policy
	predicted      *prometheus.CounterVec   // target, model, policy
	reported       *prometheus.CounterVec   // target, model, policy
	prediction     *prometheus.CounterVec   // target, model, policy, outcome
	predictionErr  *prometheus.HistogramVec // policy
	disagg         *prometheus.CounterVec   // model, outcome
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_requests_total",
			Help: "Routed requests by how they ended (ok, client_error, upstream_error, timeout, canceled).",
		}, []string{"model", "policy", "outcome"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_requests_rejected_total",
			Help: "Requests answered by the router itself without reaching a target, by reason.",
		}, []string{"reason"}),
		routed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_routed_total",
			Help: "Attempts dispatched to each target (retries count again).",
		}, []string{"target", "model", "policy"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_retries_total",
			Help: "Requests retried on another target after this target failed before the first byte.",
		}, []string{"target"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_upstream_errors_total",
			Help: "Target failures seen by the proxy, by reason.",
		}, []string{"target", "reason"}),
		overhead: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prefixrouter_routing_seconds",
			Help:    "Time from request arrival to dispatch: parsing, tokenization, lookup and choice.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2, 16),
		}, []string{"policy"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prefixrouter_time_to_first_byte_seconds",
			Help:    "Time from request arrival to the target's first response byte (TTFT for streams).",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 18),
		}, []string{"model", "policy"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prefixrouter_request_duration_seconds",
			Help:    "Time from request arrival to the end of the response.",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 20),
		}, []string{"model", "policy"}),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_prompt_tokens_total",
			Help: "Prompt tokens routed, as the router counted them (or as the target reported when the router estimated).",
		}, []string{"target", "model", "policy"}),
		predicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_predicted_cached_tokens_total",
			Help: "Prompt tokens the router expected the target to serve from its prefix cache.",
		}, []string{"target", "model", "policy"}),
		reported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_reported_cached_tokens_total",
			Help: "Prompt tokens the target reported serving from cache (usage.prompt_tokens_details.cached_tokens).",
		}, []string{"target", "model", "policy"}),
		prediction: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixrouter_cache_predictions_total",
			Help: "Predicted versus reported cached tokens per request: exact, under (target had more), over (target had less), unreported.",
		}, []string{"target", "model", "policy", "outcome"}),
		predictionErr: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prefixrouter_cache_prediction_error_tokens",
			Help:    "Absolute difference between reported and predicted cached tokens per request.",
			Buckets: []float64{0, 16, 64, 256, 1024, 4096, 16384, 65536},
		}, []string{"policy"}),
		disagg: newDisaggMetric(),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.rejected, m.routed, m.retries, m.upstreamErrors, m.overhead,
			m.ttft, m.duration, m.promptTokens, m.predicted, m.reported, m.prediction, m.predictionErr, m.disagg)
	}
	return m
}

// Reasons of prefixrouter_upstream_errors_total.
const (
	upstreamStatus5xx        = "status_5xx"
	upstreamStreamErrorEvent = "stream_error_event"
	upstreamFirstByteTimeout = "first_byte_timeout"
	upstreamBeforeFirstByte  = "before_first_byte"
	upstreamStreamBroken     = "stream_broken"
)

var upstreamErrorReasons = []string{upstreamStatus5xx, upstreamStreamErrorEvent, upstreamFirstByteTimeout, upstreamBeforeFirstByte, upstreamStreamBroken, upstreamNoTransferParams}

// addTarget creates a new target's failure counters at zero, so that an
// alert on their rate sees the series before the first failure.
func (m *metrics) addTarget(name string) {
	m.retries.WithLabelValues(name)
	for _, reason := range upstreamErrorReasons {
		m.upstreamErrors.WithLabelValues(name, reason)
	}
}

// forgetTarget deletes a removed target's series, so that the label sets
// stay bounded by the live fleet.
func (m *metrics) forgetTarget(name string) {
	for _, v := range []*prometheus.MetricVec{m.routed.MetricVec, m.retries.MetricVec, m.upstreamErrors.MetricVec,
		m.promptTokens.MetricVec, m.predicted.MetricVec, m.reported.MetricVec, m.prediction.MetricVec} {
		v.DeletePartialMatch(prometheus.Labels{"target": name})
	}
}

// usage is what a response says about its prompt.
type usage struct {
	known        bool
	promptTokens int64
	cachedKnown  bool
	cachedTokens int64
}

// usageFromBody reads usage from a complete JSON response.
func usageFromBody(b []byte) usage {
	if !bytes.Contains(b, []byte(`"usage"`)) {
		return usage{}
	}
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(b)
	if err != nil {
		return usage{}
	}
	return usageOf(v)
}

// usageOf reads the usage of a response, or of a Responses API stream
// event, which carries it in its response.
func usageOf(v *fastjson.Value) usage {
	if u := usageFromValue(v.Get("usage")); u.known {
		return u
	}
	return usageFromValue(v.Get("response", "usage"))
}

// usageFromValue reads a usage object: completions' and chat's
// prompt_tokens, or the Responses API's input_tokens, with their details'
// cached_tokens.
func usageFromValue(u *fastjson.Value) usage {
	if u == nil || u.Type() != fastjson.TypeObject {
		return usage{}
	}
	prompt, details := "prompt_tokens", "prompt_tokens_details"
	if u.Get(prompt) == nil && u.Get("input_tokens") != nil {
		prompt, details = "input_tokens", "input_tokens_details"
	}
	out := usage{known: true, promptTokens: int64(u.GetInt(prompt))}
	if d := u.Get(details); d != nil && d.Type() == fastjson.TypeObject {
		if c := d.Get("cached_tokens"); c != nil && c.Type() == fastjson.TypeNumber {
			out.cachedKnown, out.cachedTokens = true, int64(c.GetInt())
		}
	}
	return out
}

// usageScanner watches an SSE stream for the chunk carrying usage (the
// final one with stream_options.include_usage) without keeping the stream:
// it holds only the current, incomplete line, up to maxSSELine bytes.
type usageScanner struct {
	line    []byte
	skip    bool // the current line is too long to be a usage chunk
	last    usage
	scratch fastjson.Parser
}

const maxSSELine = 1 << 20

func (s *usageScanner) Write(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if !s.skip {
				if len(s.line)+len(p) > maxSSELine {
					s.skip, s.line = true, s.line[:0]
				} else {
					s.line = append(s.line, p...)
				}
			}
			return
		}
		seg := p[:i]
		p = p[i+1:]
		if s.skip {
			s.skip = false
			continue
		}
		if len(s.line) > 0 {
			s.line = append(s.line, seg...)
			s.handleLine(s.line)
			s.line = s.line[:0]
		} else {
			s.handleLine(seg)
		}
	}
}

var (
	dataPrefix = []byte("data:")
	usageKey   = []byte(`"usage":{`)
	usageKeySp = []byte(`"usage": {`)
)

func (s *usageScanner) handleLine(l []byte) {
	l = bytes.TrimRight(l, "\r")
	if !bytes.HasPrefix(l, dataPrefix) {
		return
	}
	if !bytes.Contains(l, usageKey) && !bytes.Contains(l, usageKeySp) {
		return
	}
	v, err := s.scratch.ParseBytes(bytes.TrimSpace(l[len(dataPrefix):]))
	if err != nil {
		return
	}
	if u := usageOf(v); u.known {
		s.last = u
	}
}

func (s *usageScanner) usage() usage { return s.last }

// recordOutcome records how an attempt's request ended and, for an
// answered one, its times and, for a routed endpoint, what it says about
// the prompt and the router's prediction of its cached tokens; with
// --access-log, the request's line. The prompt may still be being encoded:
// the response does not wait for it, the line and the prediction's
// numbers do.
func (r *Router) recordOutcome(a *attempt) {
	x := a.x
	m, pol, model := r.met, x.dec.PolicyName(), x.model
	m.requests.WithLabelValues(model, pol, a.label).Inc()
	var took time.Duration
	if a.answered || r.alog != nil {
		took = time.Since(x.start)
	}
	if a.answered {
		m.ttft.WithLabelValues(model, pol).Observe(a.ttft.Seconds())
		m.duration.WithLabelValues(model, pol).Observe(took.Seconds())
	}
	// What the prompt found in the prefix cache is the answer of the
	// attempt that computed it: a split request's prefill stage.
	pa := a.promptAttempt()
	rec := promptOutcome{m: m, policy: pol, model: model, target: pa.name, d: pa.d, tail: pa.tail(), usage: pa.usage,
		measure: a.answered && a.status < 300 && pa.status < 300 && x.ep.routed(), predicts: x.ep.routed()}
	if a.answered && pa.d.Predicting() && x.ep.routed() {
		// The TTFT is the client's: the decode pod's first token.
		rec.spec, rec.book, rec.ttft = x.dec.Spec(), pa.book, a.ttft
	}
	if r.alog != nil {
		rec.alog, rec.line = r.alog, a.attemptLine(took)
	}
	if !rec.measure && rec.line == nil && rec.spec == nil {
		return
	}
	if rec.tail.Finished() {
		rec.record()
		return
	}
	// Counted with the tails: a clean shutdown waits for it, and closes
	// the access log after it.
	r.tails.Add(1)
	go func() {
		defer r.tails.Done()
		rec.tail.Wait()
		rec.record()
	}()
}

// promptOutcome is what a request says about its prompt; it holds nothing
// of the request, which is recycled when its handler ends.
type promptOutcome struct {
	m             *metrics
	policy, model string
	target        string
	d             *decision
	tail          *brain.Tail
	usage         usage
	// measure: an answered request of a routed endpoint, whose numbers
	// feed the prediction metrics. predicts: the router predicted its
	// cached tokens (a routed endpoint).
	measure, predicts bool
	// line is the request's access line, written once the prompt is known.
	line *accessLine
	alog *accessLog
	// spec takes the outcome of a request routed with predicted
	// placements in mind (either holdback arm), booked as book.
	spec *speculative.Store
	book *brain.Booking
	ttft time.Duration
}

// record compares the cached tokens the pod reported with the router's
// prediction over the whole prompt, and writes the request's access line.
func (o *promptOutcome) record() {
	u := o.usage
	v := o.d.View(o.tail, o.d.Chosen())
	prompt := int64(v.Prompt.Count)
	if !v.Prompt.Counted && u.known {
		prompt = u.promptTokens
	}
	if o.measure {
		o.measureCache(v, prompt)
	}
	if o.spec != nil {
		o.spec.Record(o.book.Outcome(int(prompt), v.Predicted, int(u.cachedTokens), u.cachedKnown, o.ttft))
	}
	if o.line != nil {
		o.fillLine(v)
		o.alog.write(o.line)
	}
}

// fillLine puts the prompt's numbers in the access line: only those the
// router or the pod counted, never an estimate.
func (o *promptOutcome) fillLine(v brain.View) {
	l, u := o.line, o.usage
	switch {
	case v.Prompt.Counted:
		n := int64(v.Prompt.Count)
		l.PromptTokens, l.PromptSource = &n, v.Prompt.Source
	case u.known:
		n := u.promptTokens
		l.PromptTokens, l.PromptSource = &n, "usage"
	}
	if o.predicts {
		n := int64(v.Predicted)
		l.PredictedCachedTokens = &n
	}
	if u.cachedKnown {
		n := u.cachedTokens
		l.ReportedCachedTokens = &n
	}
}

// measureCache feeds the prediction metrics with the prompt's count and
// the cached tokens predicted and reported.
func (o *promptOutcome) measureCache(v brain.View, prompt int64) {
	m, pol, u := o.m, o.policy, o.usage
	m.promptTokens.WithLabelValues(o.target, o.model, pol).Add(float64(prompt))
	m.predicted.WithLabelValues(o.target, o.model, pol).Add(float64(v.Predicted))
	if !u.cachedKnown {
		m.prediction.WithLabelValues(o.target, o.model, pol, "unreported").Inc()
		return
	}
	m.reported.WithLabelValues(o.target, o.model, pol).Add(float64(u.cachedTokens))
	diff := u.cachedTokens - int64(v.Predicted)
	outcome := "exact"
	switch {
	case diff > 0:
		outcome = "under"
	case diff < 0:
		outcome = "over"
		diff = -diff
	}
	m.prediction.WithLabelValues(o.target, o.model, pol, outcome).Inc()
	m.predictionErr.WithLabelValues(pol).Observe(float64(diff))
}
