package brain

import (
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
)

// Tail encodes the rest of a prompt its Decision stopped reading,
// after the request has left, while the pod works: the exact token count
// for the load ledger and the outcome metrics, the segment cache warm for
// the conversation's next turn, auto mode's sampled comparison and, for a
// settled Decision, every candidate's whole run. It owns its goroutine,
// which runs once; what it learns is read through Decision.View.
//
// Until the first byte, the attempt in progress lets the tail hold its
// flight: dispatched with what the decision read, the flight is corrected
// as soon as the whole prompt is known, so that other requests see the
// pod's true queue.
type Tail struct {
	d    *Decision
	done chan struct{}
	// Written once by the tail's goroutine before done is closed.
	whole Prompt // the whole prompt; ids nil when encoding failed
	runs  []int  // settled decisions: every candidate's whole run

	mu       sync.Mutex
	held     *health.Flight
	heldCand int
}

// StartTail starts encoding the rest of d's prompt, counted in tails; nil
// when the decision read the whole prompt.
func StartTail(d *Decision, ix *kvindex.Index, tails *sync.WaitGroup) *Tail {
	t := NewTail(d)
	t.Start(ix, tails)
	return t
}

// NewTail is the tail of d's prompt, not started; nil when the decision
// read the whole prompt.
func NewTail(d *Decision) *Tail {
	if d.prompt.Stream == nil {
		return nil
	}
	return &Tail{d: d, done: make(chan struct{})}
}

// Start runs the tail's goroutine, counted in tails.
func (t *Tail) Start(ix *kvindex.Index, tails *sync.WaitGroup) {
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

// encode finishes the prompt and, for a settled Decision, looks every
// candidate's whole run up as of the decision's mark.
func (t *Tail) encode(ix *kvindex.Index) {
	d := t.d
	st := d.prompt.Stream
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
	t.whole = Prompt{IDs: ids, Counted: true, Count: len(ids), Source: "local"}
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

// Finished reports whether the tail has run to its end. A nil tail (the
// Decision read the whole prompt) has.
func (t *Tail) Finished() bool {
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

// Wait blocks until the tail has run to its end.
func (t *Tail) Wait() {
	if t != nil {
		<-t.done
	}
}

// hold gives the tail the flight of candidate i's attempt until its first
// byte (release); a tail already done corrects it at once.
func (t *Tail) hold(f *health.Flight, i int) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.Finished() {
		t.correct(f, i)
		return
	}
	t.held, t.heldCand = f, i
}

// release takes the flight back: the attempt got its first byte or ended.
// The flight is the attempt's alone afterwards.
func (t *Tail) release() {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.held = nil
	t.mu.Unlock()
}

// correct revises candidate i's flight to the whole prompt once known.
func (t *Tail) correct(f *health.Flight, i int) {
	if v := t.d.view(t, i); v.Final {
		f.Revise(v.Prompt.Count, v.Prompt.Count-v.Predicted)
	}
}

// View is the prompt and one candidate's cache as known at one
// moment: from the decision, or from the whole prompt once the tail is
// done.
type View struct {
	Prompt Prompt
	// Final: nothing more will be learned (no tail, or the tail is done).
	Final bool
	// Confirmed is the candidate's confirmed run; Predicted is the prompt
	// tokens the router expects it to serve from its cache.
	Confirmed int
	Predicted int
}

// View is candidate i's View now, without waiting for the tail t (nil:
// none).
func (d *Decision) View(t *Tail, i int) View { return d.view(t, i) }

// view is candidate i's View now, without waiting for the tail.
func (d *Decision) view(t *Tail, i int) View {
	c := &d.cands[i]
	v := View{Prompt: d.prompt, Final: t.Finished(), Confirmed: c.ConfirmedBlocks}
	if t != nil && v.Final && t.whole.Counted {
		v.Prompt = t.whole
		if t.runs != nil {
			v.Confirmed = t.runs[i]
		}
	}
	v.Predicted = d.predictedFor(c, v.Confirmed, v.Prompt.Count)
	return v
}
