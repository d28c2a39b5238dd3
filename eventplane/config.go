package eventplane

import (
	"errors"
	"fmt"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex/events"

	"github.com/prefixrouter/prefixrouter/internal/positive"
	"github.com/prefixrouter/prefixrouter/kvindex"
)

// Config is what the serve command's flags set for the event plane. The
// flag name is given with each field; the flag's default is the field's
// value in DefaultConfig.
type Config struct {
	// BlockSize and HashAlgo describe the pods' prefix cache
	// (--block-size, --hash-algo); zero / empty: learned from the pods'
	// vllm:cache_config_info (see Plane.SetCaches).
	BlockSize int
	HashAlgo  string
	// HashSeed is the pods' PYTHONHASHSEED (--hash-seed). With HasHashSeed
	// set, block keys are vLLM's own hashes (exact mode); without it they
	// are derived from the blocks' tokens (token-derived mode). An empty
	// seed is a seed like any other to vLLM, hence the separate flag.
	HashSeed    string
	HasHashSeed bool

	// StaleAfter: a target is stale when requests that filled new full KV
	// blocks were answered (first byte seen), carried at least
	// MinUncachedTokens uncached prompt tokens between them, and no KV
	// event has been received since the earliest of them was dispatched
	// this long ago. Also how long batches lost for good (the subscriber's
	// Unrecovered) keep a target stale after the last loss.
	// Flags --events-stale-after, --events-min-uncached-tokens.
	StaleAfter        time.Duration
	MinUncachedTokens int
	// MaxQueueDepth: a subscriber backlog deeper than this is stale.
	// Flag --events-max-queue-depth.
	MaxQueueDepth int
	// EvalInterval paces freshness evaluation. Flag --events-eval-interval.
	EvalInterval time.Duration
	// EventsListen are the addresses of bound SUB sockets (buses) every
	// pod's publisher may connect to, tcp://ADDR:PORT; rank r's publishers
	// connect to PORT+r. A target whose endpoint names no events= is then
	// expected on a bus, found by its topic. Flag --events-listen.
	EventsListen []string
	// ReplayPort is the pods' replay port for targets fed by a bus whose
	// endpoint names no replay=: rank r's replay socket is
	// tcp://HOST:ReplayPort+r, HOST the topic's (0: none). Flag
	// --replay-port.
	ReplayPort int
	// RoutingWindow is the window over which recent routing volume is
	// reported. Flag --health-routing-window (named before the event
	// plane left health; the name stays for operators).
	RoutingWindow time.Duration

	// What one stream's batches may do: every bound refuses the excess
	// (prefixrouter_kv_refused_total, by reason) and a stream refused a
	// batch in the last minute shows the events_refused wiring fault.
	//
	// MaxMessageBytes: larger messages are dropped by libzmq before they
	// are allocated, on a bus, a pod's own subscription and replay. Flag
	// --events-max-message-bytes.
	MaxMessageBytes int
	// MaxBatchEvents bounds a batch's events, MaxEventBlocks one event's
	// blocks (its token_ids are bounded by its blocks × block size
	// regardless). Flags --events-max-batch-events,
	// --events-max-event-blocks.
	MaxBatchEvents int
	MaxEventBlocks int
	// ClearsPerMinute, ResetsPerMinute, GapsPerMinute bound a stream's
	// AllBlocksCleared events, sequence resets (a lower sequence number
	// taken for a restart) and gaps in any minute. Flags
	// --events-max-clears-per-minute, --events-max-resets-per-minute,
	// --events-max-gaps-per-minute.
	ClearsPerMinute int
	ResetsPerMinute int
	GapsPerMinute   int
	// MaxTopics bounds the topics a bus tracks beyond those it follows
	// (refused and unknown ones). Flag --events-max-topics.
	MaxTopics int
	// OwnerIdle: on a bus, the connection that owns a pod's topic keeps it
	// against any other until it has been silent this long (or health saw
	// the pod restart). Flag --events-owner-idle.
	OwnerIdle time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		StaleAfter:        10 * time.Second,
		MinUncachedTokens: 16,
		MaxQueueDepth:     1000,
		EvalInterval:      500 * time.Millisecond,
		RoutingWindow:     time.Minute,
		MaxMessageBytes:   4 << 20,
		MaxBatchEvents:    16384,
		MaxEventBlocks:    32768,
		ClearsPerMinute:   6,
		ResetsPerMinute:   6,
		GapsPerMinute:     60,
		MaxTopics:         1024,
		OwnerIdle:         10 * time.Second,
	}
}

// fill replaces the zero fields whose zero Validate refuses with the
// defaults, so that a test or an embedder can set a few fields; the serve
// command, which starts from DefaultConfig, has no zero left to fill.
func (c *Config) fill() {
	d := DefaultConfig()
	c.positive().Fill(d.positive())
}

// positive lists the durations and counts that must be positive.
func (c *Config) positive() positive.Fields {
	return positive.Fields{
		Durations: []positive.Duration{
			{Flag: "events-stale-after", V: &c.StaleAfter},
			{Flag: "events-eval-interval", V: &c.EvalInterval},
			{Flag: "health-routing-window", V: &c.RoutingWindow},
			{Flag: "events-owner-idle", V: &c.OwnerIdle},
		},
		Ints: []positive.Int{
			{Flag: "events-min-uncached-tokens", V: &c.MinUncachedTokens},
			{Flag: "events-max-queue-depth", V: &c.MaxQueueDepth},
			{Flag: "events-max-message-bytes", V: &c.MaxMessageBytes},
			{Flag: "events-max-batch-events", V: &c.MaxBatchEvents},
			{Flag: "events-max-event-blocks", V: &c.MaxEventBlocks},
			{Flag: "events-max-clears-per-minute", V: &c.ClearsPerMinute},
			{Flag: "events-max-resets-per-minute", V: &c.ResetsPerMinute},
			{Flag: "events-max-gaps-per-minute", V: &c.GapsPerMinute},
			{Flag: "events-max-topics", V: &c.MaxTopics},
		},
	}
}

// Validate reports every problem in c at once (joined), each naming the
// serve flag that sets the field. It changes nothing.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	errs = append(errs, c.positive().Check()...)
	if c.BlockSize < 0 || c.BlockSize > kvindex.MaxBlockSize {
		bad("--block-size %d: want 1..%d, or 0 to learn it from the pods", c.BlockSize, kvindex.MaxBlockSize)
	}
	if c.HashAlgo != "" {
		if _, err := kvindex.ParseHashAlgo(c.HashAlgo); err != nil {
			bad("--hash-algo: %w", err)
		}
	}
	seen := map[string]bool{}
	for _, addr := range c.EventsListen {
		if _, _, err := kvindex.ParseListenAddr(addr); err != nil {
			bad("--events-listen %w", err)
		} else if seen[addr] {
			bad("--events-listen %q given twice", addr)
		}
		seen[addr] = true
	}
	if c.ReplayPort < 0 || c.ReplayPort > 65535 {
		bad("--replay-port %d: want 1..65535, or 0 for none", c.ReplayPort)
	}
	if c.ReplayPort != 0 && len(c.EventsListen) == 0 {
		bad("--replay-port %d applies to pods on a bus: set --events-listen too (a pod with its own subscription takes replay= in its --endpoint)", c.ReplayPort)
	}
	if c.MaxMessageBytes > 0 && c.MaxMessageBytes < 4096 {
		bad("--events-max-message-bytes %d: want at least 4096 (a batch of a few blocks)", c.MaxMessageBytes)
	}
	if c.HashSeed != "" && !c.HasHashSeed {
		bad("--hash-seed %q is set but HasHashSeed is false (set both, or neither for token-derived keys)", c.HashSeed)
	}
	return errors.Join(errs...)
}

// streamLimits is what each socket-fed stream's batches may do. Tokens per
// event are bounded while decoding by the largest block size; after it, by
// the event's blocks × its block size.
func (c Config) streamLimits() kvindex.StreamLimits {
	return kvindex.StreamLimits{
		Decode: events.Limits{MaxEvents: c.MaxBatchEvents, MaxBlocksPerEvent: c.MaxEventBlocks,
			MaxTokensPerEvent: c.MaxEventBlocks * kvindex.MaxBlockSize},
		ClearsPerMinute: c.ClearsPerMinute, ResetsPerMinute: c.ResetsPerMinute, GapsPerMinute: c.GapsPerMinute,
	}
}
