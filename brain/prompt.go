package brain

import "github.com/prefixrouter/prefixrouter/tokenize"

// Prompt is a request's prompt as the router knows it.
type Prompt struct {
	// IDs are the prompt's token ids as the pod computes them; nil when
	// unknown (no tokenizer, or a load-only policy that does not need them)
	// or not all encoded yet (Stream). A decision lets go of them once it
	// has keyed them (they may be the pooled request's): Counted says
	// what they were.
	IDs []uint32
	// Counted says Count is the router's own count of the prompt's ids,
	// not an estimate.
	Counted bool
	// Count is len(IDs), or an estimate when not counted.
	Count  int
	Source string // ids, local, remote, estimate
	// Stream is the local encoding when the router tokenizes in process:
	// the decision reads it only as far as it needs, and the rest is
	// encoded after dispatch (Tail).
	Stream *tokenize.Stream
}

// IDsPrompt is a prompt of token ids the caller gives.
func IDsPrompt(ids []uint32) Prompt {
	return Prompt{IDs: ids, Counted: true, Count: len(ids), Source: "ids"}
}

// Estimate is the prompt's token count as known before reading it.
func (pt Prompt) Estimate() int {
	if !pt.Counted && pt.Stream != nil {
		return pt.Stream.EstimateCount()
	}
	return pt.Count
}
