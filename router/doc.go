// Package router owns the HTTP front door of prefixrouter: the
// OpenAI-compatible API on fasthttp (/v1/completions, /v1/chat/completions
// and /v1/responses, routed by the prompt; /v1/embeddings, vLLM's pooling,
// classify, score and rerank endpoints, /tokenize, /detokenize and
// /version, forwarded to the least loaded pod; /v1/models and
// /v1/models/{id}; /health, /ready), parsing only the
// request fields that decide a target (the brain package decides and
// books), the proxy with streaming pass-through,
// client-cancel propagation and retry before the first byte, outcome capture
// (the cached prompt tokens the pod reports against the router's
// prediction), the access log (accesslog.go), the admin listener
// (/metrics, /debug/targets and the dry run /debug/route/...), and the
// credentials (auth.go): the API keys clients present, the key the router
// presents to the pods on every call, the admin token, each re-read when
// its file changes.
//
// It composes the leaves (the benchmark drives it, and takes its
// defaults): health says which targets
// exist, can take work and how busy they are; tokenize turns prompts into the
// pod's token ids; kvindex turns ids into block keys; the event plane
// (eventplane) follows every target's KV events into the placement index and
// says how far each stream can be trusted. The router feeds the event plane
// from health (eventplane.go) and tells it of each dispatch and first byte,
// and composes the wiring faults each leaf finds into the target's state in
// /debug/targets, the prefixrouter_target_wiring_fault gauge and the body
// of /ready (wiring.go).
// Data flows one way: request in, parse, tokenize, key, look up, score,
// dispatch, proxy, record.
//
// A request's lifecycle has three owners (docs/architecture.md walks it):
// the decision (brain.Decision), immutable once made and computed without
// HTTP by the decider the API handler, the dry run and the benchmark's
// engine share; the prompt tail (brain.Tail), which owns the goroutine
// that encodes what the decision did not need to read; and the attempt
// (attempt.go), which sends, awaits the first byte and relays the answer,
// ending everything it holds once, its bookkeeping through a
// brain.Booking. A split request's stages (disagg.go) wrap the brain's
// decision with the stage each serves. Every context on the request path derives from the client's life
// (life.go), which a disconnect ends.
//
// Request bodies are forwarded byte-for-byte. Bad input never reaches a pod:
// it is answered with an OpenAI-shaped error ({"error": {"message", "type",
// "param", "code"}}) and the right status (400, 404 unknown model, 413,
// 503 with Retry-After when no target can take the request). No answer of
// the router's own names a pod (errors.go).
package router
