package sim

import (
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
)

// Config describes a fleet of identical simulated pods.
// DefaultReplayBuffer is how many batches a pod keeps for replay unless
// told: vLLM's default buffer steps.
const DefaultReplayBuffer = 10000

type Config struct {
	// Pods is the number of pods (default 1).
	Pods int
	// Profile is the hardware/model profile; the zero value means
	// DefaultProfile.
	Profile Profile
	// Model overrides the served model name (default Profile.Model).
	Model string
	// LoRAs are adapter names served as models besides the base model; the
	// adapter's lora_id is its position + 1, as vLLM numbers loaded adapters.
	LoRAs []string
	// Tokenizer is "bytes" (default: the built-in bytes model) or a model
	// directory / tokenizer.json path understood by the tokenize package.
	Tokenizer string
	// TokenizerImpl, when set, is used instead of loading Tokenizer.
	TokenizerImpl Tokenizer

	// HashAlgo and HashSeed are vLLM's --prefix-caching-hash-algo and the
	// pods' PYTHONHASHSEED (defaults sha256 and "0"). HashSeed is hashed as
	// the string vLLM reads from the environment, whatever it says.
	HashAlgo kvindex.HashAlgo
	HashSeed string
	// RandomHashSeed models pods started without PYTHONHASHSEED: vLLM then
	// roots every EngineCore process's hashes (each data-parallel rank's)
	// at 32 random bytes, drawn anew at every restart, so nobody outside
	// can reproduce them and a router must key blocks by their tokens.
	// HashSeed must be empty.
	RandomHashSeed bool

	// KVSpec is the KV-cache layout the pods report in BlockStored events:
	// KVSpecFullAttention (default), KVSpecMLA, KVSpecSinkFullAttention
	// (one group of that kind), or KVSpecHybrid: a full-attention group 0
	// and a sliding-window group 1 holding the same block hashes, as vLLM's
	// hybrid allocator reports them.
	KVSpec string
	// SlidingWindow is the hybrid sliding-window group's window in tokens
	// (default 1024).
	SlidingWindow int

	// CPUOffloadBlocks, when positive, gives each rank a CPU offloading
	// tier of that many blocks: blocks the GPU evicts are kept there (LRU)
	// and reported with medium "CPU", as vLLM's offloading connector does.
	CPUOffloadBlocks int
	// CPULoadPerBlock is the model time to load one block from the CPU tier
	// instead of recomputing it (default DefaultCPULoadPerBlock).
	CPULoadPerBlock time.Duration

	// DP is the number of data-parallel ranks per pod (default 1).
	DP int

	// PrefillPods, when positive, makes the fleet prefill/decode
	// disaggregated: the first PrefillPods pods are announced with
	// role=prefill in their endpoints, the others with role=decode. Every
	// pod behaves the same whatever its role, as a vLLM server with a
	// kv_both NixlConnector: it answers a do_remote_decode request with the
	// kv_transfer_params a decode needs and loads a do_remote_prefill
	// request's prompt blocks from the engine they name. Must be below Pods.
	PrefillPods int
	// KVTransferPerBlock is the model time a decode pod takes to pull one
	// block from a remote prefill engine instead of computing it (default
	// DefaultKVTransferPerBlock of the profile's block size).
	KVTransferPerBlock time.Duration

	// Host is the address everything binds to (default 127.0.0.1).
	Host string
	// HTTPPort is the first pod's HTTP port; pod i listens on HTTPPort+i.
	// 0 lets the OS choose a port per pod.
	HTTPPort int
	// EventsPort is the first pod's event port. Pod i, rank r publishes on
	// EventsPort + 2·DP·i + r and answers replay on EventsPort + 2·DP·i + DP + r.
	// 0 lets the OS choose (each pod still gets consecutive ports per rank).
	EventsPort int
	// Topic is the PUB topic frame (vLLM's default is empty; with
	// EventsConnect, kv@HOST:PORT@MODEL of each pod's HTTP address).
	Topic string
	// EventsConnect, when set (tcp://HOST:PORT), makes every pod's
	// publishers connect there instead of binding, as vLLM does with an
	// endpoint without a wildcard: rank r connects to PORT + r. Replay
	// sockets stay bound on the pods (rank r's on the events port's place:
	// EventsPort + 2·DP·i + DP + r).
	EventsConnect string
	// EventEncoding is map (vLLM ≥ 0.26, default) or array (older vLLM).
	EventEncoding events.Encoding
	// LegacyReplay answers replay without the topic frame (before vLLM PR
	// #45177).
	LegacyReplay bool
	// ReplayBuffer is the number of batches kept for replay (default
	// DefaultReplayBuffer).
	ReplayBuffer int

	// TimeScale runs model time this many times faster than the wall clock
	// (default 1). Reported in /metrics (prefixrouter_sim_time_scale) and in
	// the X-Sim-Time-Scale header.
	TimeScale float64

	// StreamInterval is the least model time between two chunks of a
	// stream after its first (default 0: a chunk per engine step that
	// produced a token). The first token always leaves at once; a longer
	// interval coalesces later tokens into fewer chunks, which keeps a
	// small machine from spending itself on SSE writes.
	StreamInterval time.Duration

	// Faults is the initial fault state of every pod.
	Faults Faults
	// RestartDowntime is how long (model time) a restarting pod answers 503.
	RestartDowntime time.Duration

	// DisablePromptTokensDetails leaves usage.prompt_tokens_details null, as
	// vLLM without --enable-prompt-tokens-details.
	DisablePromptTokensDetails bool
	// DefaultMaxTokens applies when a request gives no max_tokens (default
	// 16; vLLM would use the rest of the context for chat).
	DefaultMaxTokens int
	// MaxBodyBytes bounds request bodies (default 32 MiB).
	MaxBodyBytes int64
	// APIKey, when set, guards the pods as vLLM's --api-key does: every
	// path under /v1 wants "Authorization: Bearer APIKey" (401 otherwise);
	// /health, /metrics, /tokenize and the rest stay open.
	APIKey string

	// Seed makes random faults reproducible.
	Seed uint64
	// Logger receives the pods' logs (default slog.Default()).
	Logger *slog.Logger
}

func (c *Config) withDefaults() (Config, error) {
	out := *c
	if out.Pods == 0 {
		out.Pods = 1
	}
	if out.Profile.Name == "" && out.Profile.NumGPUBlocks == 0 {
		p, err := LookupProfile(DefaultProfile)
		if err != nil {
			return out, err
		}
		out.Profile = p
	}
	if out.Model == "" {
		out.Model = out.Profile.Model
	}
	out.Profile.Model = out.Model
	if out.HashAlgo == 0 {
		out.HashAlgo = kvindex.AlgoSHA256
	}
	if out.HashSeed == "" && !out.RandomHashSeed {
		out.HashSeed = "0"
	}
	if out.KVSpec == "" {
		out.KVSpec = KVSpecFullAttention
	}
	if out.SlidingWindow == 0 && out.KVSpec == KVSpecHybrid {
		out.SlidingWindow = 1024
	}
	if out.CPULoadPerBlock == 0 && out.CPUOffloadBlocks > 0 {
		out.CPULoadPerBlock = DefaultCPULoadPerBlock
	}
	if out.DP == 0 {
		out.DP = 1
	}
	if out.KVTransferPerBlock == 0 {
		out.KVTransferPerBlock = DefaultKVTransferPerBlock(out.Profile.BlockSize)
	}
	if out.Host == "" {
		out.Host = "127.0.0.1"
	}
	if out.ReplayBuffer == 0 {
		out.ReplayBuffer = DefaultReplayBuffer
	}
	if out.TimeScale == 0 {
		out.TimeScale = 1
	}
	if out.DefaultMaxTokens == 0 {
		out.DefaultMaxTokens = 16
	}
	if out.MaxBodyBytes == 0 {
		out.MaxBodyBytes = 32 << 20
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	switch {
	case out.Pods < 0 || out.Pods > 1024:
		return out, fmt.Errorf("pods %d out of range 1..1024", out.Pods)
	case out.PrefillPods < 0 || out.PrefillPods >= out.Pods:
		return out, fmt.Errorf("prefill pods %d: want 0 (no disaggregation) up to pods - 1 = %d, leaving a decode pod", out.PrefillPods, out.Pods-1)
	case out.KVTransferPerBlock < 0:
		return out, fmt.Errorf("KV transfer time per block %v must not be negative", out.KVTransferPerBlock)
	case out.DP < 1 || out.DP > 64:
		return out, fmt.Errorf("data-parallel size %d out of range 1..64", out.DP)
	case out.TimeScale < 0 || out.TimeScale > 1e6:
		return out, fmt.Errorf("time scale %v out of range (0, 1e6]", out.TimeScale)
	case out.ReplayBuffer < 0:
		return out, fmt.Errorf("replay buffer %d must be positive", out.ReplayBuffer)
	case out.HTTPPort < 0 || out.HTTPPort+out.Pods > 65536:
		return out, fmt.Errorf("HTTP ports %d..%d out of range", out.HTTPPort, out.HTTPPort+out.Pods-1)
	case out.EventsPort < 0 || out.EventsPort+2*out.DP*out.Pods > 65536:
		return out, fmt.Errorf("event ports %d..%d out of range", out.EventsPort, out.EventsPort+2*out.DP*out.Pods-1)
	case out.EventsConnect != "" && !validConnect(out.EventsConnect, out.DP):
		return out, fmt.Errorf("events connect address %q: want tcp://HOST:PORT with PORT + %d ranks within 1..65535", out.EventsConnect, out.DP)
	case out.RandomHashSeed && out.HashSeed != "":
		return out, fmt.Errorf("hash seed %q given with a random hash seed", out.HashSeed)
	case !slices.Contains(KVSpecNames(), out.KVSpec):
		return out, fmt.Errorf("KV-cache spec %q: want one of %s", out.KVSpec, strings.Join(KVSpecNames(), ", "))
	case out.SlidingWindow < 0 || out.SlidingWindow > 1<<24:
		return out, fmt.Errorf("sliding window %d out of range", out.SlidingWindow)
	case out.CPUOffloadBlocks < 0 || out.CPUOffloadBlocks > 1<<26:
		return out, fmt.Errorf("CPU offload blocks %d out of range 0..%d", out.CPUOffloadBlocks, 1<<26)
	case out.CPULoadPerBlock < 0:
		return out, fmt.Errorf("CPU load time per block %v must not be negative", out.CPULoadPerBlock)
	case out.CPUOffloadBlocks > 0 && out.KVSpec == KVSpecHybrid:
		// The offloading connector's handling of several groups is not
		// modelled; refuse rather than publish events vLLM would not.
		return out, fmt.Errorf("CPU offloading with the hybrid KV-cache spec is not simulated")
	case out.StreamInterval < 0:
		return out, fmt.Errorf("stream interval %v must not be negative", out.StreamInterval)
	case out.DefaultMaxTokens < 1:
		return out, fmt.Errorf("default max tokens %d must be positive", out.DefaultMaxTokens)
	}
	if out.EventsPort != 0 && out.HTTPPort != 0 {
		hLo, hHi := out.HTTPPort, out.HTTPPort+out.Pods
		eLo, eHi := out.EventsPort, out.EventsPort+2*out.DP*out.Pods
		if hLo < eHi && eLo < hHi {
			return out, fmt.Errorf("HTTP ports %d..%d overlap event ports %d..%d", hLo, hHi-1, eLo, eHi-1)
		}
	}
	seen := map[string]bool{out.Model: true}
	for _, l := range out.LoRAs {
		if l == "" || seen[l] {
			return out, fmt.Errorf("LoRA adapter name %q empty or repeated", l)
		}
		seen[l] = true
	}
	if err := out.Profile.Validate(); err != nil {
		return out, err
	}
	if err := out.Faults.Validate(); err != nil {
		return out, err
	}
	return out, nil
}

// validConnect checks an EventsConnect address for dp ranks.
func validConnect(addr string, dp int) bool {
	hp, ok := strings.CutPrefix(addr, "tcp://")
	if !ok {
		return false
	}
	host, ps, err := net.SplitHostPort(hp)
	if err != nil || host == "" || host == "*" {
		return false
	}
	port, err := strconv.Atoi(ps)
	return err == nil && port >= 1 && port+dp-1 <= 65535
}

// CheckConfig reports a configuration StartFleet would reject, without
// starting anything.
func CheckConfig(c Config) error {
	_, err := c.withDefaults()
	return err
}

// KV-cache specs a pod can report (Config.KVSpec).
const (
	KVSpecFullAttention     = events.SpecFullAttention
	KVSpecMLA               = events.SpecMLAAttention
	KVSpecSinkFullAttention = events.SpecSinkFullAttention
	// KVSpecHybrid is a full-attention group plus a sliding-window group.
	KVSpecHybrid = "hybrid"
)

// specSlidingWindow is vLLM's kv_cache_spec_kind of a sliding-window group.
const specSlidingWindow = "sliding_window"

// KVSpecNames lists the accepted Config.KVSpec values.
func KVSpecNames() []string {
	return []string{KVSpecFullAttention, KVSpecMLA, KVSpecSinkFullAttention, KVSpecHybrid}
}

// DefaultCPULoadPerBlock is the time to copy one 16-token block from host
// memory: 2 MiB for the 8B profile (16 × 128 KiB) over PCIe Gen5 x16 at an
// effective ~50 GB/s is 42 µs; the 32B TP2 profile moves 4 MiB split over
// two GPUs' links, the same 42 µs.
const DefaultCPULoadPerBlock = 42 * time.Microsecond
