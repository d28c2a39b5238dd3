// Package kvindex owns everything the router knows about which KV-cache blocks
// live on which target: block keys computed exactly as vLLM's prefix cache
// computes them (all four --prefix-caching-hash-algo values, the
// PYTHONHASHSEED root, extra keys), the token-derived fallback for fleets whose
// seed is unknown, the ZeroMQ subscriber with sequence tracking and replay,
// and the reference-counted confirmed placement index.
//
// The wire format of KV events lives in the sub-package kvindex/events so that
// the simulator can publish exactly what this package consumes.
package kvindex
