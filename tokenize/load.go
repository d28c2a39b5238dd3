package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/prefixrouter/prefixrouter/tokenize/bpe"
)

// bpeEncoder adapts the tokenizer.json encoder.
type bpeEncoder struct{ t *bpe.Tokenizer }

func (e bpeEncoder) encode(text string, addSpecial bool) ([]uint32, error) {
	return e.t.Encode(text, addSpecial)
}

func (e bpeEncoder) decode(ids []uint32, skipSpecial bool) (string, error) {
	return e.t.Decode(ids, skipSpecial)
}

// tokenizerConfig is the part of transformers' tokenizer_config.json that
// changes ids or renders.
type tokenizerConfig struct {
	AddBOS       *bool           `json:"add_bos_token"`
	AddEOS       *bool           `json:"add_eos_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
	raw          map[string]json.RawMessage
}

// specialTokenNames are the special_tokens_map entries transformers passes
// to chat templates.
var specialTokenNames = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

// tokenString reads a token given as a string or an AddedToken object.
func tokenString(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, s != ""
	}
	var obj struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != "" {
		return obj.Content, true
	}
	return "", false
}

var errNoTemplateFile = errors.New("the model directory has no chat template")

// loadBPE parses a tokenizer.json. It is a variable so that the package's
// tests can parse each file once (see TestMain).
var loadBPE = bpe.Load

// loadLocal fills m's encoder and chat template from a model directory or a
// tokenizer.json file.
func loadLocal(m *Model, path string, cache bpe.SegmentCache) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("load %s: %w", path, err)
	}
	dir, file := path, filepath.Join(path, "tokenizer.json")
	if !st.IsDir() {
		dir, file = filepath.Dir(path), path
	}
	t, err := loadBPE(file)
	if err != nil {
		return err
	}
	t.SetCache(cache)
	m.enc = bpeEncoder{t}
	if !st.IsDir() {
		// A tokenizer.json named on its own means exactly that file, as HF
		// tokenizers reads it: no transformers config, no chat template.
		m.chatErr = errNoTemplateFile
		if hfAvailable {
			m.enc, err = newHFEncoder(file, false, nil, nil)
		}
		return err
	}

	var cfg tokenizerConfig
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	if raw, err := os.ReadFile(cfgPath); err == nil {
		if err := json.Unmarshal(raw, &cfg.raw); err != nil {
			return fmt.Errorf("load %s: %w", cfgPath, err)
		}
		if err := json.Unmarshal(raw, &cfg); err != nil {
			return fmt.Errorf("load %s: %w", cfgPath, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("load %s: %w", cfgPath, err)
	}
	specials := map[string]string{}
	for _, k := range specialTokenNames {
		if v, ok := cfg.raw[k]; ok {
			if s, ok := tokenString(v); ok {
				specials[k] = s
			}
		}
	}
	// transformers, not tokenizer.json, decides BOS/EOS when the config
	// says: add_bos_token / add_eos_token rebuild the post-processor.
	if cfg.AddBOS != nil || cfg.AddEOS != nil {
		var bos, eos string
		if cfg.AddBOS != nil && *cfg.AddBOS {
			if bos = specials["bos_token"]; bos == "" {
				return fmt.Errorf("load %s: add_bos_token is set but bos_token is not", cfgPath)
			}
		}
		if cfg.AddEOS != nil && *cfg.AddEOS {
			if eos = specials["eos_token"]; eos == "" {
				return fmt.Errorf("load %s: add_eos_token is set but eos_token is not", cfgPath)
			}
		}
		if err := t.SetSpecialTokens(bos, eos); err != nil {
			return fmt.Errorf("load %s: %w", cfgPath, err)
		}
	}
	if hfAvailable {
		var prefix, suffix []uint32
		override := cfg.AddBOS != nil || cfg.AddEOS != nil
		if override {
			prefix, _ = t.EncodeSpecialIDs(specials["bos_token"], cfg.AddBOS != nil && *cfg.AddBOS)
			suffix, _ = t.EncodeSpecialIDs(specials["eos_token"], cfg.AddEOS != nil && *cfg.AddEOS)
		}
		if m.enc, err = newHFEncoder(file, override, prefix, suffix); err != nil {
			return err
		}
	}

	src, srcName, err := chatTemplateSource(dir, cfg.ChatTemplate)
	if err != nil {
		return err
	}
	if src == "" {
		m.chatErr = errNoTemplateFile
		return nil
	}
	var extra []string
	if v, ok := cfg.raw["additional_special_tokens"]; ok {
		var list []json.RawMessage
		if json.Unmarshal(v, &list) == nil {
			for _, it := range list {
				if s, ok := tokenString(it); ok {
					extra = append(extra, s)
				}
			}
		}
	}
	r, err := newJinjaChat(src, specials, extra)
	if err != nil {
		m.chatErr = fmt.Errorf("%s: %w", srcName, err)
		return nil
	}
	m.chat = r
	return nil
}

// chatTemplateSource picks the template like transformers: a
// chat_template.jinja file wins over tokenizer_config.json's chat_template,
// which is a string or a list of {name, template} (the "default" one).
func chatTemplateSource(dir string, cfgTemplate json.RawMessage) (src, name string, err error) {
	p := filepath.Join(dir, "chat_template.jinja")
	if raw, err := os.ReadFile(p); err == nil {
		return string(raw), p, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", "", fmt.Errorf("load %s: %w", p, err)
	}
	if len(cfgTemplate) == 0 || string(cfgTemplate) == "null" {
		return "", "", nil
	}
	name = filepath.Join(dir, "tokenizer_config.json") + " chat_template"
	var s string
	if json.Unmarshal(cfgTemplate, &s) == nil {
		return s, name, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(cfgTemplate, &list); err != nil {
		return "", "", fmt.Errorf("load %s: want a string or a list of {name, template}: %w", name, err)
	}
	for _, t := range list {
		if t.Name == "default" {
			return t.Template, name, nil
		}
	}
	return "", "", nil
}
