// Package bench owns `prefixrouter bench`: it runs one workload (package
// workload) against every routing policy asked for, one after another,
// each on a fresh fleet, and hands the measurements to package report.
//
// Engines:
//   - live: simulated vLLM pods (package sim) on loopback, over real HTTP
//     and ZeroMQ, with the router (package router) in front of them for
//     round-robin, least-load, approximate and precise. The oracle policy
//     has no router: the driver asks every simulated pod for its true cache
//     state and queue (sim.Pod.Probe) and sends each request straight to
//     the cheapest, which bounds what any router could do. Model time runs
//     TimeScale times faster than the wall clock; every figure is converted
//     back to model seconds.
//   - des: the same simulated pods' engines (sim.Rank) and the router's
//     own decision code (brain.Virtual) in virtual time, in one goroutine
//     (package des): fleets and loads beyond this machine, several router
//     replicas (--routers), the llmd-ladder and shared-prefix-256 presets.
//     Agreement with the live engine is checked by agreement_test.go
//     (make agreement records the live side).
//   - target: any OpenAI-compatible endpoint given by URL (vLLM, this
//     router, another router), one row named "target", at time scale 1.
//
// The driver (driver.go) is open-loop: a session starts at its scheduled
// time whatever the server does; within a multi-turn session each turn
// waits for the previous answer and the think time. Every request streams
// a completions call and the client times its first token.
//
// The faults workload (faults.go) drives shared-prefix's requests while a
// schedule kills, restarts and silences pods, then sorts every request by
// how it ended and measures how long each router took to see each faulted
// pod as it is again.
package bench
