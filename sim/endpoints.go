package sim

import (
	"context"
	"net/http"
	"time"
)

func (p *Pod) handleRenderCompletions(w http.ResponseWriter, r *http.Request) { p.render(w, r, false) }
func (p *Pod) handleRenderChat(w http.ResponseWriter, r *http.Request)        { p.render(w, r, true) }

// render answers vLLM's render endpoints: the GenerateRequest the engine
// would receive (a list for completions, one object for chat).
func (p *Pod) render(w http.ResponseWriter, r *http.Request, chat bool) {
	pr, aerr := p.readPrepared(w, r, chat)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var salt *string
	if pr.salt != "" {
		salt = &pr.salt
	}
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	id := p.requestID(r, prefix)
	out := make([]generateRequest, len(pr.prompts))
	for i, ids := range pr.prompts {
		out[i] = generateRequest{
			RequestID: id, TokenIDs: ids, Model: pr.model, Stream: pr.req.Stream, StreamOptions: pr.req.StreamOptions,
			CacheSalt: salt, SamplingParams: map[string]any{"max_tokens": pr.maxTok},
		}
	}
	if chat {
		writeJSON(w, http.StatusOK, out[0])
		return
	}
	writeJSON(w, http.StatusOK, out)
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

func (p *Pod) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if aerr := p.readJSON(w, r, &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	if _, _, aerr := p.resolveModel(req.Model); aerr != nil {
		writeError(w, aerr)
		return
	}
	var ids []uint32
	switch {
	case !isNull(req.Messages):
		var aerr *apiError
		ids, aerr = p.encodeChat(req.Messages, req.Tools, req.ChatTemplateKwargs, req.AddGenerationPrompt, req.ContinueFinalMessage, req.AddSpecialTokens)
		if aerr != nil {
			writeError(w, aerr)
			return
		}
	case req.Prompt != nil:
		var err error
		ids, err = p.tok.Encode(*req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
		if err != nil {
			writeError(w, badRequest("tokenizing prompt: %v", err))
			return
		}
	default:
		writeError(w, &apiError{status: 400, typ: "BadRequestError", msg: "prompt or messages: field required", param: "prompt"})
		return
	}
	resp := tokenizeResponse{Count: len(ids), MaxModelLen: p.prof.MaxModelLen, Tokens: ids}
	if ids == nil {
		resp.Tokens = []uint32{}
	}
	if req.ReturnTokenStrs {
		for _, id := range ids {
			s, err := p.tok.Decode([]uint32{id}, false)
			if err != nil {
				s = ""
			}
			resp.TokenStrs = append(resp.TokenStrs, s)
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

func (p *Pod) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req detokenizeRequest
	if aerr := p.readJSON(w, r, &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	if _, _, aerr := p.resolveModel(req.Model); aerr != nil {
		writeError(w, aerr)
		return
	}
	if isNull(req.Tokens) {
		writeError(w, &apiError{status: 400, typ: "BadRequestError", msg: "tokens: field required", param: "tokens"})
		return
	}
	ids, err := parseIDs(req.Tokens)
	if err != nil {
		writeError(w, &apiError{status: 400, typ: "BadRequestError", msg: err.Error(), param: "tokens"})
		return
	}
	text, err := p.tok.Decode(ids, false)
	if err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": text})
}

func (p *Pod) handleModels(w http.ResponseWriter, _ *http.Request) {
	created := p.started.Load() / 1e9
	list := modelList{Object: "list", Data: []modelCard{{
		ID: p.cfg.Model, Object: "model", Created: created, OwnedBy: "vllm", Root: p.cfg.Model,
		MaxModelLen: p.prof.MaxModelLen, Permission: []any{},
	}}}
	for _, l := range p.cfg.LoRAs {
		list.Data = append(list.Data, modelCard{ID: l, Object: "model", Created: created, OwnedBy: "vllm", Root: l, Parent: p.cfg.Model, Permission: []any{}})
	}
	writeJSON(w, http.StatusOK, list)
}

// handleHealth is vLLM's /health: 200 with an empty body, 503 when the
// engine is dead (or, here, restarting).
func (p *Pod) handleHealth(w http.ResponseWriter, _ *http.Request) {
	if p.down.Load() || p.faults.get().Dead {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (p *Pod) handleResetPrefixCache(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	ok, err := p.ResetPrefixCache(ctx)
	if err != nil {
		writeError(w, &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: err.Error()})
		return
	}
	if !ok {
		writeError(w, &apiError{status: http.StatusConflict, typ: "ConflictError", msg: "prefix cache not reset: blocks are in use"})
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (p *Pod) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, p.faults.get().view())
}

// handlePostFaults applies a partial update: fields left out keep their
// value. Durations are strings ("50ms") or milliseconds.
func (p *Pod) handlePostFaults(w http.ResponseWriter, r *http.Request) {
	var patch faultPatch
	if aerr := p.readJSON(w, r, &patch); aerr != nil {
		writeError(w, aerr)
		return
	}
	f := patch.apply(p.faults.get())
	if err := f.Validate(); err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if err := p.SetFaults(ctx, f); err != nil {
		writeError(w, &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, p.faults.get().view())
}

func (p *Pod) handleRestart(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	if err := p.Restart(ctx); err != nil {
		writeError(w, &apiError{status: http.StatusServiceUnavailable, typ: "ServiceUnavailableError", msg: err.Error()})
		return
	}
	w.WriteHeader(http.StatusOK)
}
