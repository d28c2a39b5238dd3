package router

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
)

// The admin listener serves operators, not clients: /metrics, the target
// view and the dry run. It binds to loopback by default because the debug
// answers name internal addresses.

func (r *Router) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg}))
	mux.HandleFunc("GET /debug/targets", r.handleDebugTargets)
	mux.HandleFunc("POST /debug/route/v1/completions", func(w http.ResponseWriter, q *http.Request) {
		r.handleDryRun(w, q, EndpointCompletions)
	})
	mux.HandleFunc("POST /debug/route/v1/chat/completions", func(w http.ResponseWriter, q *http.Request) {
		r.handleDryRun(w, q, EndpointChat)
	})
	return mux
}

// DryRun is the answer of POST /debug/route/v1/...: what the router would do
// with the request, without doing it.
type DryRun struct {
	Model        string `json:"model"`
	PromptTokens int    `json:"prompt_tokens"`
	BlockSize    int    `json:"block_size"`
	Blocks       int    `json:"blocks"`
	// LookedUpBlocks is how many of the prompt's blocks the decision looked
	// up: the router stops at the first block no target holds, or once no
	// other target can catch up with the cheapest (keyUntilDecided).
	LookedUpBlocks int            `json:"looked_up_blocks"`
	Decision       DryRunDecision `json:"decision"`
	Candidates     []DryCandidate `json:"candidates"`
}

// DryRunDecision names the chosen target and why.
type DryRunDecision struct {
	Target string `json:"target"`
	Rank   int    `json:"rank"`
	Reason string `json:"reason"`
}

// DryCandidate is one candidate's score.
type DryCandidate struct {
	Target   string `json:"target"`
	Rank     int    `json:"rank"`
	Routable bool   `json:"routable"`
	// ConfirmedBlocks is the candidate's run over the whole prompt, looked
	// up once the rest was encoded; Cost is the decision's, on the blocks
	// it looked up.
	ConfirmedBlocks   int      `json:"confirmed_blocks"`
	SpeculativeBlocks int      `json:"speculative_blocks"`
	Cost              float64  `json:"cost"`
	Load              LoadView `json:"load"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.body())
}

func (r *Router) handleDryRun(w http.ResponseWriter, q *http.Request, ep Endpoint) {
	body, err := io.ReadAll(http.MaxBytesReader(w, q.Body, int64(r.cfg.MaxBodyBytes)))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeAPIError(w, errTooLarge(r.cfg.MaxBodyBytes))
			return
		}
		writeAPIError(w, errBadRequest("", "cannot read body: "+err.Error()))
		return
	}
	req := acquireRequest()
	defer releaseRequest(req)
	if err := ParseRequest(ep, body, req); err != nil {
		var br *BadRequest
		if errors.As(err, &br) {
			writeAPIError(w, errBadRequest(br.Param, br.Message))
			return
		}
		writeAPIError(w, &apiError{Status: 500, Message: err.Error(), Type: typeServer})
		return
	}
	pl, aerr := r.plan(q.Context(), req, true)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	// The dry run reports the whole prompt, so it encodes the rest now.
	pl.startFinishing(r.pl.index, &r.tails)
	writeJSON(w, http.StatusOK, dryRunOf(pl))
}

func dryRunOf(pl *routePlan) DryRun {
	pt := pl.promptForOutcome()
	chosen := pl.cands[pl.dec.idx].Target.ID
	out := DryRun{
		Model: pl.model, PromptTokens: pt.count, BlockSize: pl.blockSize, Blocks: pl.promptBlocks(pt),
		LookedUpBlocks: len(pl.chain.Keys),
		Decision:       DryRunDecision{Target: chosen.Endpoint, Rank: chosen.Rank, Reason: pl.dec.reason},
		Candidates:     make([]DryCandidate, 0, len(pl.cands)),
	}
	for i, c := range pl.cands {
		out.Candidates = append(out.Candidates, DryCandidate{
			Target: c.Target.ID.Endpoint, Rank: c.Target.ID.Rank, Routable: c.Routable,
			ConfirmedBlocks: pl.confirmedNow(i), SpeculativeBlocks: c.SpeculativeBlocks,
			Cost: c.Cost, Load: c.Load,
		})
	}
	return out
}

// targetsView is GET /debug/targets: health's view of every target plus the
// router's index and key configuration.
type targetsView struct {
	Policy string           `json:"policy"`
	Keys   keysView         `json:"block_keys"`
	Health health.DebugView `json:"health"`
	Index  []indexView      `json:"index"`
}

type keysView struct {
	Configured bool   `json:"configured"`
	Mode       string `json:"mode,omitempty"`
	BlockSize  int    `json:"block_size,omitempty"`
	Algo       string `json:"algo,omitempty"`
}

type indexView struct {
	Target          string `json:"target"`
	Placements      int    `json:"placements"`
	GPU             int    `json:"gpu"`
	CPU             int    `json:"cpu"`
	Storage         int    `json:"storage"`
	Evicted         uint64 `json:"evicted"`
	UnknownRemovals uint64 `json:"unknown_removals"`
	HashChecks      uint64 `json:"hash_checks"`
	HashMismatches  uint64 `json:"hash_mismatches"`
}

func (r *Router) handleDebugTargets(w http.ResponseWriter, _ *http.Request) {
	v := targetsView{Policy: r.cfg.Policy.String(), Health: r.mon.Debug()}
	if ks := r.pl.keyer.Load(); ks != nil {
		v.Keys = keysView{Configured: true, Mode: ks.mode.String(), BlockSize: ks.blockSize, Algo: ks.algo}
	}
	r.pl.mu.Lock()
	in := r.pl.ingestor
	r.pl.mu.Unlock()
	for _, s := range r.pl.index.Stats() {
		iv := indexView{
			Target: s.Target.String(), Placements: s.Placements,
			GPU: s.ByTier[kvindex.TierGPU], CPU: s.ByTier[kvindex.TierCPU], Storage: s.ByTier[kvindex.TierStorage],
			Evicted: s.Evicted, UnknownRemovals: s.UnknownRemovals,
		}
		if in != nil {
			iv.HashChecks, iv.HashMismatches = in.HashHealth(s.Target)
		}
		v.Index = append(v.Index, iv)
	}
	writeJSON(w, http.StatusOK, v)
}
