// Package health owns what the router knows about its targets as servers:
// which targets exist, which can take work and how busy they are.
//
// It owns:
//
//   - endpoint specs (the --endpoint syntax, shared by flags, the endpoints
//     file and DNS discovery) and their expansion into one target per
//     data-parallel rank;
//   - the target registry: static specs, an endpoints file re-read on change
//     (fsnotify with a polling fallback) and DNS discovery re-resolved on an
//     interval; removed targets drain and subscribers are told about every
//     addition, update, restart and removal;
//   - HTTP probes of GET /health with failure/success thresholds, model
//     discovery from GET /v1/models (a pod refusing it with 401 or 403 is
//     down as unauthorized), and a circuit breaker fed by the router's
//     proxy outcomes; every call carries Deps.Authorization, the router's
//     upstream credential;
//   - the load ledger: vLLM's gauges scraped from GET /metrics with a
//     staleness bound, combined with the router's own in-flight accounting
//     (Flight: in flight, prefilling, queued prompt and uncached tokens;
//     atomics) into one immutable Snapshot that the router reads without
//     locks;
//   - cache-config discovery (vllm:cache_config_info): disagreement between
//     pods of one model and with configured flags, and pods running without
//     prefix caching;
//   - health's part of the router's per-target debug view, and the
//     prefixrouter_health_* Prometheus metrics apart from the event-stream
//     ones, labelled by targetid.ID.String() like every other per-target
//     series.
//
// What a target's KV-event stream says and how far to trust it (subscribers,
// freshness, expectations) is the event plane's (package eventplane): the
// router feeds it from health's registry changes and snapshots. health
// imports only targetid and internal helpers; it knows nothing of KV events, HTTP
// routing, tokenization or the placement index.
package health
