// Package sim owns the simulated vLLM pod: a process-local stand-in for a
// vLLM server that behaves like vLLM wherever the router can observe it.
//
// A pod serves vLLM's OpenAI-compatible HTTP surface on loopback
// (/v1/completions and /v1/chat/completions with SSE streaming, /tokenize,
// /detokenize, the render endpoints, /v1/models, /health and /metrics under
// vLLM's metric names) and publishes KV-cache events on a real ZeroMQ PUB
// socket in vLLM's exact wire format, with a ROUTER replay socket, one pair
// per data-parallel rank.
//
// Inside, each data-parallel rank is an engine that mirrors vLLM v1's
// scheduler and block pool: continuous batching with a per-step token budget
// (chunked prefill), FCFS admission that waits when the KV cache is full,
// preemption of the newest running request when a running one cannot grow, a
// paged prefix cache keyed by kvindex block hashes (reference counts, a free
// queue evicted least-recently-used first, hits only on a consecutive run
// from block 0, never the whole prompt), BlockStored when blocks fill and
// BlockRemoved on eviction. Step time is a linear model,
//
//	step = fixed + prefill cost × uncached tokens scheduled + decode cost × decoding sequences,
//
// with parameters grouped in named hardware profiles (see profile.go and
// README.md for the derivation). The whole model runs on a virtual clock that
// advances TimeScale times faster than the wall clock, so a benchmark can
// cover hours of model time in minutes; the scale is reported in /metrics and
// in the X-Sim-Time-Scale response header.
//
// A pod can report a full_attention, mla_attention or sink_full_attention
// KV-cache group, or a hybrid model's two groups (full attention plus a
// sliding window over the same block hashes); it can keep a CPU offloading
// tier whose blocks are reported with medium "CPU"; and it can hash from a
// random root per process, as vLLM does without PYTHONHASHSEED. Events leave
// through sim/publish, the repository's one ZMQ publisher.
//
// Every pod can serve either half of a prefill/decode disaggregated request,
// as vLLM with a kv_both NixlConnector: a do_remote_decode prefill answers
// kv_transfer_params naming its engine and its prompt's blocks, and a
// do_remote_prefill decode loads those blocks (at KVTransferPerBlock each)
// from the engine they name while it is live, recomputing the prompt when
// it is not. Config.PrefillPods announces roles in the endpoints.
//
// Faults are injected on demand (Config.Faults, Pod.SetFaults, or
// POST /sim/faults): event delay and jitter, dropped event batches, failing
// prefills, restarts, slow and dead pods. Client disconnects abort requests
// and free their blocks, as in vLLM. Config.APIKey guards the /v1 paths
// as vLLM's --api-key does; Pod.Unauthorized and Pod.Keyless count the
// requests that came without the key.
//
// The package may import kvindex, kvindex/events, sim/publish, tokenize and
// internal helpers; the fleet is
// started in process with StartFleet or from the command line with
// `prefixrouter sim`.
package sim
