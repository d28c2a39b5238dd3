// Package kvindex owns the mechanisms by which the router knows which
// KV-cache blocks live on which target: block keys computed exactly as
// vLLM's prefix cache computes them (all four --prefix-caching-hash-algo
// values, the PYTHONHASHSEED root, extra keys), the token-derived fallback
// for fleets whose seed is unknown, the sequencer every event stream
// shares (sequence tracking, replay, restarts; Direct, a stream fed in
// process), the guards on what a stream may do (bounds on batches,
// clears, resets, gaps and queues, each refusal counted by reason), the
// topic form kv@HOST[:PORT]@MODEL and the listen address form, the
// ingestor that turns event batches into index updates, and the
// reference-counted confirmed placement index.
//
// It is pure Go and builds without cgo: the sockets that carry the
// streams are package kvtransport's, which queues what it receives on a
// Sequencer and supplies its replay as a ReplayFunc. So the packages that
// only need a key type or the index (speculative, the simulator) link no
// libzmq.
//
// It provides the parts, one target at a time; which targets to follow,
// when the keys are known, and how far each stream can be trusted is the
// event plane's (package eventplane), which wires them together. Targets are
// named by targetid.ID; beyond that package, its own sub-packages and the
// internal helpers, kvindex imports nothing of the project.
//
// The wire format of KV events lives in the sub-package kvindex/events so that
// the simulator can publish exactly what this package consumes.
package kvindex
