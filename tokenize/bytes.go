package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Special ids of the bytes model; see the package documentation.
const (
	BytesBOS     uint32 = 256
	BytesEOS     uint32 = 257
	BytesIMStart uint32 = 258
	BytesIMEnd   uint32 = 259
)

var bytesSpecials = []string{"<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"}

// Bytes returns the built-in bytes model (local only, no registry).
func Bytes() *Model {
	m := &Model{name: "bytes", enc: bytesEncoder{}, chat: bytesChat{}}
	m.mode.Store(int32(ModeLocal))
	return m
}

type bytesEncoder struct{}

func (e bytesEncoder) encode(text string, addSpecial bool) ([]uint32, error) {
	st := e.stream(text, addSpecial)
	for !st.Done() {
		_ = st.Step() // the bytes model cannot fail
	}
	return st.IDs(), nil
}

func (bytesEncoder) stream(text string, addSpecial bool) idStream {
	st := &bytesStream{text: text, ids: make([]uint32, 0, len(text)+1)}
	if addSpecial {
		st.ids = append(st.ids, BytesBOS)
	}
	return st
}

// bytesStream encodes up to and including the next special token per
// step, so chat prompts arrive a message at a time as with tokenizer.json
// models.
type bytesStream struct {
	text string
	pos  int
	ids  []uint32
	done bool
}

func (st *bytesStream) Step() error {
	for st.pos < len(st.text) {
		if st.text[st.pos] == '<' {
			if id, n := bytesSpecialAt(st.text[st.pos:]); n > 0 {
				st.ids = append(st.ids, id)
				st.pos += n
				break
			}
		}
		st.ids = append(st.ids, uint32(st.text[st.pos]))
		st.pos++
	}
	st.done = st.pos == len(st.text)
	return nil
}

func (st *bytesStream) Done() bool    { return st.done }
func (st *bytesStream) IDs() []uint32 { return st.ids }
func (st *bytesStream) Consumed() int { return st.pos }

func bytesSpecialAt(s string) (uint32, int) {
	for j, sp := range bytesSpecials {
		if strings.HasPrefix(s, sp) {
			return BytesBOS + uint32(j), len(sp)
		}
	}
	return 0, 0
}

func (bytesEncoder) decode(ids []uint32, skipSpecial bool) (string, error) {
	var b strings.Builder
	for i, id := range ids {
		switch {
		case id < 256:
			b.WriteByte(byte(id))
		case id < BytesBOS+uint32(len(bytesSpecials)):
			if !skipSpecial {
				b.WriteString(bytesSpecials[id-BytesBOS])
			}
		default:
			return "", fmt.Errorf("bytes model: token %d (%d) out of vocabulary", i, id)
		}
	}
	// A cut in the middle of a UTF-8 sequence decodes like HF's byte-level
	// decoder: invalid bytes become U+FFFD.
	return strings.ToValidUTF8(b.String(), "\uFFFD"), nil
}

type bytesChat struct{}

type bytesMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

func (bytesChat) render(req ChatRequest) (string, error) {
	var msgs []bytesMessage
	if err := json.Unmarshal(req.Messages, &msgs); err != nil {
		return "", fmt.Errorf("messages: %w", err)
	}
	var b strings.Builder
	if t := bytes.TrimSpace(req.Tools); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		b.WriteString("<|im_start|>tools\n")
		if err := compactJSON(&b, t); err != nil {
			return "", fmt.Errorf("tools: %w", err)
		}
		b.WriteString("<|im_end|>\n")
	}
	for i, m := range msgs {
		if m.Role == "" {
			return "", fmt.Errorf("messages[%d]: missing role", i)
		}
		content, err := bytesContent(m.Content)
		if err != nil {
			return "", fmt.Errorf("messages[%d].content: %w", i, err)
		}
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(content)
		if tc := bytes.TrimSpace(m.ToolCalls); len(tc) > 0 && !bytes.Equal(tc, []byte("null")) {
			b.WriteByte('\n')
			if err := compactJSON(&b, tc); err != nil {
				return "", fmt.Errorf("messages[%d].tool_calls: %w", i, err)
			}
		}
		if req.ContinueFinalMessage && i == len(msgs)-1 {
			break
		}
		b.WriteString("<|im_end|>\n")
	}
	if req.AddGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String(), nil
}

func compactJSON(b *strings.Builder, raw json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return err
	}
	b.Write(buf.Bytes())
	return nil
}

// bytesContent flattens a message content: a string, null, or a list of
// parts whose "text" fields are concatenated.
func bytesContent(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		return s, nil
	case '[':
		var parts []struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", err
		}
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String(), nil
	}
	return "", fmt.Errorf("want a string, null or a list of parts")
}
