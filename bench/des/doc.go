// Package des owns the benchmark's discrete-event engine: one workload under
// one policy over simulated pods in virtual time, in one goroutine, with no
// socket and no wall clock.
//
// What runs is the real code, stepped instead of scheduled:
//   - the pods are the simulator's engine (sim.Rank): continuous batching,
//     chunked prefill, the paged prefix cache with vLLM's hashing,
//     reference counts and LRU, BlockStored when blocks fill;
//   - the routers are brain.Virtual: the decider, chooser, event plane
//     (index, ingestion, freshness), predicted placements and load ledger
//     that decide for the HTTP path, on the engine's clock. Several
//     routers (Config.Routers) each have their own;
//   - the oracle scores every pod with sim.OracleCosts, as the
//     live engine's oracle does.
//
// What is modelled instead of run: the network and the client (a request
// reaches its pod Config.Delivery.Request after it is sent; the answer's
// way back is not counted), the router's own time (its decision takes no
// model time; its wall cost is measured and reported), the scrapes of the
// pods' gauges (every health.Config.ScrapeInterval of model time) and the
// delivery of KV events (Delivery): each step's batch leaves the pod when
// the step ends (as the live simulator and vLLM publish), held back
// EventDelay, reaches each router after Transport plus up to Jitter, in
// sequence order, and waits behind that router's earlier batches of the
// same pod for ApplyPerBatch each (the subscriber's backlog). Each router
// also probes every pod's health (every health.Config.ProbeInterval), and
// a request failing at its pod before its first byte is retried on
// another, as the API retries it.
//
// With flow control (Config.Admission) each router admits every request
// with its class, tenant and max tokens (brain.Virtual.Submit): admitted
// ones go to their pod at once, queued ones wait in that router's line
// and go, decided again, when a release lets them (after every step's
// end, scrape and Tick), shed ones are recorded as the router's 429
// (report.ErrShed, with the reason); those still waiting at the drain
// bound leave the line and count as unfinished.
//
// A conductor (Config.Conduct, Control) acts on a run as it goes: it sends
// sessions itself (paired-gap's cells), cancels requests, and faults pods:
// a failed prefill, a restart, a dead engine, dropped, delayed or cut-off
// event batches (recovered from each pod's replay buffer,
// Config.ReplayBuffer), a pod out of the fleet and back (the faults
// workload's schedule).
//
// Prompts are the workload's text encoded by the pods' bytes tokenizer
// (one token per byte after a BOS token), once per request, exactly as the
// live pods and router encode them; answers are the generated tokens
// decoded the same way, so that a multi-turn session's next prompt is the
// live one's. Times are model seconds.
package des
