package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// TraceBlockTokens is the tokens of one Mooncake hash id.
const TraceBlockTokens = 512

// TraceRecord is one line of a Mooncake FAST'25 trace.
type TraceRecord struct {
	// Timestamp is the arrival in milliseconds from the trace's start.
	Timestamp    int64 `json:"timestamp"`
	InputLength  int   `json:"input_length"`
	OutputLength int   `json:"output_length"`
	// HashIDs name the prompt's 512-token blocks: equal ids at equal
	// positions are equal blocks, and everything before them too.
	HashIDs []int64 `json:"hash_ids"`
}

// ReadTrace reads a JSON-lines trace, checking every line: its timestamp
// is not before the previous one's, its lengths are positive and it has
// ceil(input_length / 512) hash ids.
func ReadTrace(r io.Reader) ([]TraceRecord, error) {
	var out []TraceRecord
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	line := 0
	for sc.Scan() {
		line++
		raw := sc.Bytes()
		if len(raw) == 0 {
			continue
		}
		var rec TraceRecord
		if err := json.Unmarshal(raw, &rec); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		switch {
		case rec.Timestamp < 0 || (len(out) > 0 && rec.Timestamp < out[len(out)-1].Timestamp):
			return nil, fmt.Errorf("line %d: timestamp %d before the previous line's", line, rec.Timestamp)
		case rec.InputLength < 1 || rec.OutputLength < 1:
			return nil, fmt.Errorf("line %d: input_length and output_length must be positive", line)
		case len(rec.HashIDs) != (rec.InputLength+TraceBlockTokens-1)/TraceBlockTokens:
			return nil, fmt.Errorf("line %d: %d hash_ids for input_length %d (want one per %d-token block)",
				line, len(rec.HashIDs), rec.InputLength, TraceBlockTokens)
		}
		for _, id := range rec.HashIDs {
			if id < 0 {
				return nil, fmt.Errorf("line %d: negative hash id %d", line, id)
			}
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no requests")
	}
	return out, nil
}

// contextMargin is room for the tokens a server adds to a prompt (a BOS).
const contextMargin = 16

// Trace replays a Mooncake trace: each record arrives at its timestamp
// divided by Speedup, its prompt the text blocks of its hash ids (the last
// one cut to the input length), its output OutputLength tokens.
type Trace struct {
	Common
	Path    string
	Speedup float64
	// MaxRequests keeps the first requests only (0: all).
	MaxRequests int
	// MaxContext cuts prompts so that prompt and output fit in that many
	// tokens, less a margin of contextMargin for the tokens a server adds
	// (0: no limit): a trace prompt beyond the fleet's context would only
	// measure an error.
	MaxContext int
	// MaxOutputTokens cuts longer outputs (0: no limit).
	MaxOutputTokens int
}

// Generate reads the trace and makes the workload.
func (p Trace) Generate() (*Workload, error) {
	if !(p.Speedup > 0) {
		return nil, fmt.Errorf("trace: the speed-up must be positive")
	}
	f, err := os.Open(p.Path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	recs, err := ReadTrace(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", p.Path, err)
	}
	return p.fromRecords(recs), nil
}

func (p Trace) fromRecords(recs []TraceRecord) *Workload {
	if p.MaxRequests > 0 && len(recs) > p.MaxRequests {
		recs = recs[:p.MaxRequests]
	}
	tx := p.texter()
	blocks := map[int64]string{}
	block := func(id int64) string {
		b, ok := blocks[id]
		if !ok {
			b = tx.text(kindTraceBlock, uint64(id), TraceBlockTokens)
			blocks[id] = b
		}
		return b
	}
	w := &Workload{Name: "trace", Params: map[string]any{
		"path": p.Path, "speedup": p.Speedup, "requests": len(recs), "max_context": p.MaxContext,
		"max_output_tokens": p.MaxOutputTokens, "seed": p.Seed, "vocab": string(p.Vocab),
	}}
	cutIn, cutOut := 0, 0
	for _, r := range recs {
		out := r.OutputLength
		if p.MaxOutputTokens > 0 && out > p.MaxOutputTokens {
			out = p.MaxOutputTokens
			cutOut++
		}
		n := r.InputLength
		if limit := p.MaxContext - out - contextMargin; p.MaxContext > 0 && n > limit {
			n = max(1, limit)
			cutIn++
		}
		parts := make([]string, 0, (n+TraceBlockTokens-1)/TraceBlockTokens)
		for i, id := range r.HashIDs {
			left := n - i*TraceBlockTokens
			if left <= 0 {
				break
			}
			b := block(id)
			if left < TraceBlockTokens {
				b = b[:p.cut(b, left)]
			}
			parts = append(parts, b)
		}
		at := time.Duration(float64(r.Timestamp) * float64(time.Millisecond) / p.Speedup)
		w.Sessions = append(w.Sessions, Session{Start: at, Group: int(r.HashIDs[0]), Turns: []Turn{{
			Parts: parts, MaxTokens: out, Stage: -1,
		}}})
	}
	if cutIn > 0 {
		w.Notes = append(w.Notes, fmt.Sprintf("%d of %d prompts cut to fit the fleet's context of %d tokens with their output", cutIn, len(recs), p.MaxContext))
	}
	if cutOut > 0 {
		w.Notes = append(w.Notes, fmt.Sprintf("%d of %d outputs cut to %d tokens", cutOut, len(recs), p.MaxOutputTokens))
	}
	return w
}

// cut is the byte length of the first n tokens of a block's text.
func (p Trace) cut(block string, n int) int {
	if p.Vocab != Words {
		return n
	}
	words := 0
	for i := 0; i < len(block); i++ {
		if block[i] == ' ' {
			if words == n {
				return i
			}
			words++
		}
	}
	return len(block)
}
