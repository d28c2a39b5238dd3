package router

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// decider is the routing brain: from a request's prompt, the targets the
// health snapshot offers for its model and the placement index, to a
// decision. It knows nothing of HTTP: the API handler, the dry run and the
// benchmark's engines all decide through it.
type decider struct {
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
}

func newDecider(p Policy, cost CostConfig, plane *eventplane.Plane, spec *speculative.Store) *decider {
	return &decider{policy: p, policyName: p.String(), ch: newChooser(p, cost), plane: plane, spec: spec}
}

// decisionInput is everything one decision reads.
type decisionInput struct {
	model string
	// targets serve the model (health.Snapshot.ForModel), routable or not.
	targets []*health.Target
	// prompt is the request's prompt: ids, a local stream the decision
	// reads only as far as it needs, or an estimated count.
	prompt promptTokens
	extras kvindex.RequestExtras
	// approxText is what the approximate policy hashes (its policy only).
	approxText []byte
	// peek leaves policy state untouched (the dry run): round-robin does
	// not advance, and no holdback arm is drawn.
	peek bool
	// conversation names the request's conversation for its holdback arm
	// (speculative policy): the client's session and user, the request id.
	conversation speculative.Conversation
}

// errNoRoutable: no candidate can take the request.
var errNoRoutable = errors.New("no routable target")

// keyError is a prompt whose block keys cannot be computed.
type keyError struct{ err error }

func (e *keyError) Error() string { return "cannot compute block keys: " + e.err.Error() }
func (e *keyError) Unwrap() error { return e.err }

// decision is what was chosen for a request, from which candidates and
// why. It is not changed once made: a retry makes another (decider.without),
// and what is learned after dispatch (the rest of the prompt) belongs to
// the request's promptTail.
type decision struct {
	model  string
	cands  []Candidate
	chosen int // index into cands
	reason string
	// prompt is the prompt as the decision read it. When the decision
	// stopped reading early, count is an estimate and stream holds the
	// rest, which only the prompt tail reads.
	prompt    promptTokens
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
	// by is the decider that made the decision, and makes its retries.
	by *decider
	// stage is the part of the request the decision serves (disagg.go).
	stage stage
	// decode is a split request's decode stage (stagePrefill): this
	// decision's target computes the prefill, decode's the rest. nil
	// when the chosen target serves the whole request.
	decode *decision
}

// target is the chosen candidate.
func (d *decision) target() *Candidate { return &d.cands[d.chosen] }

// decide makes a decision. It fails with errNoRoutable or a *keyError.
func (dc *decider) decide(in decisionInput) (*decision, error) {
	d := &decision{model: in.model, cands: make([]Candidate, 0, len(in.targets)), prompt: in.prompt, by: dc}
	routable := 0
	for _, t := range in.targets {
		c := dc.candidate(t)
		if c.Routable {
			routable++
		}
		d.cands = append(d.cands, c)
	}
	if routable == 0 {
		return nil, errNoRoutable
	}
	ks := dc.plane.Keys()
	if ks != nil {
		d.blockSize = ks.BlockSize
	}
	precise := dc.policy.readsPrompt()
	pt := in.prompt
	d.extras = in.extras
	if ks != nil && (pt.ids != nil || (pt.stream != nil && precise)) {
		var err error
		if pt.stream != nil {
			d.keyer = ks.Keyer
			err = dc.readUntilDecided(d)
		} else {
			err = ks.Keyer.Extend(&d.chain, pt.ids, in.extras)
		}
		if err != nil {
			return nil, &keyError{err}
		}
		// A settled decision's last check already looked these keys up.
		if keys := d.chain.Keys; len(keys) > 0 && precise && !d.settled {
			var mbuf [16]kvindex.Match
			matchInto(d.cands, dc.plane.Index().Lookup(mbuf[:0], keys))
		}
	}
	if dc.spec != nil && d.blockSize > 0 {
		d.predicting = true
		dc.predict(d, in)
	}
	if dc.ch.approx != nil {
		d.approxChunks = approxChunks(nil, in.approxText)
		dc.ch.approx.match(d.cands, d.approxChunks)
	}
	ch := dc.ch.choose(d.cands, d.prompt.count, d.blockSize, in.peek)
	if ch.idx < 0 {
		return nil, errNoRoutable
	}
	d.chosen, d.reason = ch.idx, ch.reason
	if d.settled {
		d.reason = fmt.Sprintf("lowest cost; confirmed run of at least %d blocks, which no other target can catch up with",
			d.cands[d.chosen].ConfirmedBlocks)
	}
	// Keyed: the ids are not the decision's to keep (a request's own are
	// in the parser's pool, reused once the handler returns).
	d.prompt.ids = nil
	return d, nil
}

// predict draws the request's holdback arm and, in the speculative arm,
// extends each routable candidate's confirmed run with its pending
// predictions, weighted by the target's trust in them.
func (dc *decider) predict(d *decision, in decisionInput) {
	d.arm = speculative.ArmSpeculative
	if !in.peek {
		conv := in.conversation
		conv.Model, conv.Keys = in.model, d.chain.Keys
		a := dc.spec.Assign(conv)
		d.arm, d.group = a.Arm, a.Group
	}
	if d.arm != speculative.ArmSpeculative {
		return
	}
	for i := range d.cands {
		c := &d.cands[i]
		if !c.Routable || c.Trust == 0 {
			continue
		}
		ext := dc.spec.Lookup(c.Target.ID, d.chain.Keys, c.ConfirmedBlocks)
		if ext.Blocks > 0 {
			c.SpeculativeBlocks, c.PredictionWeight, c.predicted = ext.Blocks, dc.spec.Trust(c.Target.ID), ext.Ref
			c.queuedPredicted = ext.Queued
		}
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
func (dc *decider) place(d *decision, c *Candidate, requestID, model string) dispatchPrediction {
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

// without decides again after the chosen target failed before its first
// byte: the same prompt and runs, without that target, on the others'
// routability and load as they are now.
func (dc *decider) without(prev *decision) (*decision, bool) {
	d := *prev
	d.cands = slices.Clone(prev.cands)
	d.cands[prev.chosen].excluded = true
	for i := range d.cands {
		c := &d.cands[i]
		if !c.excluded {
			c.Routable = c.Target.CanRoute()
			c.Load = loadOf(c.Target, eventplane.Verdict(c.Load.Events))
		}
	}
	ch := dc.ch.choose(d.cands, d.prompt.count, d.blockSize, false)
	if ch.idx < 0 {
		return nil, false
	}
	d.chosen, d.reason = ch.idx, ch.reason
	return &d, true
}

// candidate is target t as a candidate, before any lookup: its confirmed
// run counts as far as its event stream is trusted (eventplane.Trust:
// not at all while its keys are found to disagree with the pod's).
func (dc *decider) candidate(t *health.Target) Candidate {
	tr := dc.plane.Trust(t.ID)
	return Candidate{Target: t, Routable: t.CanRoute(), Trust: tr.Confirmed, Load: loadOf(t, tr.Verdict)}
}

// hasAlternative reports whether a retry could find another routable
// candidate.
func (d *decision) hasAlternative() bool {
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
// request's promptTail.
func (dc *decider) readUntilDecided(d *decision) error {
	st := d.prompt.stream
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
			d.prompt.stream = nil
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
	case d.prompt.stream == nil:
		st.StopPrefetch()
		d.prompt.count = st.EstimateCount()
	case st.Done():
		// Finish encodes nothing more here; it records the encode and, in
		// auto mode, starts the sampled comparison.
		if ids, err := st.Finish(); err == nil {
			d.prompt = promptTokens{ids: ids, counted: true, count: len(ids), source: "local"}
		} else {
			d.prompt.stream = nil
		}
	default:
		st.StopPrefetch()
		d.prompt.count = st.EstimateCount()
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
func (dc *decider) settles(d *decision, reach *kvindex.Reach, count int) (done, looked bool) {
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
func (d *decision) predictedFor(c *Candidate, blocks, count int) int {
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

// promptBlocks is the number of full blocks of pt, or of the keys read
// when the router has no count of its own.
func (d *decision) promptBlocks(pt promptTokens) int {
	if d.blockSize == 0 || (!pt.counted && pt.stream == nil) {
		return len(d.chain.Keys)
	}
	return pt.count / d.blockSize
}
