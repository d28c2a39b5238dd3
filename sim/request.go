package sim

import (
	"errors"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// Errors a request can end with.
var (
	errPrefillFailed = errors.New("simulated failure during prefill")
	errRestarted     = errors.New("engine restarted")
	errEngineDead    = errors.New("EngineCore encountered an issue: the engine is dead")
	errAborted       = errors.New("request aborted")
	errClosed        = errors.New("engine closed")
)

// seq is one request inside an engine: vLLM's Request. Everything but out
// belongs to the engine goroutine once the request is submitted.
type seq struct {
	// The fields every step reads for every running request come first,
	// within the struct's first two cache lines: a step over hundreds of
	// requests is bound by memory latency, not by its arithmetic.
	tokens      []uint32         // prompt, then generated tokens
	hashes      []kvindex.Digest // one per full block of tokens
	blocks      []int32
	promptLen   int
	maxTokens   int
	numComputed int
	nextPoke    time.Duration // model time before which a new token does not wake the stream's writer
	out         *output
	rankReq     *Request // the handle a Rank gave out for it (nil on a pod): a Rank reaches it from the step's schedule without a map probe
	state       seqState
	failPrefill bool
	looked      bool
	// kvAnswer marks the prefill of a disaggregated request
	// (do_remote_decode): it finishes by recording its blocks in out.
	kvAnswer        bool
	numCachedBlocks int // leading blocks already registered in the cache

	id       string
	extras   kvindex.RequestExtras
	loraID   int64
	hasher   *kvindex.Hasher // the one hashes were computed with
	swBlocks []int32         // sliding-window group's blocks (noBlock outside the window)
	arrival  time.Duration   // model time
	// remoteBlocks is how many of the prompt's blocks a live remote
	// prefill engine holds for this decode; 0 once pulled or when none.
	remoteBlocks int

	hitMemo    []int32 // the GPU hit of its last scheduling attempt (blockPool.lookupFrom)
	hitMemoAt  uint64  // the pool's losses when hitMemo was looked up
	expectHits int     // cached blocks when it joined the queue (Pod.Probe's estimate until it is scheduled)
}

type seqState uint8

const (
	stateNew seqState = iota
	stateWaiting
	stateRunning
	stateDone
)

func (s *seq) numTokens() int { return len(s.tokens) }

// output is what the HTTP side sees of a running request. The engine
// updates it after each step and pokes notify; the reader takes whatever
// has accumulated, so later tokens coalesce into fewer chunks.
type output struct {
	mu        sync.Mutex
	generated int
	cached    int           // prompt tokens served from the prefix cache
	ttft      time.Duration // model time from arrival to first token
	done      bool
	finish    string
	err       error
	notify    chan struct{}
	// kvBlocks and kvEngine are a finished prefill's block ids and engine
	// id when the request asked for them (do_remote_decode).
	kvBlocks []int32
	kvEngine string
}

// kvTransfer returns the finished prefill's block ids and engine id.
func (o *output) kvTransfer() ([]int32, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.kvBlocks, o.kvEngine
}

func (o *output) poke() {
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

// Snapshot is a point-in-time copy of a request's progress.
type Snapshot struct {
	Generated    int
	CachedTokens int
	// TTFT is the model time from arrival to the first token (zero before it).
	TTFT   time.Duration
	Done   bool
	Finish string
	Err    error
}

func (o *output) snapshot() Snapshot {
	o.mu.Lock()
	defer o.mu.Unlock()
	return Snapshot{Generated: o.generated, CachedTokens: o.cached, TTFT: o.ttft, Done: o.done, Finish: o.finish, Err: o.err}
}
