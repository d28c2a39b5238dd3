package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/tokenize"
)

// tokenizeSettings is what the tokenize command's flags set.
type tokenizeSettings struct {
	Tokenizer        string
	AddSpecialTokens bool
	Chat             bool
}

func tokenizeCommand(stderr io.Writer) *cli.Command {
	var s tokenizeSettings
	t := newFlagTable("tokenize")
	b := t.group("")
	return t.command(&cli.Command{
		Name:  "tokenize",
		Usage: "encode JSON Lines from stdin with a model's tokenizer, as vLLM would",
		Description: "Each stdin line is a JSON string; each output line is the JSON array of its token ids.\n" +
			"With --chat each line is {\"messages\": [...], \"add_generation_prompt\": true, \"tools\": [...],\n" +
			"\"chat_template_kwargs\": {...}} (only messages required; add_generation_prompt defaults to true)\n" +
			"and each output line is {\"prompt\": ..., \"token_ids\": [...]} or {\"error\": ...} when the template raises.\n" +
			"--tokenizer is a model directory (tokenizer.json with tokenizer_config.json's BOS rules and chat template,\n" +
			"as vLLM applies them), a lone tokenizer.json (HF tokenizers' own behaviour), \"bytes\" for the built-in model,\n" +
			"or a Hugging Face Hub repository ORG/NAME[@REVISION] (or hf:ORG/NAME) fetched as serve fetches it.",
		Flags: []cli.Flag{
			defaultText(b.str("tokenizer", "model directory, tokenizer.json file, \"bytes\", or a hub repository ORG/NAME[@REVISION]", &s.Tokenizer), "none, required"),
			b.bool("add-special-tokens", "add the post-processor's special tokens (BOS/EOS) to plain strings", &s.AddSpecialTokens),
			b.bool("chat", "lines are chat requests rendered with the model's chat template", &s.Chat),
		},
		Action: func(ctx context.Context, cmd *cli.Command) error {
			return runTokenize(ctx, cmd.Root().Reader, cmd.Root().Writer, stderr, &s, cmd.IsSet("add-special-tokens"))
		},
	})
}

// runTokenize encodes stdin; specialGiven says --add-special-tokens was
// given at all, which --chat refuses even as false.
func runTokenize(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer, s *tokenizeSettings, specialGiven bool) error {
	if s.Tokenizer == "" {
		return usageError("--tokenizer is required")
	}
	if s.Chat && specialGiven {
		return usageError("--add-special-tokens does not apply to --chat (chat prompts encode without them, as vLLM does)")
	}
	m, reg, err := loadTokenizeModel(ctx, s.Tokenizer, stderr)
	if err != nil {
		return err
	}
	defer reg.Close()
	w := bufio.NewWriter(stdout)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	err = tokenizeLines(stdin, func(lineNo int, line []byte) error {
		if s.Chat {
			return tokenizeChatLine(m, enc, lineNo, line)
		}
		var text string
		if err := json.Unmarshal(line, &text); err != nil {
			return usageError("stdin line %d: want a JSON string: %v", lineNo, err)
		}
		ids, err := m.Encode(text, s.AddSpecialTokens)
		if err != nil {
			return fmt.Errorf("line %d: %w", lineNo, err)
		}
		return enc.Encode(nonNil(ids))
	})
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	return err
}

// loadTokenizeModel loads the tokenize command's one model: a local path or
// "bytes" as given, else the hub repository it names, fetched as serve
// fetches it (HF_* settings from the environment) and never replaced by a
// pod: this command has none to ask.
func loadTokenizeModel(ctx context.Context, text string, stderr io.Writer) (*tokenize.Model, *tokenize.Registry, error) {
	if _, err := os.Stat(text); err == nil || text == "bytes" {
		reg := tokenize.NewRegistry(tokenize.Options{})
		m, err := reg.Add("cli", text, tokenize.ModeLocal)
		if err != nil {
			reg.Close()
			return nil, nil, fmt.Errorf("tokenize: %w", err)
		}
		return m, reg, nil
	}
	if strings.ContainsAny(text, "=") {
		return nil, nil, usageError("--tokenizer %q: want a model directory, a tokenizer.json, \"bytes\" or a hub repository ORG/NAME[@REVISION]", text)
	}
	spec, err := tokenize.ParseSpec(text)
	if err != nil {
		return nil, nil, usageError("--tokenizer %q: no such file or directory, and not a hub repository ORG/NAME[@REVISION]", text)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	reg, err := loadTokenizers(ctx, []string{text}, tokenize.ModeLocal, nil, log)
	if err != nil {
		return nil, nil, err
	}
	m, err := reg.Model(spec.Name)
	if err != nil {
		reg.Close()
		return nil, nil, fmt.Errorf("tokenize: %w", err)
	}
	return m, reg, nil
}

// tokenizeLines calls fn for every stdin line (1-based numbers); lines may
// be long (whole documents).
func tokenizeLines(r io.Reader, fn func(int, []byte) error) error {
	br := bufio.NewReaderSize(r, 1<<20)
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if ferr := fn(lineNo, bytes.TrimRight(line, "\r\n")); ferr != nil {
				return ferr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read stdin: %w", err)
		}
	}
}

type chatLine struct {
	Messages            json.RawMessage `json:"messages"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	Tools               json.RawMessage `json:"tools"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs"`
	ContinueFinal       bool            `json:"continue_final_message"`
}

func tokenizeChatLine(m *tokenize.Model, enc *json.Encoder, lineNo int, line []byte) error {
	var cl chatLine
	if err := json.Unmarshal(line, &cl); err != nil {
		return usageError("stdin line %d: want a JSON object: %v", lineNo, err)
	}
	if len(cl.Messages) == 0 || string(cl.Messages) == "null" {
		return usageError("stdin line %d: \"messages\" is required", lineNo)
	}
	req := tokenize.ChatRequest{
		Messages:             cl.Messages,
		Tools:                cl.Tools,
		ChatTemplateKwargs:   cl.ChatTemplateKwargs,
		AddGenerationPrompt:  cl.AddGenerationPrompt == nil || *cl.AddGenerationPrompt,
		ContinueFinalMessage: cl.ContinueFinal,
	}
	if req.ContinueFinalMessage && cl.AddGenerationPrompt == nil {
		req.AddGenerationPrompt = false
	}
	prompt, ids, err := m.EncodeChat(req)
	var te *tokenize.TemplateError
	switch {
	case errors.As(err, &te):
		return enc.Encode(map[string]string{"error": te.Err.Error()})
	case errors.Is(err, tokenize.ErrNoTemplate):
		return fmt.Errorf("line %d: %w", lineNo, err)
	case err != nil:
		return usageError("stdin line %d: %v", lineNo, err)
	}
	return enc.Encode(struct {
		Prompt   string   `json:"prompt"`
		TokenIDs []uint32 `json:"token_ids"`
	}{prompt, nonNil(ids)})
}

func nonNil(ids []uint32) []uint32 {
	if ids == nil {
		return []uint32{}
	}
	return ids
}
