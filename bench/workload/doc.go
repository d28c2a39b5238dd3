// Package workload owns what a benchmark sends: sessions of requests with
// their arrival times (model time), prompts and output lengths, generated
// deterministically from a seed, so that every policy of a run faces the
// same requests.
//
// A Workload is a list of sessions. A session is one conversation: its
// first turn arrives at Start; each later turn arrives Think after the
// previous answer ended, and its prompt is everything said so far (the
// earlier turns' parts and the answers the server gave) followed by its own
// parts. Every workload but multi-turn has one turn per session.
//
// The generators: SharedPrefix (groups of users sharing a system prompt,
// rate ladders), MultiTurn (conversations growing turn by turn), Random (no
// sharing), Burst (siblings sharing a long prefix within milliseconds),
// Overload (flow control's: a ladder past the fleet's capacity, each
// request of a priority class and a tenant) and Trace (a Mooncake FAST'25 trace, each 512-token block id mapped to one
// deterministic text block). Text is made of one token per character for
// the simulated pods' bytes model, or one common English word per token
// for real tokenizers (Vocab).
//
// The package knows nothing of HTTP, routers or pods.
package workload
