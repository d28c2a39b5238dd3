package bpe

import (
	"slices"
	"testing"
)

// TestStreamPrefixes steps through prompts segment by segment: after every
// step the ids are a prefix of Encode's, they grow, and at the end they are
// all of it — with and without the post-processor's special tokens.
func TestStreamPrefixes(t *testing.T) {
	t.Parallel()
	prompts := []string{chatShapedPrompt(t, 6000), "", "no added tokens at all", "<|im_start|>", "a<|im_end|><|im_end|>b"}
	for _, name := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		tk := parityModel(t, name)
		for _, add := range []bool{false, true} {
			for _, p := range prompts {
				want, err := tk.Encode(p, add)
				if err != nil {
					t.Fatal(err)
				}
				st := tk.NewStream(p, add)
				steps, last := 0, -1
				for !st.Done() {
					if err := st.Step(); err != nil {
						t.Fatal(err)
					}
					steps++
					got := st.IDs()
					if len(got) < last || !slices.Equal(got, want[:len(got)]) {
						t.Fatalf("%s add=%v %.20q step %d: %v is not a growing prefix of %v", name, add, p, steps, got, want)
					}
					last = len(got)
				}
				if !slices.Equal(st.IDs(), want) || st.Consumed() != len(p) {
					t.Fatalf("%s add=%v %.20q: stream ended with %v (consumed %d), want %v", name, add, p, st.IDs(), st.Consumed(), want)
				}
				if _, known := tk.TokenID("<|im_start|>"); known && len(p) > 1000 && steps < 4 {
					t.Fatalf("%s: a chat prompt took %d steps: not streamed", name, steps)
				}
			}
		}
	}
}

func TestPostAffixes(t *testing.T) {
	bos, eos := templatePiece{ids: []uint32{1}}, templatePiece{ids: []uint32{2}}
	seq := templatePiece{seq: true}
	for _, tc := range []struct {
		name     string
		post     postProcessor
		pre, suf []uint32
		ok       bool
	}{
		{"none", noPost{}, nil, nil, true},
		{"bos", &templateProcessing{single: []templatePiece{bos, seq}}, []uint32{1}, nil, true},
		{"bos eos", &templateProcessing{single: []templatePiece{bos, seq, eos}}, []uint32{1}, []uint32{2}, true},
		{"no sequence", &templateProcessing{single: []templatePiece{bos}}, nil, nil, false},
		{"two sequences", &templateProcessing{single: []templatePiece{seq, bos, seq}}, nil, nil, false},
		{"sequence of two", sequencePost{&templateProcessing{single: []templatePiece{bos, seq}}, &templateProcessing{single: []templatePiece{eos, seq, eos}}},
			[]uint32{2, 1}, []uint32{2}, true},
	} {
		pre, suf, ok := tc.post.affixes()
		if ok != tc.ok || (ok && (!slices.Equal(pre, tc.pre) || !slices.Equal(suf, tc.suf))) {
			t.Errorf("%s: affixes %v %v %v, want %v %v %v", tc.name, pre, suf, ok, tc.pre, tc.suf, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		x := []uint32{7, 8}
		if got := tc.post.apply(x); !slices.Equal(got, slices.Concat(pre, x, suf)) {
			t.Errorf("%s: apply %v, affixes say %v", tc.name, got, slices.Concat(pre, x, suf))
		}
	}
}

// TestStreamPrefetch: a stream whose later half another goroutine encodes
// gives the same ids, whether the caller reads on at once or stops and
// finishes later, and whether or not the goroutine is told to stop part
// way (StopPrefetch).
func TestStreamPrefetch(t *testing.T) {
	t.Parallel()
	tk := parityModel(t, "qwen3")
	p := chatShapedPrompt(t, 6000)
	want, err := tk.Encode(p, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		stepsFirst int
		stop       bool
	}{{0, false}, {1, false}, {3, false}, {1000, false}, {0, true}, {1, true}, {3, true}} {
		stepsFirst := c.stepsFirst
		st := tk.NewStream(p, true)
		for i := 0; i < stepsFirst && !st.Done(); i++ {
			if err := st.Step(); err != nil {
				t.Fatal(err)
			}
		}
		st.Prefetch(4)
		if (st.ahead != nil) != !st.Done() {
			t.Fatalf("after %d steps first: prefetching %v with the stream done %v", stepsFirst, st.ahead != nil, st.Done())
		}
		if c.stop {
			st.StopPrefetch()
		}
		for !st.Done() {
			if err := st.Step(); err != nil {
				t.Fatal(err)
			}
			if got := st.IDs(); !slices.Equal(got, want[:len(got)]) {
				t.Fatalf("after %d steps first: not a prefix", stepsFirst)
			}
			if n := len(st.IDs()); !st.Done() && !slices.Equal(mustEncode(t, tk, p[:st.Consumed()]), want[:n]) {
				t.Fatalf("after %d steps first: %d ids do not encode the %d bytes consumed", stepsFirst, n, st.Consumed())
			}
		}
		if !slices.Equal(st.IDs(), want) || st.Consumed() != len(p) {
			t.Fatalf("after %d steps first: %d ids, want %d", stepsFirst, len(st.IDs()), len(want))
		}
	}
}

// mustEncode is the ids of text with the post-processor's prefix (and no
// suffix: the texts here end before the stream does).
func mustEncode(t *testing.T, tk *Tokenizer, text string) []uint32 {
	t.Helper()
	ids, err := tk.Encode(text, true)
	if err != nil {
		t.Fatal(err)
	}
	if tk.post == nil {
		return ids
	}
	_, suf, _ := tk.post.affixes()
	return ids[:len(ids)-len(suf)]
}
