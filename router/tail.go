package router

import (
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
)

// promptTail encodes the rest of a prompt its decision stopped reading,
// after the request has left, while the pod works: the exact token count
// for the load ledger and the outcome metrics, the segment cache warm for
// the conversation's next turn, auto mode's sampled comparison and, for a
// settled decision, every candidate's whole run. It owns its goroutine,
// which runs once; what it learns is read through decision.view.
//
// Until the first byte, the attempt in progress lets the tail hold its
// flight: dispatched with what the decision read, the flight is corrected
// as soon as the whole prompt is known, so that other requests see the
// pod's true queue.
type promptTail struct {
	d    *decision
	done chan struct{}
	// Written once by the tail's goroutine before done is closed.
	whole promptTokens // the whole prompt; ids nil when encoding failed
	runs  []int        // settled decisions: every candidate's whole run

	mu       sync.Mutex
	held     *health.Flight
	heldCand int
}

// startTail starts encoding the rest of d's prompt, counted in tails; nil
// when the decision read the whole prompt.
func startTail(d *decision, ix *kvindex.Index, tails *sync.WaitGroup) *promptTail {
	t := newTail(d)
	t.start(ix, tails)
	return t
}

// newTail is the tail of d's prompt, not started; nil when the decision
// read the whole prompt.
func newTail(d *decision) *promptTail {
	if d.prompt.stream == nil {
		return nil
	}
	return &promptTail{d: d, done: make(chan struct{})}
}

// start runs the tail's goroutine, counted in tails.
func (t *promptTail) start(ix *kvindex.Index, tails *sync.WaitGroup) {
	if t == nil {
		return
	}
	tails.Add(1)
	go func() {
		defer tails.Done()
		t.encode(ix)
		close(t.done)
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.held != nil {
			t.correct(t.held, t.heldCand)
		}
	}()
}

// encode finishes the prompt and, for a settled decision, looks every
// candidate's whole run up as of the decision's mark.
func (t *promptTail) encode(ix *kvindex.Index) {
	d := t.d
	st := d.prompt.stream
	for !st.Done() {
		if err := st.Step(); err != nil {
			slog.Debug("tokenization failed after dispatch", "model", d.model, "err", err)
			return
		}
		// Requests in flight come first. A goroutine that only yields is
		// run again before the scheduler polls the network, so other
		// requests' bytes would wait for the whole tail; sleeping lets
		// the poller in. In a quiet process each sleep may last up to a
		// millisecond, which is why a settled decision's lookup is as of
		// its mark: by then the pod may have reported this very
		// request's blocks.
		time.Sleep(time.Microsecond)
	}
	ids, err := st.Finish()
	if err != nil {
		slog.Debug("tokenization failed after dispatch", "model", d.model, "err", err)
		return
	}
	t.whole = promptTokens{ids: ids, counted: true, count: len(ids), source: "local"}
	if !d.settled {
		return
	}
	// The decision's chain is shared with the request; extend a copy.
	chain := d.chain
	chain.Keys = slices.Clone(chain.Keys)
	if err := d.keyer.Extend(&chain, ids, d.extras); err != nil {
		return
	}
	runs := make([]int, len(d.cands))
	var mbuf [16]kvindex.Match
	for _, m := range ix.LookupAsOf(mbuf[:0], chain.Keys, d.asOf) {
		if i := candidateOf(d.cands, m.Target); i >= 0 {
			runs[i] = m.Blocks
			if m.Lost {
				// The run may count this request's own blocks; the run
				// read before dispatch is certain.
				runs[i] = d.cands[i].ConfirmedBlocks
			}
		}
	}
	t.runs = runs
}

// finished reports whether the tail has run to its end. A nil tail (the
// decision read the whole prompt) has.
func (t *promptTail) finished() bool {
	if t == nil {
		return true
	}
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// wait blocks until the tail has run to its end.
func (t *promptTail) wait() {
	if t != nil {
		<-t.done
	}
}

// hold gives the tail the flight of candidate i's attempt until its first
// byte (release); a tail already done corrects it at once.
func (t *promptTail) hold(f *health.Flight, i int) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.finished() {
		t.correct(f, i)
		return
	}
	t.held, t.heldCand = f, i
}

// release takes the flight back: the attempt got its first byte or ended.
// The flight is the attempt's alone afterwards.
func (t *promptTail) release() {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.held = nil
	t.mu.Unlock()
}

// correct revises candidate i's flight to the whole prompt once known.
func (t *promptTail) correct(f *health.Flight, i int) {
	if v := t.d.view(t, i); v.final {
		f.Revise(v.prompt.count, v.prompt.count-v.predicted)
	}
}

// promptView is the prompt and one candidate's cache as known at one
// moment: from the decision, or from the whole prompt once the tail is
// done.
type promptView struct {
	prompt promptTokens
	// final: nothing more will be learned (no tail, or the tail is done).
	final bool
	// confirmed is the candidate's confirmed run; predicted is the prompt
	// tokens the router expects it to serve from its cache.
	confirmed int
	predicted int
}

// view is candidate i's promptView now, without waiting for the tail.
func (d *decision) view(t *promptTail, i int) promptView {
	c := &d.cands[i]
	v := promptView{prompt: d.prompt, final: t.finished(), confirmed: c.ConfirmedBlocks}
	if t != nil && v.final && t.whole.counted {
		v.prompt = t.whole
		if t.runs != nil {
			v.confirmed = t.runs[i]
		}
	}
	v.predicted = d.predictedFor(c, v.confirmed, v.prompt.count)
	return v
}
