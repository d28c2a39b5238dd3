// Package speculative owns predicted placements: the blocks a routing
// decision expects a pod to store, between the decision and the KV event
// that proves it, when the pod's new blocks are invisible to the index and
// requests sharing the prefix would otherwise scatter. It owns their life
// (pending, then confirmed, expired early or stale, invalidated, withdrawn
// or unknown), the per-target TTL that tunes itself from measured
// route-to-confirmation latency, the trust a target's predictions have
// earned, and the measurements that keep all of it honest: cohorts by
// insertion window with rates over mature cohorts only, latency
// percentiles, exposure (λ·p·T), the funnel from insertion to the cached
// tokens of the requests routed on a prediction, false-warm routes, and
// the holdback arm against which the benefit is measured. It registers
// the prefixrouter_speculative_* series and gives the router the JSON view
// of GET /debug/speculative (View).
//
// It is a leaf: it imports kvindex for block keys and the Observer seam,
// targetid for target ids and internal helpers; never router, health or
// eventplane. The router tells it each target's event-stream state
// through Deps.Stream.
//
// How the router uses a Store, in the order of a request:
//
//  1. Assign (before deciding): the request's holdback arm, stable per
//     conversation. A holdback request is decided without predictions.
//  2. Lookup and Trust (deciding, per candidate): the predicted run beyond
//     the candidate's confirmed run, weighted by trust in [0, 1].
//  3. Predict (at dispatch): the blocks the chosen target does not hold
//     yet become predictions (the router reads the whole prompt before
//     dispatch, so they are all of them); Follow when the choice counted
//     predictions.
//  4. Placement.Withdraw (when the pod rejected the request before its
//     first byte; never on a client cancel).
//  5. Record (when the request's usage is known): the arm's numbers and
//     the follower's cached tokens and false-warm cost.
//
// On the event path the ingestor's Observer (Store.Observer) confirms
// predictions on every BlockStored and invalidates them on
// AllBlocksCleared; the router calls Invalidate when a pod restarts or a
// target is removed, and AddTarget when one is added. Run, started once,
// processes expiries every TimerResolution and the slow evaluations
// (maturity, trust, TTL, rates) every second; expiry needs no goroutine
// or timer per prediction: each target keeps one deadline heap, drained
// by Run and on access.
//
// Times are read from Deps.Now (injectable) as durations since the
// store's creation, on the monotonic clock.
package speculative
