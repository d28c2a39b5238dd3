package brain

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// Decider is the routing brain: from a request's prompt, the targets the
// health snapshot offers for its model and the placement index, to a
// decision. It knows nothing of HTTP: the API handler, the dry run and the
// benchmark's engines all decide through it.
type Decider struct {
	policy Policy
	// policyName labels the metrics of the requests it decides.
	policyName string
	ch         *chooser
	// plane says what each target's KV-event stream reports: the
	// confirmed placement index, the fleet's block keys (nil until the
	// block size, and in exact mode the hash algorithm, are known) and
	// how far each stream is trusted.
	plane *eventplane.Plane
	// spec holds the predicted placements (speculative policy; nil
	// otherwise): a target's predicted run extends its confirmed one.
	spec *speculative.Store
	// capacity, once flow control is on (NewAdmission), is told whenever
	// a pod's queue gets shorter: a first byte, an end.
	capacity atomic.Pointer[chan struct{}]
}

// capacityFreed tells flow control a pod's queue got shorter.
func (dc *Decider) capacityFreed() {
	if k := dc.capacity.Load(); k != nil {
		select {
		case *k <- struct{}{}:
		default:
		}
	}
}

// New is a decider by policy p and the cost weights, reading the event
// plane and (speculative policy; nil otherwise) the predicted placements.
func New(p Policy, cost CostConfig, plane *eventplane.Plane, spec *speculative.Store) *Decider {
	return &Decider{policy: p, policyName: p.String(), ch: newChooser(p, cost), plane: plane, spec: spec}
}

// Input is everything one decision reads.
type Input struct {
	Model string
	// Targets serve the model (health.Snapshot.ForModel), routable or not.
	Targets []*health.Target
	// Prompt is the request's prompt: ids, a local stream the decision
	// reads only as far as it needs, or an estimated count.
	Prompt Prompt
	Extras kvindex.RequestExtras
	// ApproxText is what the approximate policy hashes (its policy only).
	ApproxText []byte
	// Peek leaves policy state untouched (the dry run): round-robin does
	// not advance, and no holdback arm is drawn.
	Peek bool
	// Conversation names the request's conversation for its holdback arm
	// (speculative policy): the client's session and user, the request id.
	Conversation speculative.Conversation
}

// ErrNoRoutable: no candidate can take the request.
var ErrNoRoutable = errors.New("no routable target")

// KeyError is a prompt whose block keys cannot be computed.
type KeyError struct{ err error }

func (e *KeyError) Error() string { return "cannot compute block keys: " + e.err.Error() }
func (e *KeyError) Unwrap() error { return e.err }

// Decision is what was chosen for a request, from which candidates and
// why. It is not changed once made: a retry makes another (Retry),
// and what is learned after dispatch (the rest of the prompt) belongs to
// the request's Tail.
type Decision struct {
	model  string
	cands  []Candidate
	chosen int // index into cands
	reason string
	// prompt is the prompt as the decision read it. When the decision
	// stopped reading early, count is an estimate and stream holds the
	// rest, which only the prompt tail reads.
	prompt    Prompt
	blockSize int
	// chain holds the block keys read: up to the first block no target
	// holds, or up to where the decision settled.
	chain  kvindex.KeyChain
	keyer  kvindex.Keyer
	extras kvindex.RequestExtras
	// settled is set when reading stopped while the chosen target still
	// held every block so far: no other target could catch up, so more
	// blocks could only lengthen the winner's run. Its whole run is looked
	// up after dispatch as of asOf, the index as it stood when the
	// decision settled, before the request could make the pod store
	// anything.
	settled      bool
	asOf         kvindex.StoreMark
	approxChunks []uint64
	// arm is the request's holdback arm (speculative policy): the
	// holdback decides without predictions. predicting says the request
	// records predicted placements (both arms).
	arm        speculative.Arm
	group      uint8 // the conversation's variance group (speculative.Assignment)
	predicting bool
	// failed are the targets the request's earlier attempts failed on.
	failed []targetid.ID
	// by is the decider that made the decision, and makes its retries.
	by *Decider
}

// target is the chosen candidate.
func (d *Decision) target() *Candidate { return &d.cands[d.chosen] }

// Target is the chosen candidate.
func (d *Decision) Target() *Candidate { return d.target() }

// Chosen is the chosen candidate's index in Candidates.
func (d *Decision) Chosen() int { return d.chosen }

// Candidates are the targets considered, as scored; not to be changed.
func (d *Decision) Candidates() []Candidate { return d.cands }

// Model is the model the decision was made for.
func (d *Decision) Model() string { return d.model }

// Reason says why the chosen target won.
func (d *Decision) Reason() string { return d.reason }

// BlockSize is the fleet's block size as the decision knew it (0: block
// keys not configured yet).
func (d *Decision) BlockSize() int { return d.blockSize }

// LookedUpBlocks is how many of the prompt's blocks the decision keyed and
// looked up.
func (d *Decision) LookedUpBlocks() int { return len(d.chain.Keys) }

// Prompt is the prompt as the decision read it (its ids let go).
func (d *Decision) Prompt() Prompt { return d.prompt }

// Settled reports whether reading stopped early because the chosen target
// could no longer be caught up with (readUntilDecided).
func (d *Decision) Settled() bool { return d.settled }

// Predicting says the request records predicted placements and its
// outcome feeds the speculative store (speculative policy, either arm).
func (d *Decision) Predicting() bool { return d.predicting }

// Decide makes a decision. It fails with ErrNoRoutable or a *KeyError.
func (dc *Decider) Decide(in Input) (*Decision, error) {
	d := &Decision{model: in.Model, cands: make([]Candidate, 0, len(in.Targets)), prompt: in.Prompt, by: dc}
	routable := 0
	for _, t := range in.Targets {
		c := dc.candidate(t)
		if c.Routable {
			routable++
		}
		d.cands = append(d.cands, c)
	}
	if routable == 0 {
		return nil, ErrNoRoutable
	}
	ks := dc.plane.Keys()
	if ks != nil {
		d.blockSize = ks.BlockSize
	}
	precise := dc.policy.ReadsPrompt()
	pt := in.Prompt
	d.extras = in.Extras
	if ks != nil && (pt.IDs != nil || (pt.Stream != nil && precise)) {
		var err error
		if pt.Stream != nil {
			d.keyer = ks.Keyer
			err = dc.readUntilDecided(d)
		} else {
			err = ks.Keyer.Extend(&d.chain, pt.IDs, in.Extras)
		}
		if err != nil {
			return nil, &KeyError{err}
		}
	}
	if dc.spec != nil && d.blockSize > 0 {
		d.predicting = true
		dc.assignArm(d, in)
	}
	if dc.ch.approx != nil {
		d.approxChunks = approxChunks(nil, in.ApproxText)
	}
	// A settled decision's last check already looked its keys up.
	dc.readRuns(d, !d.settled)
	ch := dc.ch.choose(d.cands, d.prompt.Count, d.blockSize, in.Peek)
	if ch.idx < 0 {
		return nil, ErrNoRoutable
	}
	d.chosen, d.reason = ch.idx, ch.reason
	if d.settled {
		d.reason = fmt.Sprintf("lowest cost; confirmed run of at least %d blocks, which no other target can catch up with",
			d.cands[d.chosen].ConfirmedBlocks)
	}
	// Keyed: the ids are not the decision's to keep (a request's own are
	// in the parser's pool, reused once the handler returns).
	d.prompt.IDs = nil
	return d, nil
}

// assignArm draws the request's holdback arm (speculative policy): the
// holdback decides without predictions.
func (dc *Decider) assignArm(d *Decision, in Input) {
	d.arm = speculative.ArmSpeculative
	if !in.Peek {
		conv := in.Conversation
		conv.Model, conv.Keys = in.Model, d.chain.Keys
		a := dc.spec.Assign(conv)
		d.arm, d.group = a.Arm, a.Group
	}
}

// readRuns fills d's candidates' runs as the index, the predicted
// placements and the approximate table stand now: the confirmed runs of
// the keys read (lookup false: already filled), in the speculative arm
// each routable candidate's pending predictions beyond them, weighted by
// the target's trust in them, and the approximate policy's matches.
func (dc *Decider) readRuns(d *Decision, lookup bool) {
	if keys := d.chain.Keys; lookup && len(keys) > 0 && dc.policy.ReadsPrompt() {
		var mbuf [16]kvindex.Match
		matchInto(d.cands, dc.plane.Index().Lookup(mbuf[:0], keys))
	}
	if d.predicting && d.arm == speculative.ArmSpeculative {
		for i := range d.cands {
			c := &d.cands[i]
			if !c.Routable || c.excluded || c.Trust == 0 {
				continue
			}
			ext := dc.spec.Lookup(c.Target.ID, d.chain.Keys, c.ConfirmedBlocks)
			if ext.Blocks > 0 {
				c.SpeculativeBlocks, c.PredictionWeight, c.predicted = ext.Blocks, dc.spec.Trust(c.Target.ID), ext.Ref
				c.queuedPredicted = ext.Queued
			}
		}
	}
	if dc.ch.approx != nil {
		dc.ch.approx.match(d.cands, d.approxChunks)
	}
}

// dispatchPrediction is what dispatching a decision predicts: the
// placement on the chosen target with its namespace and keys (what peer
// replicas are told), and the follower when predicted blocks counted in
// the choice.
type dispatchPrediction struct {
	placement *speculative.Placement
	follower  *speculative.Follower
	ns        speculative.Namespace
	keys      []kvindex.Key
}

// place records the blocks chosen candidate c does not hold yet as
// predicted placements on it (the speculative policy reads the whole
// prompt before dispatch), and, when its predicted run counted in the
// choice, the request as a follower of those predictions.
func (dc *Decider) place(d *Decision, c *Candidate, requestID, model string) dispatchPrediction {
	from := min(c.ConfirmedBlocks, len(d.chain.Keys))
	pr := dispatchPrediction{ns: speculative.Namespace{Model: model, LoRA: d.extras.LoRAName, CacheSalt: d.extras.CacheSalt, BlockSize: d.blockSize},
		keys: d.chain.Keys[from:]}
	// The caller settles the placement at the first byte or the end
	// (attempt.answer and attempt.end; VirtualRequest.FirstByte and
	// Finish): a request queued at a busy pod past the TTL has not
	// computed its blocks yet.
	pr.placement = dc.spec.Predict(speculative.Dispatch{Target: c.Target.ID, RequestID: requestID, Namespace: pr.ns, Settles: true}, pr.keys)
	if c.SpeculativeBlocks > 0 && c.PredictionWeight > 0 {
		pr.follower = dc.spec.Follow(c.predicted, requestID)
	}
	return pr
}

// Retry decides again after the chosen target failed before its first
// byte, as both drivers retry: the same prompt, block keys and holdback
// arm, among targets without those the request's attempts failed on, with
// every candidate's confirmed and predicted runs, routability and load
// read as they are now (the failed pod's withdrawn predictions, blocks
// stored meanwhile). targets are those the request may go to: the first
// decision's (Offered) on the HTTP path, whose prompt tail indexes its
// runs by candidate; the fleet in the benchmark's engine. It reports
// false when no other target is routable.
func (d *Decision) Retry(targets []*health.Target) (*Decision, bool) { return d.by.retry(d, targets) }

func (dc *Decider) retry(prev *Decision, targets []*health.Target) (*Decision, bool) {
	return dc.reread(prev, targets, append(slices.Clip(prev.failed), prev.target().Target.ID))
}

// reread decides again for prev's prompt among targets without failed,
// every candidate read as it is now.
func (dc *Decider) reread(prev *Decision, targets []*health.Target, failed []targetid.ID) (*Decision, bool) {
	d := *prev
	d.failed = failed
	d.cands = make([]Candidate, 0, len(targets))
	routable := 0
	for _, t := range targets {
		c := dc.candidate(t)
		c.excluded = slices.Contains(d.failed, t.ID)
		if c.Routable && !c.excluded {
			routable++
		}
		d.cands = append(d.cands, c)
	}
	if routable == 0 {
		return nil, false
	}
	dc.readRuns(&d, true)
	ch := dc.ch.choose(d.cands, d.prompt.Count, d.blockSize, false)
	if ch.idx < 0 {
		return nil, false
	}
	d.chosen, d.reason = ch.idx, ch.reason
	return &d, true
}

// Offered is the targets the decision chose among, in its candidates'
// order, the failed ones included.
func (d *Decision) Offered() []*health.Target {
	out := make([]*health.Target, len(d.cands))
	for i := range d.cands {
		out[i] = d.cands[i].Target
	}
	return out
}

// Attempts is how many targets the request was decided for so far: 1,
// and one more for each retry.
func (d *Decision) Attempts() int { return len(d.failed) + 1 }

// PolicyName is the decider's policy, the label of the metrics of the
// requests it decides.
func (dc *Decider) PolicyName() string { return dc.policyName }

// Spec is the predicted placements the decider reads (nil unless
// speculative).
func (dc *Decider) Spec() *speculative.Store { return dc.spec }

// UsesApprox reports whether the decider hashes the prompt's text (the
// approximate policy): Input.ApproxText is read.
func (dc *Decider) UsesApprox() bool { return dc.ch.approx != nil }

// Forget drops a target removed from the fleet from the approximate
// policy's table.
func (dc *Decider) Forget(id targetid.ID) {
	if dc.ch.approx != nil {
		dc.ch.approx.forget(id)
	}
}

// Turn advances the round-robin position and returns it, for a caller
// that rotates over targets of its own (remote tokenization's pod).
func (dc *Decider) Turn() uint64 { return dc.ch.rr.Add(1) }

// SeedTies makes the draws that break cost ties repeat from seed, for a
// caller deciding on one goroutine (Virtual); the decider is otherwise
// safe for concurrent use and draws from the process's generator.
func (dc *Decider) SeedTies(seed uint64) {
	dc.ch.tie = rand.New(rand.NewPCG(seed, 0x746965 /* "tie" */)).IntN
}

// candidate is target t as a candidate, before any lookup: its confirmed
// run counts as far as its event stream is trusted (eventplane.Trust:
// not at all while its keys are found to disagree with the pod's).
func (dc *Decider) candidate(t *health.Target) Candidate {
	tr := dc.plane.Trust(t.ID)
	return Candidate{Target: t, Routable: t.CanRoute(), Trust: tr.Confirmed, Load: loadOf(t, tr.Verdict)}
}

// HasAlternative reports whether a retry could find another routable
// candidate.
func (d *Decision) HasAlternative() bool {
	for i := range d.cands {
		c := &d.cands[i]
		if i != d.chosen && !c.excluded && c.Target.CanRoute() {
			return true
		}
	}
	return false
}

// readUntilDecided encodes the prompt a segment at a time and keys each new
// block, and stops reading as soon as the rest cannot change the decision:
//   - at the first block no target holds: runs start at block 0, so no
//     later block can lengthen any run;
//   - or once the cheapest candidate is strictly cheapest and no other
//     routable candidate still holds every block so far: more blocks could
//     only lengthen the winner's run and lower its cost.
//
// For a prompt no pod has seen, or one a single pod holds (a conversation
// lives on one pod; others share at most its system prompt), this is the
// difference between encoding a few segments and encoding all of them
// before the request leaves. The rest is encoded after dispatch, by the
// request's Tail.
func (dc *Decider) readUntilDecided(d *Decision) error {
	st := d.prompt.Stream
	ix := dc.plane.Index()
	var reach kvindex.Reach
	// A check that has to look every block so far up again and still
	// cannot settle makes the next wait until the blocks have doubled.
	checkFrom := 0
	// readOn is set once reading looks set to go on: a check looked the
	// blocks up and could not settle, or two checks found several
	// holders (more than a shared system prompt).
	readOn, shared := false, 0
	for !st.Done() {
		if err := st.Step(); err != nil {
			// The pod will judge the prompt; route on what is known.
			slog.Debug("tokenization failed; routing on the blocks so far", "model", d.model, "err", err)
			d.prompt.Stream = nil
			break
		}
		before := len(d.chain.Keys)
		if err := d.keyer.Extend(&d.chain, st.IDs(), d.extras); err != nil {
			return err
		}
		if dc.spec != nil {
			// The speculative policy reads the whole prompt before
			// dispatch, so that its predictions cover every block at
			// once: a sibling arriving while a tail still encoded the
			// rest would see only the first blocks predicted and
			// scatter. The second core encodes the later half.
			st.Prefetch()
			continue
		}
		if n := len(d.chain.Keys); n > before {
			if !ix.Extend(&reach, d.chain.Keys[before:]) {
				break
			}
			if n >= checkFrom && !st.Done() {
				done, looked := dc.settles(d, &reach, st.EstimateCount())
				if done {
					d.settled, d.asOf = true, ix.MarkStores()
					break
				}
				if looked {
					checkFrom, readOn = 2*n, true
				} else if shared++; shared >= 2 {
					readOn = true
				}
			}
			if readOn {
				// The second core encodes the later half meanwhile.
				st.Prefetch()
			}
		}
	}
	switch {
	case d.prompt.Stream == nil:
		st.StopPrefetch()
		d.prompt.Count = st.EstimateCount()
	case st.Done():
		// Finish encodes nothing more here; it records the encode and, in
		// auto mode, starts the sampled comparison.
		if ids, err := st.Finish(); err == nil {
			d.prompt = Prompt{IDs: ids, Counted: true, Count: len(ids), Source: "local"}
		} else {
			d.prompt.Stream = nil
		}
	default:
		st.StopPrefetch()
		d.prompt.Count = st.EstimateCount()
	}
	return nil
}

// settles reports whether the blocks read so far already decide the
// request (see readUntilDecided): the cheapest routable candidate is
// strictly cheapest, and it is the only routable one that may still hold
// the blocks to come. While two routable candidates hold every block so
// far (a system prompt all pods share) it answers at once; otherwise it
// looks the blocks up, fills the candidates' runs so far, and says so in
// looked.
func (dc *Decider) settles(d *Decision, reach *kvindex.Reach, count int) (done, looked bool) {
	ix := dc.plane.Index()
	var hbuf [8]targetid.ID
	holders := ix.Holders(reach, hbuf[:0])
	routableHolders := 0
	for i := range d.cands {
		c := &d.cands[i]
		if c.Routable && !c.excluded && slices.Contains(holders, c.Target.ID) {
			routableHolders++
		}
	}
	if routableHolders > 1 {
		return false, false
	}
	var mbuf [16]kvindex.Match
	matchInto(d.cands, ix.Lookup(mbuf[:0], d.chain.Keys))
	ch := dc.ch.choose(d.cands, count, d.blockSize, true)
	if ch.idx < 0 {
		return false, true
	}
	best := &d.cands[ch.idx]
	for i := range d.cands {
		c := &d.cands[i]
		if i == ch.idx || !c.Routable || c.excluded {
			continue
		}
		if c.Cost <= best.Cost+1e-9 || slices.Contains(holders, c.Target.ID) {
			return false, true
		}
	}
	return true, true
}

// predictedFor is the number of prompt tokens the router expects candidate
// c to serve from its cache, given its confirmed run of blocks and a
// prompt of count tokens: the trusted run, and the predicted blocks
// beyond it while they are trusted at all. Trust weighs the choice (the
// cost); what the pod will compute if the predictions hold is what the
// load ledger books and the outcome is measured against: a follower booked
// at the trust-weighted estimate looked busier than the pod is, and a
// burst's siblings spilled off the holder.
func (d *Decision) predictedFor(c *Candidate, blocks, count int) int {
	if c.Trust == 0 || d.blockSize == 0 {
		return 0
	}
	n := blocks * d.blockSize
	if c.PredictionWeight > 0 {
		n += c.SpeculativeBlocks * d.blockSize
	}
	// vLLM never serves the whole prompt from cache: the last token is
	// always computed, so hits stop at the last full block before it.
	if count > 0 {
		n = min(n, (count-1)/d.blockSize*d.blockSize)
	}
	return max(n, 0)
}

// PromptBlocks is the number of full blocks of pt, or of the keys read
// when the router has no count of its own.
func (d *Decision) PromptBlocks(pt Prompt) int {
	if d.blockSize == 0 || (!pt.Counted && pt.Stream == nil) {
		return len(d.chain.Keys)
	}
	return pt.Count / d.blockSize
}
