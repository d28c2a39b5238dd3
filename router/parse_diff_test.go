package router

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// sameParse reports how ParseRequest and the reference parser disagree on
// body, or "" when they agree: same acceptance, same parameter and message
// in errors (invalid-JSON details aside: they name the first fault each
// parser met), same Request on success.
func sameParse(ep Endpoint, body []byte, reuse *Request) string {
	var want Request
	werr := refParseRequest(ep, body, &want)
	got := reuse
	gerr := ParseRequest(ep, body, got)
	if (werr == nil) != (gerr == nil) {
		return "acceptance differs: reference " + errString(werr) + ", new " + errString(gerr)
	}
	if werr != nil {
		var wb, gb *BadRequest
		if !errors.As(werr, &wb) || !errors.As(gerr, &gb) {
			return "non-client error: reference " + errString(werr) + ", new " + errString(gerr)
		}
		const invalid = "request body is not valid JSON"
		if strings.HasPrefix(wb.Message, invalid) != strings.HasPrefix(gb.Message, invalid) {
			return "error kind differs: reference " + errString(werr) + ", new " + errString(gerr)
		}
		if wb.Param != gb.Param || (!strings.HasPrefix(wb.Message, invalid) && wb.Message != gb.Message) {
			return "error differs: reference " + errString(werr) + ", new " + errString(gerr)
		}
		return ""
	}
	g := *got
	if len(g.PromptIDs) == 0 {
		g.PromptIDs = nil
	}
	if len(want.PromptIDs) == 0 {
		want.PromptIDs = nil
	}
	if !reflect.DeepEqual(g, want) {
		return "requests differ"
	}
	return ""
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

var diffSeeds = []string{
	`{"model":"m","prompt":"hello"}`,
	`{"model":"m","prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true}}`,
	`{"model":"m","prompt":[[1],[2]]}`, `{"model":"m","prompt":[[1.0,2e0],[2,-0]]}`,
	`{"model":"m","prompt":[1.0,2e0,3]}`, `{"model":"m","prompt":[-0,1]}`, `{"model":"m","prompt":[1,-1]}`,
	`{"model":"m","prompt":["a","b"],"cache_salt":"x"}`, `{"model":"m","prompt":["a\n",""]}`,
	`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[],"chat_template_kwargs":{}}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"continue_final_message":true,"add_generation_prompt":false}`,
	`{"model":"m","messages":[{"role":"user","content":1},{"role":2}],"add_generation_prompt":true,"continue_final_message":true}`,
	`{"model":"m","messages":[{"role":"user","content":"x","role":null}]}`, `{"model":"m","messages":[1,{}]}`,
	`{"model":"m","messages":[{"\u0072ole":"user","cont\u0065nt":{}}]}`, `{"model":"m","messages":{}, "messages":[{"role":"a"}]}`,
	`{"model":"m","messages":[{"role":"user"}],"tools":{},"chat_template":"x"}`,
	`{"model":1}`, `[]`, `{`, `{"model":"m","prompt":[1e99]}`, `{"model":"m","prompt":[ 01, 2 ]}`,
	`{"model":"m","prompt":[4294967295,0],"prompt":[1]}`, `{"prompt":[1 ,2],"model":"m"}`, `{"prompt":[1,2],"model":"m","prompt":"x"}`,
	`{"model":"m","prompt":"\u00e9\n\"x\"","n":-0.5e+3,"b":[true,false,null]}`, "{\"model\":\"m\",\"prompt\":\"a\u0001\"}",
	`{"m\u006fdel":"\ud83d","prompt":"\udc00x","stream":nul}`, `{"model":"m","prompt":"x","stream_options":{"include_usage":true,"include_usage":null}}`,
	`{"model":"m","prompt":"x"} x`, ` {"model":"m","prompt":"x"} `, `{"model":"m","prompt":[1,]}`, `{"model":"m","prompt":[1 2]}`,
	`{"model":"m","prompt":"x","a":NaN}`, `{"model":"m","prompt":"x","a":truex}`, `{"model":"m","prompt":"x","a":1.}`,
	`{"model":"m","prompt":[[1],[2,"a"]]}`, `{"model":"m","prompt":[[1],3]}`, `{"model":"m","prompt":[{}]}`, `{"model":"m","prompt":[[]]}`,
	`{"model":"m","prompt":"x","add_special_tokens":false,"cache_salt":5}`,
	`{"model":"m","prompt":"x","x":` + strings.Repeat("[", 298) + "1" + strings.Repeat("]", 298) + "}",
	`{"model":"m","prompt":"x","x":` + strings.Repeat("[", 299) + "1" + strings.Repeat("]", 299) + "}",
	`{"model":"m","prompt":"x","x":` + strings.Repeat("[", 299) + strings.Repeat("]", 299) + "}",
	`{"model":"m","prompt":"x","x":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + "}",
	`{"model":"m","messages":[{"role":"u","c":` + strings.Repeat("[", 296) + "1" + strings.Repeat("]", 296) + "}]}",
	`{"model":"m","messages":[{"role":"u","c":` + strings.Repeat("[", 297) + "1" + strings.Repeat("]", 297) + "}]}",
}

func TestParseAgainstReference(t *testing.T) {
	for _, s := range diffSeeds {
		for _, ep := range []Endpoint{EndpointCompletions, EndpointChat} {
			if d := sameParse(ep, []byte(s), new(Request)); d != "" {
				t.Errorf("%.120q (%v): %s", s, ep, d)
			}
		}
	}
}

// FuzzParseAgainstReference: the single-pass parser accepts and refuses
// exactly what the fastjson-based one did, with the same errors and the
// same routing fields, including on a pooled Request that held ids before.
func FuzzParseAgainstReference(f *testing.F) {
	for _, s := range diffSeeds {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		ep := EndpointCompletions
		if chat {
			ep = EndpointChat
		}
		r := acquireRequest()
		defer releaseRequest(r)
		if err := ParseRequest(EndpointCompletions, []byte(`{"model":"m","prompt":[7,8,9,10]}`), r); err != nil {
			t.Fatal(err)
		}
		if d := sameParse(ep, body, r); d != "" {
			t.Fatalf("%q (%v): %s", body, ep, d)
		}
	})
}
