package bpe

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// tinyJSON builds a small tokenizer.json around a byte-level or a
// Metaspace/byte-fallback BPE, for tests that must not depend on fetched
// files.
func tinyJSON(tb testing.TB, kind string) []byte {
	tb.Helper()
	vocab := map[string]int{}
	var merges []string
	doc := map[string]any{"version": "1.0", "normalizer": nil, "decoder": nil, "post_processor": nil}
	added := []any{
		map[string]any{"id": 1000, "content": "<s>", "special": true, "normalized": false},
		map[string]any{"id": 1001, "content": "<tool>", "special": false, "normalized": true, "lstrip": true, "rstrip": true},
		map[string]any{"id": 1002, "content": "word", "special": false, "normalized": false, "single_word": true},
	}
	switch kind {
	case "bytelevel":
		for b := 0; b < 256; b++ {
			vocab[string(byteToRune[b])] = b
		}
		vocab["he"], vocab["hel"], vocab["Ġw"] = 256, 257, 258
		merges = []string{"h e", "he l", "Ġ w"}
		doc["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}
		doc["decoder"] = map[string]any{"type": "ByteLevel"}
		doc["post_processor"] = map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}},
			"special_tokens": map[string]any{"<s>": map[string]any{"ids": []int{1000}}}}
	case "metaspace":
		for b := 0; b < 256; b++ {
			vocab[fmt.Sprintf("<0x%02X>", b)] = b
		}
		vocab["▁"], vocab["a"], vocab["b"], vocab["▁a"], vocab["<unk>"] = 256, 257, 258, 259, 260
		merges = []string{"▁ a"}
		doc["model_unk"] = "<unk>"
		doc["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "NFKC"}, map[string]any{"type": "Replace", "pattern": map[string]any{"String": "\t"}, "content": " "}}}
		doc["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}
		doc["decoder"] = map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0}}}
	}
	for _, a := range added {
		m := a.(map[string]any)
		vocab[m["content"].(string)] = m["id"].(int)
	}
	model := map[string]any{"type": "BPE", "vocab": vocab, "merges": merges, "byte_fallback": kind == "metaspace"}
	if kind == "metaspace" {
		model["unk_token"] = "<unk>"
		delete(doc, "model_unk")
	}
	doc["model"] = model
	doc["added_tokens"] = added
	raw, err := json.Marshal(doc)
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}

func mustParse(tb testing.TB, raw []byte) *Tokenizer {
	tb.Helper()
	tk, err := Parse(raw)
	if err != nil {
		tb.Fatal(err)
	}
	return tk
}

func TestEncodeTiny(t *testing.T) {
	bl := mustParse(t, tinyJSON(t, "bytelevel"))
	ms := mustParse(t, tinyJSON(t, "metaspace"))
	tests := []struct {
		name string
		tk   *Tokenizer
		text string
		add  bool
		want []uint32
	}{
		{"merges in rank order", bl, "hel", false, []uint32{257}},
		{"post-processor", bl, "he", true, []uint32{1000, 256}},
		{"special split first", bl, "h<s>e", false, []uint32{'h', 1000, 'e'}},
		{"byte-level space", bl, " w", false, []uint32{258}},
		{"lstrip and rstrip eat spaces", bl, "a  <tool>  b", false, []uint32{'a', 1001, 'b'}},
		{"single_word alone", bl, "word", false, []uint32{1002}},
		{"single_word inside a word", bl, "swordy", false, []uint32{'s', 'w', 'o', 'r', 'd', 'y'}},
		{"metaspace first prepends at start", ms, "a", false, []uint32{259}},
		{"metaspace first not after a special", ms, "<s>a", false, []uint32{1000, 257}},
		{"metaspace split on spaces", ms, "a a", false, []uint32{259, 259}},
		{"normalizer Replace", ms, "a\ta", false, []uint32{259, 259}},
		{"byte fallback", ms, "é", false, []uint32{256, 0xC3, 0xA9}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.tk.Encode(tc.text, tc.add)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
			}
		})
	}
}

func TestSplitBehaviors(t *testing.T) {
	// The examples of HF's SplitDelimiterBehavior documentation.
	tests := []struct {
		behavior string
		invert   bool
		want     []string
	}{
		{"Removed", false, []string{"the", "final", "countdown"}},
		{"Isolated", false, []string{"the", "-", "final", "-", "-", "countdown"}},
		{"MergedWithPrevious", false, []string{"the-", "final-", "-", "countdown"}},
		{"MergedWithNext", false, []string{"the", "-final", "-", "-countdown"}},
		{"Contiguous", false, []string{"the", "-", "final", "--", "countdown"}},
		{"Removed", true, []string{"-", "-", "-"}},
	}
	for _, tc := range tests {
		t.Run(tc.behavior, func(t *testing.T) {
			s := "-"
			raw, _ := json.Marshal(map[string]any{"type": "Split", "pattern": map[string]any{"String": s}, "behavior": tc.behavior, "invert": tc.invert})
			p, err := parsePreTokenizer(raw)
			if err != nil {
				t.Fatal(err)
			}
			out, err := p.split([]piece{{s: "the-final--countdown", first: true}})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, o := range out {
				got = append(got, o.s)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDecodeTiny(t *testing.T) {
	bl := mustParse(t, tinyJSON(t, "bytelevel"))
	ms := mustParse(t, tinyJSON(t, "metaspace"))
	for _, tc := range []struct {
		tk   *Tokenizer
		text string
	}{{bl, "hello <s> wörld\n"}, {ms, "a b é"}} {
		ids, err := tc.tk.Encode(tc.text, false)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tc.tk.Decode(ids, false)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.text {
			t.Fatalf("Decode(Encode(%q)) = %q", tc.text, got)
		}
	}
	if got, _ := bl.Decode([]uint32{1000, 'a'}, true); got != "a" {
		t.Fatalf("skip special: %q", got)
	}
	if _, err := bl.Decode([]uint32{5000}, false); err == nil {
		t.Fatal("unknown id decoded")
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(doc map[string]any)
		want   string
	}{
		{"unknown normalizer", func(d map[string]any) { d["normalizer"] = map[string]any{"type": "Precompiled"} }, `"Precompiled"`},
		{"unknown pre-tokenizer", func(d map[string]any) { d["pre_tokenizer"] = map[string]any{"type": "BertPreTokenizer"} }, `"BertPreTokenizer"`},
		{"unknown model", func(d map[string]any) { d["model"].(map[string]any)["type"] = "Unigram" }, `"Unigram"`},
		{"unknown decoder", func(d map[string]any) { d["decoder"] = map[string]any{"type": "CTC"} }, `"CTC"`},
		{"unknown post-processor", func(d map[string]any) { d["post_processor"] = map[string]any{"type": "Mystery"} }, `"Mystery"`},
		{"bad merge", func(d map[string]any) { d["model"].(map[string]any)["merges"] = []string{"h zz"} }, "not in vocab"},
		{"dropout", func(d map[string]any) { d["model"].(map[string]any)["dropout"] = 0.1 }, "dropout"},
		{"bad behavior", func(d map[string]any) {
			d["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"String": "x"}, "behavior": "Sideways"}
		}, `"Sideways"`},
		{"bad regex", func(d map[string]any) {
			d["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(("}, "behavior": "Isolated"}
		}, "compile pattern"},
		{"nested unknown", func(d map[string]any) {
			d["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{map[string]any{"type": "Digits"}}}
		}, `Sequence[0]: unsupported pre_tokenizer type "Digits"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var doc map[string]any
			if err := json.Unmarshal(tinyJSON(t, "bytelevel"), &doc); err != nil {
				t.Fatal(err)
			}
			tc.mutate(doc)
			raw, _ := json.Marshal(doc)
			_, err := Parse(raw)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one naming %s", err, tc.want)
			}
		})
	}
	if _, err := Parse([]byte("[")); err == nil {
		t.Fatal("parsed invalid JSON")
	}
}

// mapCache is a SegmentCache for tests.
type mapCache struct {
	mu sync.Mutex
	m  map[string][]uint32
}

func (c *mapCache) Get(s string, first bool) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[s+map[bool]string{true: "\x00F", false: "\x00-"}[first]]
	return v, ok
}

func (c *mapCache) Set(s string, first bool, ids []uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[s+map[bool]string{true: "\x00F", false: "\x00-"}[first]] = ids
}

// FuzzEncode encodes arbitrary text with the tiny tokenizers: no panic,
// byte-level round trip, and identical ids with a warm segment cache.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"hello world", "<s>a<s>", "a  <tool>  b", "word swordy", "é\t\u3000\u00a0", "\xff\xfe", "<s"} {
		f.Add(s)
	}
	plain := []*Tokenizer{mustParse(f, tinyJSON(f, "bytelevel")), mustParse(f, tinyJSON(f, "metaspace"))}
	cached := []*Tokenizer{mustParse(f, tinyJSON(f, "bytelevel")), mustParse(f, tinyJSON(f, "metaspace"))}
	for _, tk := range cached {
		tk.SetCache(&mapCache{m: map[string][]uint32{}})
	}
	f.Fuzz(func(t *testing.T, text string) {
		for i, tk := range plain {
			want, err := tk.Encode(text, false)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				got, err := cached[i].Encode(text, false)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("tokenizer %d: cached %v, uncached %v for %q", i, got, want, text)
				}
			}
			if i == 0 {
				back, err := tk.Decode(want, false)
				if err != nil {
					t.Fatal(err)
				}
				if valid := strings.ToValidUTF8(text, "\uFFFD"); back != valid && !strings.Contains(valid, "<tool>") && !strings.Contains(valid, "word") {
					t.Fatalf("round trip %q -> %v -> %q", text, want, back)
				}
			}
		}
	})
}

// FuzzParse feeds arbitrary bytes to the tokenizer.json loader: it holds decodeFile to encoding/json and encodes with whatever
// parses.
func FuzzParse(f *testing.F) {
	f.Add(tinyJSON(f, "bytelevel"))
	f.Add(tinyJSON(f, "metaspace"))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"Split","pattern":{"Regex":"\\s+(?!\\S)"},"behavior":"Contiguous","invert":true}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkDecode(t, raw)
		tk, err := Parse(raw)
		if err != nil {
			return
		}
		_, _ = tk.Encode("Hello, world! 123 <s> é", true)
	})
}
