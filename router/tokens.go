package router

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/tokenize"
)

// tokenizers resolves a request's model to its tokenizer: a --tokenizer
// entry, the base model of a LoRA adapter, or (modes remote and auto) a
// remote-only model the router registers on first use.
type tokenizers struct {
	reg  *tokenize.Registry
	mode tokenize.Mode
	// timeout bounds a call that may wait on a pod (--tokenize-timeout).
	timeout time.Duration
	mu      sync.Mutex
	// noLocal remembers models the router will not tokenize (mode local
	// without a tokenizer), so the registry is not asked every request.
	noLocal map[string]bool
}

func newTokenizers(reg *tokenize.Registry, mode tokenize.Mode, timeout time.Duration) *tokenizers {
	return &tokenizers{reg: reg, mode: mode, timeout: timeout, noLocal: make(map[string]bool)}
}

func (t *tokenizers) model(name string, cat *catalog) *tokenize.Model {
	if m, err := t.reg.Model(name); err == nil {
		return m
	}
	if parent := cat.parent(name); parent != "" {
		if m, err := t.reg.Model(parent); err == nil {
			return m
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if m, err := t.reg.Model(name); err == nil {
		return m
	}
	if t.noLocal[name] {
		return nil
	}
	if t.mode == tokenize.ModeLocal {
		t.noLocal[name] = true
		slog.Warn("no tokenizer for model; routing it on load alone (give --tokenizer or --tokenization remote)", "model", name)
		return nil
	}
	m, err := t.reg.Add(name, "", tokenize.ModeRemote)
	if err != nil {
		t.noLocal[name] = true
		slog.Warn("cannot register remote tokenizer", "model", name, "err", err)
		return nil
	}
	return m
}

// estimateTokens guesses a prompt's tokens at about four bytes each.
func estimateTokens(req *Request) int {
	switch {
	case req.HasIDs:
		return len(req.PromptIDs)
	case req.Chat.Messages != nil:
		return max(1, len(req.Chat.Messages)/4)
	case req.TextBytes > 0:
		return max(1, req.TextBytes/4)
	}
	return max(1, len(req.PromptText)/4)
}

// prompt returns the request's prompt tokens. need says the policy needs
// exact ids; without it a remote round trip is not worth it and the count is
// estimated unless a local tokenizer makes ids cheap. A local tokenizer
// returns a stream the caller reads as far as it needs. beforeCall (may be
// nil) runs before a call that may wait on a pod.
func (t *tokenizers) prompt(ctx context.Context, req *Request, cat *catalog, need bool, base func() string, beforeCall func()) (brain.Prompt, *apiError) {
	if req.HasIDs {
		return brain.IDsPrompt(req.PromptIDs), nil
	}
	est := brain.Prompt{Count: estimateTokens(req), Source: "estimate"}
	chat := req.Endpoint.rendersChat()
	if req.PromptUnknown || (chat && req.CustomTemplate) {
		// The pod renders the request's own template, or a prompt the
		// router cannot derive: a local render would be wrong and a
		// remote one is not worth a round trip here.
		return est, nil
	}
	m := t.model(req.Model, cat)
	if m == nil {
		return est, nil
	}
	local := m.EffectiveMode(chat) != tokenize.ModeRemote
	if !need && !local {
		return est, nil
	}
	// Auto mode compares a sample of local results with the pod's, and a
	// model whose template only renders remotely needs the pod: both want
	// a base URL even when the ids come from the local tokenizer.
	url := ""
	if m.NeedsBaseURL(chat) {
		url = base()
	}
	if local {
		var st *tokenize.Stream
		var err error
		if chat {
			st, err = m.StreamChat(req.Chat, url)
		} else {
			st, err = m.StreamPrompt(req.PromptText, req.AddSpecialTokens, url)
		}
		if err == nil {
			return brain.Prompt{Count: st.EstimateCount(), Source: "local", Stream: st}, nil
		}
		// A local render that fails takes the call path below, which in
		// auto mode asks the pod.
	}
	if beforeCall != nil {
		beforeCall()
	}
	// The bound covers the call only: local encoding never waits.
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	var res tokenize.Result
	var err error
	if chat {
		res, err = m.TokenizeChat(ctx, req.Chat, url)
	} else {
		res, err = m.TokenizePrompt(ctx, req.PromptText, req.AddSpecialTokens, url)
	}
	if err != nil {
		var re *tokenize.RemoteError
		if errors.As(err, &re) && re.Status >= 400 && re.Status < 500 && re.Status != 404 && re.Status != 405 &&
			req.Endpoint != EndpointResponses {
			// The pod rejects the request itself (a template that raises,
			// a prompt too long): it would reject it when proxied too.
			// Not so a Responses request, which the pod renders from the
			// client's body, not from the messages the router derived.
			slog.Info("the model server rejected the prompt when rendering it", "model", req.Model, "err", err)
			return est, errBadRequest("", "the model server rejected the prompt: "+podMessage(re.Body, url))
		}
		// A local render or encode that fails (a template raising, say) is
		// left for the pod to judge: it routes on load and the pod answers.
		slog.Debug("tokenization failed; routing on load", "model", req.Model, "err", err)
		return est, nil
	}
	src := "local"
	if res.Mode == tokenize.ModeRemote {
		src = "remote"
	}
	return brain.Prompt{IDs: res.IDs, Counted: true, Count: len(res.IDs), Source: src}, nil
}
