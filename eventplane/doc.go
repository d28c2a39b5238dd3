// Package eventplane owns what each target's KV-event stream says and how
// far to trust it:
//
//   - the wiring: the confirmed placement index (kvindex.Index), the
//     ingestor that applies event batches to it, and one kvtransport
//     subscriber per target, started, restarted and stopped as the router reports
//     targets added, moved, restarted and removed; or, for targets whose
//     endpoint names no events address while --events-listen is set, the
//     buses (kvtransport.Bus) their pods' publishers connect to, and the map
//     from a bus's topics to targets (bus.go);
//   - block keys: the keyer (vLLM-exact with a known seed, token-derived
//     without), configured once the fleet's block size and hash algorithm
//     are known, from the configuration or from the pods' reports; and a
//     cap on each pod's placements from its GPU block count;
//   - freshness: a verdict per target (fresh, stale, disconnected,
//     replaying) judged from the subscriber's status (connection, replay,
//     backlog, batches lost for good) and from expectations: a request
//     whose prompt filled new full blocks expects a KV event after its
//     dispatch, so that an idle pod is told apart from a broken pipe;
//   - wiring faults (faults.go): a serving pod whose stream stays
//     disconnected, block keys that cannot be configured, keys that
//     disagree with the pod's (hash seed, algorithm, block size), a
//     token-derived stream whose blocks keep arriving unchained; each
//     names the flag or vLLM setting to check, is logged when first found
//     and once a minute while it lasts, and is shown in the verdict's
//     evidence (Freshness.Faults);
//   - trust: what a verdict implies for routing (Plane.Trust: the
//     verdict's Verdict.ConfirmedWeight for the confirmed run and
//     Verdict.Trusted for predictions, none of either while a fault makes
//     the keys worthless);
//   - the per-target event-stream series (prefixrouter_health_events_*,
//     prefixrouter_health_routed_in_window: names kept from when health
//     judged freshness) and kvindex's prefixrouter_kv_* series, and the
//     event-stream parts of the router's debug view.
//
// It is a leaf the router composes: it imports kvindex, kvtransport (the
// ZeroMQ sockets), targetid and internal helpers, never health or router. The router feeds it targets from health's registry
// changes, cache configurations from health's snapshots, and each
// request's dispatch and first byte; it reads verdicts, keys and the index
// lock-free on the request path.
package eventplane
