// Package health owns what the router knows about its targets apart from
// their caches: which targets exist, which can take work, how busy they are,
// and whether their KV-event streams can be trusted.
//
// It owns:
//
//   - endpoint specs (the --endpoint syntax, shared by flags, the endpoints
//     file and DNS discovery) and their expansion into one target per
//     data-parallel rank;
//   - the target registry: static specs, an endpoints file re-read on change
//     (fsnotify with a polling fallback) and DNS discovery re-resolved on an
//     interval; removed targets drain and subscribers are told about every
//     addition, update and removal;
//   - HTTP probes of GET /health with failure/success thresholds, model
//     discovery from GET /v1/models, and a circuit breaker fed by the
//     router's proxy outcomes;
//   - load: vLLM's gauges scraped from GET /metrics with a staleness bound,
//     combined with the router's own in-flight accounting (atomics) into one
//     immutable Snapshot that the router reads without locks;
//   - event-stream freshness per target (fresh, stale, disconnected,
//     replaying), judged from the kvindex subscriber status (including
//     batches lost for good) and the router's own accounting: a request
//     that filled new full blocks awaits any event received since its
//     dispatch, so that an idle pod is told apart from a broken pipe;
//   - cache-config discovery (vllm:cache_config_info): disagreement between
//     pods of one model and with configured flags, and pods running without
//     prefix caching;
//   - the per-target debug view served by the router's admin API, and the
//     prefixrouter_health_* Prometheus metrics, labelled by
//     target.ID.String() like every other per-target series.
//
// health imports kvindex for its types only; it knows nothing of HTTP
// routing, tokenization or the placement index.
package health
