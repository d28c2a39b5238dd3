package router

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvtransport"
	"github.com/prefixrouter/prefixrouter/peers"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// The admin listener serves operators, not clients: /metrics, the target
// view and the dry run. It binds to loopback by default because the debug
// answers name internal addresses, and the dry run says where a prompt is
// cached; --admin-token-file makes everything but /metrics (which
// Prometheus scrapes) want the token.

// Bounds on one admin request: the dry run reads a body of up to
// --max-body-bytes and answers once its prompt is encoded.
const (
	adminReadTimeout  = 30 * time.Second
	adminWriteTimeout = 30 * time.Second
	adminIdleTimeout  = 2 * time.Minute
)

func (r *Router) adminHandler() http.Handler {
	mux := r.adminMux()
	return http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
		if q.URL.Path != "/metrics" && !r.cred.adminAllowed(q.Header.Get("Authorization")) {
			r.cred.adminRefused.WithLabelValues("unauthorized").Inc()
			w.Header().Set("WWW-Authenticate", "Bearer")
			writeAPIError(w, &apiError{Status: http.StatusUnauthorized, Type: typeInvalidRequest, Code: "invalid_api_key",
				Message: "the admin listener wants its token: Authorization: Bearer TOKEN (--admin-token-file)"})
			return
		}
		mux.ServeHTTP(w, q)
	})
}

func (r *Router) adminMux() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg}))
	mux.HandleFunc("GET /debug/targets", r.handleDebugTargets)
	mux.HandleFunc("GET /debug/speculative", r.handleDebugSpeculative)
	mux.HandleFunc("POST /debug/route/v1/completions", func(w http.ResponseWriter, q *http.Request) {
		r.handleDryRun(w, q, EndpointCompletions)
	})
	mux.HandleFunc("POST /debug/route/v1/chat/completions", func(w http.ResponseWriter, q *http.Request) {
		r.handleDryRun(w, q, EndpointChat)
	})
	mux.HandleFunc("POST /debug/route/v1/responses", func(w http.ResponseWriter, q *http.Request) {
		r.handleDryRun(w, q, EndpointResponses)
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
	// other target can catch up with the cheapest (readUntilDecided).
	LookedUpBlocks int            `json:"looked_up_blocks"`
	Decision       DryRunDecision `json:"decision"`
	Candidates     []DryCandidate `json:"candidates"`
}

// DryRunDecision names the chosen target and why. For a model with
// prefill pods, Target computes the prefill (the candidates are the
// prefill pods) and Decode names the decode pod; without Decode, Target
// serves the whole request.
type DryRunDecision struct {
	Target string          `json:"target"`
	Rank   int             `json:"rank"`
	Reason string          `json:"reason"`
	Decode *DryRunDecision `json:"decode,omitempty"`
}

// DryCandidate is one candidate's score.
type DryCandidate struct {
	Target   string `json:"target"`
	Rank     int    `json:"rank"`
	Routable bool   `json:"routable"`
	// ConfirmedBlocks is the candidate's run over the whole prompt, looked
	// up once the rest was encoded; Cost is the decision's, on the blocks
	// it looked up.
	ConfirmedBlocks   int `json:"confirmed_blocks"`
	SpeculativeBlocks int `json:"speculative_blocks"`
	// PredictionTrust weighs the speculative blocks (speculative policy).
	PredictionTrust float64        `json:"prediction_trust"`
	Cost            float64        `json:"cost"`
	Load            brain.LoadView `json:"load"`
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
	d, aerr := r.route(q.Context(), nil, req, "", true)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	// The dry run reports the whole prompt, so it encodes the rest now.
	tail := brain.StartTail(d.Decision, r.ev.Index(), &r.tails)
	tail.Wait()
	writeJSON(w, http.StatusOK, dryRunOf(d, tail))
}

func dryRunOf(d *decision, tail *brain.Tail) DryRun {
	chosen := d.Target().Target.ID
	v := d.View(tail, d.Chosen())
	cands := d.Candidates()
	out := DryRun{
		Model: d.Model(), PromptTokens: v.Prompt.Count, BlockSize: d.BlockSize(), Blocks: d.PromptBlocks(v.Prompt),
		LookedUpBlocks: d.LookedUpBlocks(),
		Decision:       DryRunDecision{Target: chosen.Endpoint, Rank: chosen.Rank, Reason: d.Reason()},
		Candidates:     make([]DryCandidate, 0, len(cands)),
	}
	if dec := d.decode; dec != nil {
		id := dec.Target().Target.ID
		out.Decision.Decode = &DryRunDecision{Target: id.Endpoint, Rank: id.Rank, Reason: dec.Reason()}
	}
	for i, c := range cands {
		out.Candidates = append(out.Candidates, DryCandidate{
			Target: c.Target.ID.Endpoint, Rank: c.Target.ID.Rank, Routable: c.Routable,
			ConfirmedBlocks: d.View(tail, i).Confirmed, SpeculativeBlocks: c.SpeculativeBlocks, PredictionTrust: c.PredictionWeight,
			Cost: c.Cost, Load: c.Load,
		})
	}
	return out
}

// targetsView is GET /debug/targets: health's view of every target with
// each target's event stream from the event plane, plus the plane's block
// keys and index.
type targetsView struct {
	Policy string                 `json:"policy"`
	Keys   eventplane.KeysView    `json:"block_keys"`
	Health debugHealth            `json:"health"`
	Index  []eventplane.IndexView `json:"index"`
	// EventBuses are the --events-listen sockets: the topics each follows
	// and the publishers matching no target.
	EventBuses []kvtransport.BusStatus `json:"event_buses,omitempty"`
	// Peers are the router replicas this one shares predictions and
	// in-flight work with (--peer-listen, --peers).
	Peers *peers.View `json:"peers,omitempty"`
}

// debugHealth is health's debug view with every target's "event_stream"
// added: the JSON shape it had when health judged freshness (field order
// aside).
type debugHealth struct {
	health.DebugView
	Targets []debugTarget `json:"targets"`
}

// debugTarget is one target: health's view, whose state and reason the
// router composes with the target's wiring faults (wiring.go), health's
// own kept beside them, and the event stream.
type debugTarget struct {
	health.TargetView
	State        health.State          `json:"state"`
	Reason       string                `json:"reason"`
	Detail       string                `json:"detail,omitempty"`
	HealthState  health.State          `json:"health_state"`
	HealthReason health.Reason         `json:"health_reason"`
	WiringFaults []wiringFault         `json:"wiring_faults,omitempty"`
	EventStream  eventplane.StreamView `json:"event_stream"`
	// LastUpstreamError is the last failure the proxy saw on the target:
	// the detail behind a client's 502 or 504.
	LastUpstreamError *upstreamFailure `json:"last_upstream_error,omitempty"`
}

func (r *Router) handleDebugTargets(w http.ResponseWriter, _ *http.Request) {
	hv := r.mon.Debug()
	snap := r.mon.Snapshot()
	v := targetsView{
		Policy: r.cfg.Policy.String(),
		Keys:   r.ev.KeysView(),
		Health: debugHealth{DebugView: hv},
		Index:  r.ev.IndexView(),

		EventBuses: r.ev.Buses(),
	}
	if pv, ok := r.PeersView(); ok {
		v.Peers = &pv
	}
	for _, tv := range hv.Targets {
		id := targetid.ID{Endpoint: tv.Endpoint, Rank: tv.Rank}
		dt := debugTarget{TargetView: tv, State: tv.State, Reason: string(tv.Reason), Detail: tv.Detail,
			HealthState: tv.State, HealthReason: tv.Reason, EventStream: r.ev.StreamView(id), LastUpstreamError: r.lastFailure(id)}
		if t, ok := snap.Target(id); ok {
			f := r.ev.Freshness(id)
			dt.WiringFaults = wiringFaults(t, &f)
			dt.State, dt.Reason, dt.Detail = composedState(t, dt.WiringFaults)
		}
		v.Health.Targets = append(v.Health.Targets, dt)
	}
	writeJSON(w, http.StatusOK, v)
}

// handleDebugSpeculative serves the predicted placements' view: every
// target's TTL and why, trust, pending and mature predictions, rates,
// latencies, exposure, funnel, false-warm routes and the holdback arms.
func (r *Router) handleDebugSpeculative(w http.ResponseWriter, _ *http.Request) {
	if r.spec == nil {
		writeAPIError(w, &apiError{Status: http.StatusNotFound, Type: typeNotFound, Code: "not_found",
			Message: "no predicted placements: the router runs --policy " + r.cfg.Policy.String() + ", not speculative"})
		return
	}
	writeJSON(w, http.StatusOK, r.spec.View())
}
