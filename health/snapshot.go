package health

import (
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/targetid"
)

// State says whether a target can take new work.
type State string

// States. Routable and Degraded targets can take work (a router should
// prefer Routable ones); Down and Draining cannot. Event freshness is not
// part of the state (a pod with a stale event stream serves requests fine):
// the event plane (package eventplane) judges it.
const (
	StateRoutable State = "routable"
	StateDegraded State = "degraded"
	StateDown     State = "down"
	StateDraining State = "draining"
)

// Reason is the bounded code explaining a State; details go to the debug
// view, never to metric labels.
type Reason string

// Reasons.
const (
	ReasonOK             Reason = "ok"
	ReasonAwaitingProbe  Reason = "awaiting_probe"
	ReasonProbeFailed    Reason = "probe_failed"
	ReasonCircuitOpen    Reason = "circuit_open"
	ReasonModelsUnknown  Reason = "models_unknown"
	ReasonRemoved        Reason = "removed"
	ReasonCircuitHalf    Reason = "circuit_half_open"
	ReasonMetricsStale   Reason = "metrics_stale"
	ReasonConfigConflict Reason = "cache_config_conflict"
	// ReasonUnauthorized: the pod refuses the router's own calls (401 or
	// 403 to GET /v1/models), as a vLLM started with --api-key refuses a
	// router without --upstream-api-key-file or with a stale key. Its
	// answers to requests would be refusals too, so it takes none.
	ReasonUnauthorized Reason = "unauthorized"
	// ReasonPrefixCachingOff: the pod runs without prefix caching
	// (vllm:cache_config_info enable_prefix_caching=False). It serves
	// requests, but publishes no KV events and never gives a cache hit, so
	// prefix-aware routing gains nothing there: an operator should fix its
	// flags.
	ReasonPrefixCachingOff Reason = "prefix_caching_disabled"
)

// Load is what the last scrape of a target's /metrics said.
type Load struct {
	Running int     // vllm:num_requests_running
	Waiting int     // vllm:num_requests_waiting
	KVUsage float64 // vllm:kv_cache_usage_perc, a fraction in [0, 1]
	// At is when the values were scraped (zero: never).
	At time.Time
	// Stale is set when the values are older than the staleness bound or
	// were never scraped; a router should then lean on its own counters.
	Stale bool
	// PodWide is set when the pod did not label its gauges per engine and
	// the endpoint has several ranks: the values cover the whole pod.
	PodWide bool
	// ProcessStart is the pod's process_start_time_seconds (0: unknown). A
	// change means the pod restarted even if its event sequence numbers
	// did not reveal it.
	ProcessStart float64
}

// CacheConfig is what vllm:cache_config_info says about a target.
type CacheConfig struct {
	Known         bool   `json:"known"`
	BlockSize     int    `json:"block_size,omitempty"`
	NumGPUBlocks  int    `json:"num_gpu_blocks,omitempty"`
	HashAlgo      string `json:"prefix_caching_hash_algo,omitempty"`
	PrefixCaching string `json:"enable_prefix_caching,omitempty"`
}

// PrefixCachingDisabled reports whether the pod said it runs without prefix
// caching. vLLM renders the flag with Python's str(bool) ("True"/"False");
// an absent or unrecognised value is not judged.
func (c CacheConfig) PrefixCachingDisabled() bool {
	if !c.Known {
		return false
	}
	switch strings.ToLower(strings.TrimSpace(c.PrefixCaching)) {
	case "false", "0", "no", "off":
		return true
	}
	return false
}

// ModelConfig is the agreed cache configuration of one model's targets.
type ModelConfig struct {
	Model     string   `json:"model"`
	BlockSize int      `json:"block_size,omitempty"` // 0: unknown
	HashAlgo  string   `json:"prefix_caching_hash_algo,omitempty"`
	Agreed    bool     `json:"agreed"`              // no conflicts among known configs
	Conflicts []string `json:"conflicts,omitempty"` // human-readable
	Targets   int      `json:"targets"`
}

// Target is one target in a Snapshot. Its fields are immutable; Load and
// the in-flight accounting read live atomics.
type Target struct {
	ID     targetid.ID
	Spec   TargetSpec
	Name   string // ID.String(), the target label of every package
	Source string // "flag", "file" or "dns"
	State  State
	Reason Reason
	Detail string
	Since  time.Time // when State last changed
	// Models served: the configured ones, else those GET /v1/models lists.
	Models []string
	// Scraped is the last scraped load.
	Scraped Load
	// Cache is the target's discovered cache configuration; ConfigConflict
	// is non-empty when it disagrees with its peers or the flags.
	Cache          CacheConfig
	ConfigConflict string

	conflictModels []string
	live           *live
}

// CanRoute reports whether new work may go to the target now. It reads the
// live circuit breaker, so a breaker that opened since the snapshot was
// built is honoured at once.
func (t *Target) CanRoute() bool {
	if t == nil || (t.State != StateRoutable && t.State != StateDegraded) {
		return false
	}
	return t.live.breakerAllows()
}

// Busy is the combined load of a target: the last scrape plus the
// in-flight accounting of this router and of the other router replicas
// that share theirs (SetPeerFlights), which together are what the fleet's
// front door has sent the pod and not seen answered.
type Busy struct {
	Load
	// InFlight are requests dispatched and not finished, by this router
	// and its peers.
	InFlight int64
	// Prefilling are in-flight requests without a first byte yet.
	Prefilling int64
	// QueuedPromptTokens are the prompt tokens of this router's
	// prefilling requests (peers share only the uncached ones);
	// QueuedUncachedTokens the uncached prompt tokens of every prefilling
	// request, this router's and its peers'.
	QueuedPromptTokens   int64
	QueuedUncachedTokens int64
	// Peers is the part of InFlight, Prefilling and QueuedUncachedTokens
	// the other replicas reported.
	Peers Flights
}

// Flights is a router's in-flight work on one target: what replicas share
// with each other so that each sees the queue the others put on a pod.
type Flights struct {
	InFlight             int64 `json:"in_flight"`
	Prefilling           int64 `json:"prefilling"`
	QueuedUncachedTokens int64 `json:"queued_uncached_tokens"`
}

// IsZero reports whether f holds no work.
func (f Flights) IsZero() bool { return f == Flights{} }

// Add is f plus g.
func (f Flights) Add(g Flights) Flights {
	return Flights{InFlight: f.InFlight + g.InFlight, Prefilling: f.Prefilling + g.Prefilling,
		QueuedUncachedTokens: f.QueuedUncachedTokens + g.QueuedUncachedTokens}
}

// Busy returns the target's combined load. Lock-free.
func (t *Target) Busy() Busy {
	if t == nil {
		return Busy{}
	}
	b := Busy{
		Load:                 t.Scraped,
		InFlight:             t.live.inflight.Load(),
		Prefilling:           t.live.prefilling.Load(),
		QueuedPromptTokens:   t.live.queuedPrompt.Load(),
		QueuedUncachedTokens: t.live.queuedUncached.Load(),
	}
	if p := t.live.peers.Load(); p != nil {
		b.Peers = *p
		b.InFlight += p.InFlight
		b.Prefilling += p.Prefilling
		b.QueuedUncachedTokens += p.QueuedUncachedTokens
	}
	return b
}

// Flights is this router's own in-flight work on the target, as it shares
// it with its peers. Lock-free.
func (t *Target) Flights() Flights {
	if t == nil {
		return Flights{}
	}
	return Flights{InFlight: t.live.inflight.Load(), Prefilling: t.live.prefilling.Load(),
		QueuedUncachedTokens: t.live.queuedUncached.Load()}
}

// SetPeerFlights replaces what the other router replicas report of the
// target (their sum); Busy adds it to this router's own. Lock-free.
func (t *Target) SetPeerFlights(f Flights) {
	if t == nil {
		return
	}
	if f.IsZero() {
		t.live.peers.Store(nil)
		return
	}
	t.live.peers.Store(&f)
}

// Dispatch records that the router sent a request to the target with
// promptTokens tokens, uncachedTokens of which it expects the pod to compute
// (pass promptTokens when unknown): they queue on the target until its
// first byte. The returned Flight must be finished.
func (t *Target) Dispatch(promptTokens, uncachedTokens int) *Flight {
	if t == nil {
		return nil
	}
	return t.live.dispatch(promptTokens, uncachedTokens)
}

// Pace is how fast the target worked off its queued prefill, as its
// flights' first bytes showed.
func (t *Target) Pace() Pace {
	if t == nil {
		return Pace{}
	}
	return t.live.pace.pace()
}

// Snapshot is an immutable view of all targets, rebuilt on every change and
// published atomically. Never modify it.
type Snapshot struct {
	// Version increases with every rebuild.
	Version uint64
	Built   time.Time
	// Targets sorted by endpoint and rank, draining ones included.
	Targets []*Target
	// Models maps each served model to its cache configuration.
	Models map[string]ModelConfig

	byID    map[targetid.ID]*Target
	byModel map[string][]*Target
}

// Target returns the target with the given id.
func (s *Snapshot) Target(id targetid.ID) (*Target, bool) {
	if s == nil {
		return nil, false
	}
	t, ok := s.byID[id]
	return t, ok
}

// ForModel returns the targets serving model, routable or not (filter with
// CanRoute and Spec.Role). The slice is shared: do not modify it.
func (s *Snapshot) ForModel(model string) []*Target {
	if s == nil {
		return nil
	}
	return s.byModel[model]
}

// ModelNames returns the served models, sorted.
func (s *Snapshot) ModelNames() []string {
	if s == nil {
		return nil
	}
	out := make([]string, 0, len(s.byModel))
	for m := range s.byModel {
		out = append(out, m)
	}
	sortStrings(out)
	return out
}

// Routable reports whether at least one target can take work (the router's
// /ready).
func (s *Snapshot) Routable() bool {
	if s == nil {
		return false
	}
	for _, t := range s.Targets {
		if t.CanRoute() {
			return true
		}
	}
	return false
}
