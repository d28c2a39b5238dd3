// Package kvindex owns the mechanisms by which the router knows which
// KV-cache blocks live on which target: block keys computed exactly as
// vLLM's prefix cache computes them (all four --prefix-caching-hash-algo
// values, the PYTHONHASHSEED root, extra keys), the token-derived fallback
// for fleets whose seed is unknown, the ZeroMQ receivers (a Subscriber
// connected to one pod's PUB, a Bus bound for every publisher that connects,
// one stream per topic) sharing one sequencer (sequence tracking, replay,
// restarts), the guards on what a stream may do (a bus takes a topic only
// from its pod's address and one connection; bounds on messages, batches,
// clears, resets, gaps and queues, each refusal counted by reason), the
// topic form kv@HOST[:PORT]@MODEL, the ingestor that turns event batches into index
// updates, and the reference-counted confirmed placement index.
//
// It provides the parts, one target at a time; which targets to follow,
// when the keys are known, and how far each stream can be trusted is the
// event plane's (package eventplane), which wires them together. Targets are
// named by targetid.ID; beyond that package and its own sub-packages, kvindex
// imports nothing of the project.
//
// The wire format of KV events lives in the sub-package kvindex/events so that
// the simulator can publish exactly what this package consumes.
package kvindex
