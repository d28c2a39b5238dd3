package speculative

import (
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// Arm is how a request is routed: with predictions, or without them (the
// holdback, against which the benefit is measured).
type Arm uint8

// Arms.
const (
	ArmSpeculative Arm = iota
	ArmHoldback
	numArms
)

var armNames = [numArms]string{"speculative", "holdback"}

func (a Arm) String() string {
	if a < numArms {
		return armNames[a]
	}
	return "unknown"
}

// Basis says what a conversation's arm was derived from.
type Basis uint8

// Bases, in the order they are tried.
const (
	// BasisOff: the holdback is off; every request is speculative.
	BasisOff Basis = iota
	// BasisSession: the X-Session-Id header.
	BasisSession
	// BasisUser: the OpenAI user field.
	BasisUser
	// BasisPrompt: the first block where the prompt parts from the
	// prefixes the model's recent traffic shares.
	BasisPrompt
	// BasisRequest: none of the above could be read (every block read is
	// shared, or there are none): the request alone, so the holdback's
	// share stays right though such a conversation may change arms.
	BasisRequest
	numBases
)

var basisNames = [numBases]string{"off", "session", "user", "prompt", "request"}

func (b Basis) String() string {
	if b < numBases {
		return basisNames[b]
	}
	return "unknown"
}

// Conversation is what a request's arm is derived from.
type Conversation struct {
	Model     string
	SessionID string // the X-Session-Id header
	User      string // the OpenAI user field
	RequestID string // the last resort (BasisRequest)
	// Keys are the prompt's block keys as the decision read them; they
	// must reach past the prefixes the model's traffic shares for the
	// prompt to be the basis.
	Keys []kvindex.Key
}

// Assignment is a request's arm and what it was derived from.
type Assignment struct {
	Arm   Arm
	Basis Basis
	// Group is the conversation's variance group (below NumGroups): a
	// conversation's requests resemble each other, so the spread of an
	// arm's cached tokens is measured between groups of conversations
	// drawn at random, not between requests (incrementalStdErr).
	Group uint8
}

// NumGroups is the number of variance groups the conversations of an arm
// are hashed into.
const NumGroups = 64

// Assign gives a request its arm, stably per conversation: by its session
// or user when the client names one, otherwise by the first block where
// the prompt parts from the prefixes the model's recent traffic shares
// (the first block of the conversation's own content: the same block in
// every later turn), never by a block every request shares. The share of
// conversations in the holdback is --holdback. The router calls it before
// the decision of a request it would route with predictions; a holdback
// request is decided without them. Every call also feeds the model's
// record of shared prefixes.
func (s *Store) Assign(c Conversation) Assignment {
	hb := s.arms
	if hb.threshold == 0 {
		return Assignment{Arm: ArmSpeculative, Basis: BasisOff}
	}
	m := hb.model(c.Model)
	var h uint64
	basis := BasisRequest
	part := m.sharing.parting(c.Keys)
	switch {
	case c.SessionID != "":
		basis, h = BasisSession, hashString("session", c.SessionID)
	case c.User != "":
		basis, h = BasisUser, hashString("user", c.User)
	case part < len(c.Keys):
		basis, h = BasisPrompt, mix64(uint64(c.Keys[part]))
	case c.RequestID != "":
		h = hashString("request", c.RequestID)
	default:
		h = rand.Uint64()
	}
	// The arm takes h's low end; the group mixes it again, so that the
	// holdback's few conversations spread over every group.
	a := Assignment{Arm: ArmSpeculative, Basis: basis, Group: uint8(mix64(h^groupSalt) % NumGroups)}
	if h < hb.threshold {
		a.Arm = ArmHoldback
	}
	m.mu.Lock()
	m.bases[basis]++
	m.mu.Unlock()
	return a
}

// groupSalt parts a conversation's group from its arm.
const groupSalt = 0x6772_6f75_7073_616c

// hashString hashes a kind and a value (FNV-1a, then mixed): the same
// conversation gets the same arm in every router replica and after a
// restart.
func hashString(kind, v string) uint64 {
	f := fnv.New64a()
	f.Write([]byte(kind))
	f.Write([]byte{0})
	f.Write([]byte(v))
	return mix64(f.Sum64())
}

// mix64 is SplitMix64's finalizer: every input bit moves every output bit.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Outcome is what the router learned of one routed request once it
// ended, for the holdback's comparison and the follower's accounting.
type Outcome struct {
	Model string
	Arm   Arm
	// PromptTokens is the prompt's length as the router counted it;
	// PredictedCached the tokens it expected the pod to serve from cache.
	PromptTokens    int
	PredictedCached int
	// ReportedCached is usage.prompt_tokens_details.cached_tokens, when
	// CachedReported.
	ReportedCached int
	CachedReported bool
	// TTFT is the time to the first response byte (0: none).
	TTFT time.Duration
	// Group is the request's Assignment.Group.
	Group uint8
	// Follower is what Follow returned at dispatch, or nil.
	Follower *Follower
}

// Record takes a request's outcome: its arm's requests, prompt tokens,
// reported cached tokens and TTFT, and for a follower the funnel's
// reported cached tokens and, if a prediction it was routed on failed, the
// prefill tokens its false-warm route cost. The router calls it once per
// request that reached a pod, when its usage is known.
func (s *Store) Record(o Outcome) {
	if o.Follower != nil {
		o.Follower.record(o.PredictedCached, o.ReportedCached, o.CachedReported)
	}
	if o.Arm >= numArms {
		return
	}
	m := s.arms.model(o.Model)
	m.mu.Lock()
	defer m.mu.Unlock()
	a := &m.arms[o.Arm]
	a.requests++
	a.promptTokens += int64(max(0, o.PromptTokens))
	if o.CachedReported {
		c := int64(max(0, o.ReportedCached))
		a.reportedRequests++
		a.cachedTokens += c
		g := &a.groups[o.Group%NumGroups]
		g.requests++
		g.cachedTokens += c
	}
	if o.TTFT > 0 {
		a.ttft.add(o.TTFT, false)
		a.ttftHist.Observe(o.TTFT.Seconds())
	}
}

// IncrementalReuse is the benefit of speculation in cached tokens: the
// speculative arm's cached tokens minus the holdback's scaled to the same
// number of requests (each arm's requests with reported cached tokens).
// 360,000 cached tokens against a holdback's 210,000 at equal volume give
// 150,000. ok is false while either arm has no reported request.
func IncrementalReuse(specCached, specRequests, holdCached, holdRequests int64) (tokens float64, ok bool) {
	if specRequests <= 0 || holdRequests <= 0 {
		return 0, false
	}
	return float64(specCached) - float64(holdCached)*float64(specRequests)/float64(holdRequests), true
}

// groupSums are one variance group's reported requests and their cached
// tokens.
type groupSums struct{ requests, cachedTokens int64 }

// incrementalStdErr is the standard error of IncrementalReuse, from each
// arm's variance groups (conversations hashed into NumGroups groups at
// random; a conversation's requests stay in one). An arm's cached tokens
// per request is a ratio of sums, Y/N; its variance is
// G/(G−1) · Σ_g (Y_g − (Y/N)·N_g)² / N² over its G groups with requests,
// and the incremental reuse's standard error is the speculative arm's
// requests × √(var_spec + var_hold). Requests of one conversation count as
// one draw, not many. ok is false while an arm has requests in fewer than
// two groups.
func incrementalStdErr(spec, hold []groupSums) (float64, bool) {
	vs, ok1 := ratioVariance(spec)
	vh, ok2 := ratioVariance(hold)
	if !ok1 || !ok2 {
		return 0, false
	}
	var n int64
	for _, g := range spec {
		n += g.requests
	}
	return float64(n) * math.Sqrt(vs+vh), true
}

// usedGroups is the number of groups with requests.
func usedGroups(groups []groupSums) int {
	n := 0
	for _, g := range groups {
		if g.requests > 0 {
			n++
		}
	}
	return n
}

// ratioVariance is the variance of Σ cachedTokens / Σ requests over the
// groups, by the groups' spread about it.
func ratioVariance(groups []groupSums) (float64, bool) {
	var y, n float64
	for _, g := range groups {
		y, n = y+float64(g.cachedTokens), n+float64(g.requests)
	}
	used := usedGroups(groups)
	if used < 2 {
		return 0, false
	}
	r, ss := y/n, 0.0
	for _, g := range groups {
		if g.requests > 0 {
			d := float64(g.cachedTokens) - r*float64(g.requests)
			ss += d * d
		}
	}
	return float64(used) / float64(used-1) * ss / (n * n), true
}

// incremental is m's incremental reuse and its standard error (each ok
// when known). The caller holds m.mu.
func (m *modelArms) incremental() (inc float64, incOK bool, se float64, seOK bool) {
	spec, hold := &m.arms[ArmSpeculative], &m.arms[ArmHoldback]
	inc, incOK = IncrementalReuse(spec.cachedTokens, spec.reportedRequests, hold.cachedTokens, hold.reportedRequests)
	se, seOK = incrementalStdErr(spec.groups[:], hold.groups[:])
	return inc, incOK, se, seOK
}

// holdback holds the arms' assignment and numbers per model.
type holdback struct {
	fraction  float64
	threshold uint64 // a conversation hashing below it is held back
	models    sync.Map
}

func newHoldback(fraction float64) *holdback {
	return &holdback{fraction: fraction, threshold: uint64(fraction * math.Exp2(64))}
}

func (hb *holdback) model(name string) *modelArms {
	if m, ok := hb.models.Load(name); ok {
		return m.(*modelArms)
	}
	m, _ := hb.models.LoadOrStore(name, &modelArms{arms: [numArms]armStats{newArmStats(), newArmStats()}})
	return m.(*modelArms)
}

// modelArms is one model's arms.
type modelArms struct {
	sharing sharing
	mu      sync.Mutex
	arms    [numArms]armStats
	bases   [numBases]uint64
}

// armStats are one arm's numbers.
type armStats struct {
	requests, promptTokens         int64
	reportedRequests, cachedTokens int64
	// groups split them by the conversations' variance groups.
	groups   [NumGroups]groupSums
	ttft     latencies
	ttftHist histogram
}

func newArmStats() armStats { return armStats{ttftHist: newHistogram(ttftBuckets)} }

// Recent prefix sharing, per model. A block is shared when the traffic
// parts after it (recent prompts continued it with at least two different
// next blocks), and so is every block before it. A conversation's later
// turns extend its earlier ones and do not part, so the first block after
// the shared ones on its path stays the same turn after turn; a count of
// how often each block was seen would not do, since a long conversation's
// own blocks are seen as often as a shared prompt's.
//
// Block keys are chained (a key stands for its whole prefix), so the
// record is closed under prefixes: every recorded prompt's blocks are all
// recorded, and every shared block's ancestors are shared. Both the
// recorded run of a prompt and its shared run are then found by binary
// search, and a request costs O(log n) reads plus at most sharingAhead
// writes, however long the shared prompt or the conversation.
const (
	// sharingMaxNodes bounds the record (about 40 bytes a block): once
	// full it keeps only the shared blocks (a few system and tenant
	// prompts, so conversations behind them keep their arms), or, when
	// those fill half of it, starts over.
	sharingMaxNodes = 1 << 18
	// sharingMaxWalk bounds the blocks of a prompt the record holds: a
	// parting point is found anywhere before it. 4,096 blocks of 16
	// tokens is 64k tokens.
	sharingMaxWalk = 4096
	// sharingAhead is how many blocks past its recorded run a request
	// records. A prefix longer than that is learned over several
	// requests, each recording further along it: a 170-block system
	// prompt (2,700 tokens of 16) is known to be shared from the fourth
	// conversation behind it.
	sharingAhead = 64
)

type sharing struct {
	mu    sync.Mutex
	nodes map[kvindex.Key]sharedNode
}

// sharedNode is what the record knows of a block: the first next block
// seen, and whether it is shared.
type sharedNode struct {
	next    kvindex.Key
	hasNext bool
	shared  bool
}

// parting records a prompt's blocks and returns the index of its first
// block after the blocks recent traffic shares: 0 when none is shared,
// len(keys) when every block read is. Before the second prompt with a
// given first block arrives nothing is known to be shared, so the first
// conversation behind a new system prompt is placed by block 0.
func (sh *sharing) parting(keys []kvindex.Key) int {
	keys = keys[:min(len(keys), sharingMaxWalk)]
	if len(keys) == 0 {
		return 0
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if len(sh.nodes)+len(keys) > sharingMaxNodes || sh.nodes == nil {
		sh.restart()
	}
	// seen: the prompt's leading blocks the record holds.
	seen := sort.Search(len(keys), func(i int) bool { _, ok := sh.nodes[keys[i]]; return !ok })
	if seen > 0 && seen < len(keys) {
		last := sh.nodes[keys[seen-1]]
		switch {
		case last.hasNext && last.next != keys[seen]:
			// Another prompt went on from here with another block:
			// the traffic parts here.
			sh.markShared(keys[:seen])
		case !last.hasNext:
			// A prompt ended here (this conversation's earlier turn):
			// this one extends it.
			last.next, last.hasNext = keys[seen], true
			sh.nodes[keys[seen-1]] = last
		}
	}
	for i := seen; i < min(len(keys), seen+sharingAhead); i++ {
		var n sharedNode
		if i+1 < len(keys) {
			n.next, n.hasNext = keys[i+1], true
		}
		sh.nodes[keys[i]] = n
	}
	return sort.Search(len(keys), func(i int) bool { return !sh.nodes[keys[i]].shared })
}

// markShared marks a recorded path's blocks shared, from its end back to
// the first block already shared (whose ancestors are).
func (sh *sharing) markShared(path []kvindex.Key) {
	for i := len(path) - 1; i >= 0; i-- {
		n := sh.nodes[path[i]]
		if n.shared {
			return
		}
		n.shared = true
		sh.nodes[path[i]] = n
	}
}

// restart empties a full record but for its shared blocks (closed under
// prefixes, so the record stays closed), unless they fill half of it.
func (sh *sharing) restart() {
	old := sh.nodes
	sh.nodes = make(map[kvindex.Key]sharedNode)
	kept := 0
	for _, n := range old {
		if n.shared {
			kept++
		}
	}
	if kept > sharingMaxNodes/2 {
		return
	}
	for k, n := range old {
		if n.shared {
			sh.nodes[k] = n
		}
	}
}
