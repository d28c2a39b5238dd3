package bpe

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// checkDecode holds decodeFile to the reference decoder on one document:
// both refuse it, or both read the same file. decodeFile alone refuses a
// repeated field, and encoding/json alone nesting past 10,000 levels.
func checkDecode(t *testing.T, data []byte) {
	t.Helper()
	got, err := decodeFile(data)
	want, refErr := referenceDecode(data)
	switch {
	case err != nil && errors.Is(err, errDuplicateField):
	case err == nil && refErr != nil && strings.Contains(refErr.Error(), "exceeded max depth"):
	case (err == nil) != (refErr == nil):
		t.Fatalf("%.300q: decodeFile error %v, encoding/json error %v", data, err, refErr)
	case err == nil && !reflect.DeepEqual(got, want):
		t.Fatalf("%.300q: decodeFile read\n%+v\nencoding/json read\n%+v", data, got, want)
	}
}

func TestDecodeFileMatchesReference(t *testing.T) {
	t.Parallel()
	docs := map[string]string{
		"bytelevel": string(tinyJSON(t, "bytelevel")),
		"metaspace": string(tinyJSON(t, "metaspace")),
	}
	for name, doc := range map[string]string{
		"empty object":              `{}`,
		"null":                      `null`,
		"array":                     `[1]`,
		"string":                    `"model"`,
		"invalid":                   `{"model":`,
		"trailing":                  `{} {}`,
		"control char":              "{\"version\":\"a\x01\"}",
		"model null":                `{"model":null}`,
		"model not an object":       `{"model":[1]}`,
		"keys ignoring case":        `{"MODEL":{"Type":"BPE","VOCAB":{"a":0},"Merges":[]},"Added_Tokens":[{"ID":1,"Content":"x","SPECIAL":true}]}`,
		"key escaped":               `{"mod\u0065l":{"type":"BPE","vocab":{"a":0}}}`,
		"key Kelvin sign":           `{"model":{"type":"BPE","vocab":{},"unk_\u212aen":null}}`,
		"unknown fields":            `{"truncation":{"a":[1,{"b":null}]},"padding":null,"x":"y","model":{"type":"BPE","vocab":{},"extra":[[],{}]}}`,
		"components":                `{"normalizer":{"type":"NFC"} ,"pre_tokenizer": [1, 2] ,"post_processor":"x","decoder":null,"model":{"vocab":{}}}`,
		"version not a string":      `{"version":1,"model":{"type":"BPE","vocab":{}}}`,
		"version null":              `{"version":null,"model":{"type":"BPE","vocab":{}}}`,
		"vocab null":                `{"model":{"type":"BPE","vocab":null}}`,
		"vocab entry null":          `{"model":{"type":"BPE","vocab":{"a":null}}}`,
		"vocab id negative":         `{"model":{"type":"BPE","vocab":{"a":-1}}}`,
		"vocab id fraction":         `{"model":{"type":"BPE","vocab":{"a":1.0}}}`,
		"vocab id exponent":         `{"model":{"type":"BPE","vocab":{"a":1e2}}}`,
		"vocab id too large":        `{"model":{"type":"BPE","vocab":{"a":4294967296}}}`,
		"vocab id largest":          `{"model":{"type":"BPE","vocab":{"a":4294967295}}}`,
		"vocab id string":           `{"model":{"type":"BPE","vocab":{"a":"1"}}}`,
		"vocab repeated token":      `{"model":{"type":"BPE","vocab":{"a":1,"b":2,"a":3}}}`,
		"vocab escapes":             `{"model":{"type":"BPE","vocab":{"\u0120t":1,"\"\\\/\b\f\n\r\t":2,"\ud83d\ude00":3}}}`,
		"vocab lone surrogate":      `{"model":{"type":"BPE","vocab":{"\ud800":1,"x\udc00y":2}}}`,
		"vocab invalid UTF-8":       "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\xff\":1,\"a\xc3\":2,\"\xed\xa0\x80\":3}}}",
		"vocab not an object":       `{"model":{"type":"BPE","vocab":[["a",0]]}}`,
		"merges null":               `{"model":{"vocab":{},"merges":null}}`,
		"merges absent, no type":    `{"model":{"vocab":{}}}`,
		"merges strings":            `{"model":{"type":"BPE","vocab":{},"merges":["a b","\u0120 t"]}}`,
		"merges pairs":              `{"model":{"type":"BPE","vocab":{},"merges":[["a","b"],["a b","c"],[null,"x"]]}}`,
		"merges mixed":              `{"model":{"type":"BPE","vocab":{},"merges":["a b",["c","d"]]}}`,
		"merge of three":            `{"model":{"type":"BPE","vocab":{},"merges":["a b c"]}}`,
		"merge of one":              `{"model":{"type":"BPE","vocab":{},"merges":["ab"]}}`,
		"merge pair of three":       `{"model":{"type":"BPE","vocab":{},"merges":[["a","b","c"]]}}`,
		"merge pair of one":         `{"model":{"type":"BPE","vocab":{},"merges":[["a"]]}}`,
		"merge pair with a number":  `{"model":{"type":"BPE","vocab":{},"merges":[["a",1]]}}`,
		"merge null":                `{"model":{"type":"BPE","vocab":{},"merges":[null]}}`,
		"merge object":              `{"model":{"type":"BPE","vocab":{},"merges":[{}]}}`,
		"merges object":             `{"model":{"type":"BPE","vocab":{},"merges":{}}}`,
		"merges empty":              `{"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		"model options":             `{"model":{"type":"BPE","vocab":{},"unk_token":"<unk>","fuse_unk":true,"byte_fallback":true,"ignore_merges":true,"continuing_subword_prefix":"##","end_of_word_suffix":"</w>","dropout":0.5}}`,
		"model options null":        `{"model":{"type":null,"vocab":{},"unk_token":null,"fuse_unk":null,"byte_fallback":null,"ignore_merges":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"dropout":null}}`,
		"bool not a bool":           `{"model":{"type":"BPE","vocab":{},"fuse_unk":1}}`,
		"dropout out of range":      `{"model":{"type":"BPE","vocab":{},"dropout":1e400}}`,
		"dropout a string":          `{"model":{"type":"BPE","vocab":{},"dropout":"0.1"}}`,
		"unk_token a number":        `{"model":{"type":"BPE","vocab":{},"unk_token":0}}`,
		"unigram":                   `{"model":{"type":"Unigram","unk_id":0,"vocab":[["a",-1.5]]}}`,
		"added tokens":              `{"added_tokens":[{"id":5,"content":"<s>","single_word":true,"lstrip":true,"rstrip":true,"normalized":true,"special":true,"extra":1}],"model":{"vocab":{}}}`,
		"added tokens null":         `{"added_tokens":null,"model":{"vocab":{}}}`,
		"added tokens empty":        `{"added_tokens":[],"model":{"vocab":{}}}`,
		"added token null":          `{"added_tokens":[null],"model":{"vocab":{}}}`,
		"added token fields null":   `{"added_tokens":[{"id":null,"content":null,"special":null}],"model":{"vocab":{}}}`,
		"added token not an object": `{"added_tokens":[1],"model":{"vocab":{}}}`,
		"added token id too large":  `{"added_tokens":[{"id":-5,"content":"x"}],"model":{"vocab":{}}}`,
		"added token content array": `{"added_tokens":[{"id":1,"content":["x"]}],"model":{"vocab":{}}}`,
		"deep":                      `{"x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `,"model":{"vocab":{}}}`,
		"white space":               " \t\r\n{ \"model\" : { \"type\" : \"BPE\" , \"vocab\" : { \"a\" : 0 } , \"merges\" : [ [ \"a\" , \"a\" ] , \"a a\" ] } , \"added_tokens\" : [ { \"id\" : 1 } ] } \n",
	} {
		docs[name] = doc
	}
	for name, doc := range docs {
		t.Run(name, func(t *testing.T) { checkDecode(t, []byte(doc)) })
	}
}

func TestDecodeFileRefusesRepeatedFields(t *testing.T) {
	for _, doc := range []string{
		`{"model":{"type":"BPE","vocab":{}},"model":{"type":"BPE","vocab":{}}}`,
		`{"model":{"type":"BPE","vocab":{}},"Model":null}`,
		`{"model":{"type":"BPE","vocab":{},"vocab":{}}}`,
		`{"model":{"type":"BPE","vocab":{},"merges":[],"MERGES":null}}`,
		`{"added_tokens":[{"id":1,"id":2}],"model":{"type":"BPE","vocab":{}}}`,
		`{"decoder":null,"decoder":null,"model":{"type":"BPE","vocab":{}}}`,
	} {
		if _, err := decodeFile([]byte(doc)); !errors.Is(err, errDuplicateField) {
			t.Errorf("%s: error %v, want a duplicate field", doc, err)
		}
	}
}

// TestParseNamesUnsupportedModel: a model of another type is refused by
// its type, even when its fields do not fit BPE's.
func TestParseNamesUnsupportedModel(t *testing.T) {
	_, err := Parse([]byte(`{"model":{"type":"Unigram","unk_id":0,"vocab":[["<unk>",0],["a",-1.5]]}}`))
	if err == nil || !strings.Contains(err.Error(), `unsupported model type "Unigram"`) {
		t.Fatalf("error %v, want one naming the model type", err)
	}
}
