package tokenize

import (
	"encoding/json"
	"slices"
	"testing"
)

func TestBytesEncodeDecode(t *testing.T) {
	tests := []struct {
		name string
		text string
		add  bool
		want []uint32
	}{
		{"ascii", "hi", false, []uint32{'h', 'i'}},
		{"bos", "hi", true, []uint32{BytesBOS, 'h', 'i'}},
		{"utf8", "é", false, []uint32{0xC3, 0xA9}},
		{"special", "<|im_start|>a<|im_end|>", false, []uint32{BytesIMStart, 'a', BytesIMEnd}},
		{"not special", "<|im_star", false, []uint32{'<', '|', 'i', 'm', '_', 's', 't', 'a', 'r'}},
		{"empty", "", false, []uint32{}},
	}
	m := Bytes()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := m.Encode(tc.text, tc.add)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Encode = %v, want %v", got, tc.want)
			}
			back, err := m.Decode(got, true)
			if err != nil {
				t.Fatal(err)
			}
			if tc.name != "special" && back != tc.text {
				t.Fatalf("Decode(skip) = %q, want %q", back, tc.text)
			}
			full, err := m.Decode(got, false)
			if err != nil {
				t.Fatal(err)
			}
			wantFull := tc.text
			if tc.add {
				wantFull = "<|bos|>" + tc.text
			}
			if full != wantFull {
				t.Fatalf("Decode = %q, want %q", full, wantFull)
			}
		})
	}
	if _, err := m.Decode([]uint32{260}, false); err == nil {
		t.Fatal("Decode of an out-of-vocabulary id succeeded")
	}
}

func TestBytesChat(t *testing.T) {
	tests := []struct {
		name string
		req  ChatRequest
		want string
		err  bool
	}{
		{
			name: "gen",
			req:  ChatRequest{Messages: json.RawMessage(`[{"role":"system","content":"S"},{"role":"user","content":"hi"}]`), AddGenerationPrompt: true},
			want: "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
		},
		{
			name: "parts and null and tools",
			req: ChatRequest{
				Messages: json.RawMessage(`[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"1", "function":{"name":"f"}}]}]`),
				Tools:    json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`),
			},
			want: "<|im_start|>tools\n[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]<|im_end|>\n<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n\n[{\"id\":\"1\",\"function\":{\"name\":\"f\"}}]<|im_end|>\n",
		},
		{
			name: "continue",
			req:  ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"q"},{"role":"assistant","content":"The answer is"}]`), ContinueFinalMessage: true},
			want: "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nThe answer is",
		},
		{name: "bad json", req: ChatRequest{Messages: json.RawMessage(`[{"role":`)}, err: true},
		{name: "no role", req: ChatRequest{Messages: json.RawMessage(`[{"content":"x"}]`)}, err: true},
		{name: "bad content", req: ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":3}]`)}, err: true},
		{name: "both flags", req: ChatRequest{Messages: json.RawMessage(`[]`), AddGenerationPrompt: true, ContinueFinalMessage: true}, err: true},
	}
	m := Bytes()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prompt, ids, err := m.EncodeChat(tc.req)
			if tc.err {
				if err == nil {
					t.Fatalf("want error, got %q", prompt)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if prompt != tc.want {
				t.Fatalf("prompt %q, want %q", prompt, tc.want)
			}
			want, _ := m.Encode(tc.want, false)
			if !slices.Equal(ids, want) {
				t.Fatalf("ids %v, want %v", ids, want)
			}
		})
	}
}
