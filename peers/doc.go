// Package peers owns prediction sharing between router replicas. Several
// replicas behind one Service each follow every pod's KV events, so their
// confirmed view converges, but what each predicts between a routing
// decision and the event that confirms it, and the prefill it has queued
// on each pod, is its own: a sibling request reaching another replica
// inside the event gap is blind to both. Each replica publishes its
// predictions (target, block keys, deadline, origin), their withdrawals
// and its dispatched-but-unanswered work per target (when it changes, and
// all of it every flights interval) on a ZeroMQ PUB socket
// (--peer-listen), and subscribes to the
// others (--peers: addresses, or a headless Service's name re-resolved;
// its own address skipped).
//
// The mesh is private and authenticated: the replicas of one deployment
// share a CURVE keypair (--peer-key-file, Key); each PUB socket is a CURVE
// server that admits, through the process's one ZAP handler (zap.go),
// only clients holding it, and each SUB a CURVE client with it. Without a
// key it refuses to start unless --peer-insecure says so. What a keyed
// peer says is still bounded (plausible.go): a message beyond what one
// replica reports is dropped whole and counted, and the peer shows it.
//
// It owns the wire format (versioned msgpack, Encode and Decode), the key
// file, the ZAP handler, the peer list and its resolution, one SUB socket
// per peer waiting in Go's poller (internal/zmqwait), each peer's state
// (connecting, connected, silent, incompatible, failed, rejected, self)
// with the reason, the sum of the live peers' in-flight work, the
// prefixrouter_peer_* series and the "peers" view of GET /debug/targets. What the predictions and the in-flight work mean is
// not its business: the router hands them to the speculative store (as
// the origin's) and to health's load ledger (Handlers).
//
// It imports kvindex (block keys, the listen address form), targetid and
// internal helpers (zmqwait among them); never router, health or
// speculative.
package peers
