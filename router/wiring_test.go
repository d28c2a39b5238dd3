package router

import (
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/internal/logbuf"
	"github.com/prefixrouter/prefixrouter/sim"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// has reports whether a logged line contains every one of parts.
func has(logs *logbuf.Buffer, parts ...string) bool { return len(logs.Lines(parts...)) > 0 }

// debugTargetView is what a test reads of one target in GET /debug/targets.
type debugTargetView struct {
	Target       string `json:"target"`
	State        string `json:"state"`
	Reason       string `json:"reason"`
	Detail       string `json:"detail"`
	HealthState  string `json:"health_state"`
	HealthReason string `json:"health_reason"`
	CanRoute     bool   `json:"can_route"`
	WiringFaults []struct {
		Fault  string `json:"fault"`
		Detail string `json:"detail"`
	} `json:"wiring_faults"`
}

func debugTargets(t *testing.T, r *Router) map[string]debugTargetView {
	t.Helper()
	var v struct {
		Health struct {
			Targets []debugTargetView `json:"targets"`
		} `json:"health"`
	}
	adminDebugTargets(t, r, &v)
	out := map[string]debugTargetView{}
	for _, tv := range v.Health.Targets {
		out[tv.Target] = tv
	}
	return out
}

// ready reads the API listener's /ready.
func ready(t *testing.T, r *Router) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + r.Addr() + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestWiringFaultBarePodURL is the operator's first hour: --endpoint names
// the bare pod URL, so the router follows KV events at tcp://HOST:5557,
// where nothing listens. Requests are answered (on load alone), and the
// fault is loud at once in three places: a warning naming the vLLM setting
// and the events= option, the target's state and reason in /debug/targets,
// and the wiring-fault gauge. /ready still answers 200 and says which fault
// degrades a target, without the address. The alertable counters exist at
// zero from the start.
func TestWiringFaultBarePodURL(t *testing.T) {
	t.Parallel()
	// A loopback address of its own, so that no other test's publisher
	// can be listening on its port 5557.
	f := startFleetWith(t, sim.Config{Pods: 1, Host: "127.0.0.57"})
	pod := f.Pods[0].URL()
	var logs logbuf.Buffer
	cfg := DefaultConfig()
	cfg.Health = fastHealth(pod)
	r := startRouterLogging(t, cfg, slog.New(slog.NewTextHandler(&logs, nil)), "sim-tiny=bytes")
	name := targetid.ID{Endpoint: pod}.String()
	waitFor(t, "the pod routable", func() bool { return routableCount(r, "sim-tiny") == 1 })
	for range 3 {
		if code, _, b := post(t, "http://"+r.Addr()+"/v1/completions", `{"model":"sim-tiny","prompt":"hello there","max_tokens":2}`); code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
	}
	for _, series := range []string{
		`prefixrouter_kv_hash_mismatches_total{reason="hash",target="` + name + `"}`,
		`prefixrouter_kv_unrecovered_batches_total{target="` + name + `"}`,
		`prefixrouter_upstream_errors_total{reason="before_first_byte",target="` + name + `"}`,
		`prefixrouter_target_wiring_fault{fault="key_mismatch",target="` + name + `"}`,
	} {
		if v, ok := metricSeries(t, r, series); !ok || v != 0 {
			t.Errorf("%s: %v (exported %v), want 0 from the start", series, v, ok)
		}
	}

	waitFor(t, "the fault logged", func() bool {
		return has(&logs, "level=WARN", "event stream wiring fault", "fault=events_disconnected", "target="+name,
			"nothing answers at tcp://127.0.0.57:5557", "--kv-events-config", "events=")
	})
	tv := debugTargets(t, r)[name]
	if tv.State != "degraded" || tv.Reason != "events_disconnected" || !strings.Contains(tv.Detail, "nothing answers at tcp://127.0.0.57:5557") ||
		tv.HealthState != "routable" || !tv.CanRoute || len(tv.WiringFaults) != 1 || tv.WiringFaults[0].Fault != "events_disconnected" {
		t.Fatalf("/debug/targets: %+v: want degraded by events_disconnected, still routable", tv)
	}
	series := `prefixrouter_target_wiring_fault{fault="events_disconnected",target="` + name + `"}`
	if v := metricValue(t, r, series); v != 1 {
		t.Fatalf("%s = %v, want 1", series, v)
	}
	code, body := ready(t, r)
	if code != 200 || !strings.HasPrefix(body, "ready\n") || !strings.Contains(body, "events_disconnected: 1 target(s)") ||
		!strings.Contains(body, "--kv-events-config") || strings.Contains(body, "127.0.0.57") {
		t.Fatalf("/ready %d %q: want 200 naming the fault without the address", code, body)
	}
}

// TestWiringFaultWrongHashSeed: the router is told --hash-seed 1 while the
// pods hash with PYTHONHASHSEED 0. The first verified blocks make it a
// fault that names the flag, degrades the target in /debug/targets and
// /ready, sets the gauge, and voids the target's confirmed runs; requests
// are still answered.
func TestWiringFaultWrongHashSeed(t *testing.T) {
	t.Parallel()
	f := startFleet(t, 1, sim.Faults{})
	cfg := DefaultConfig()
	cfg.Events.HashSeed, cfg.Events.HasHashSeed = "1", true
	cfg.Health = fastHealth(f.Endpoints()...)
	var logs logbuf.Buffer
	r := startRouterLogging(t, cfg, slog.New(slog.NewTextHandler(&logs, nil)), "sim-tiny=bytes")
	waitFor(t, "a fresh pod with block keys", func() bool { return freshCount(r, "sim-tiny") == 1 && r.KeysReady() })
	id := r.mon.Snapshot().ForModel("sim-tiny")[0].ID
	body := `{"model":"sim-tiny","max_tokens":2,"prompt":"` + strings.Repeat("the seed must match. ", 20) + `"}`
	if code, _, b := post(t, "http://"+r.Addr()+"/v1/completions", body); code != 200 {
		t.Fatalf("status %d: %s", code, b)
	}
	waitFor(t, "the fault logged", func() bool {
		return has(&logs, "level=ERROR", "event stream wiring fault", "fault=key_mismatch", "--hash-seed must be the pods' PYTHONHASHSEED")
	})
	tv := debugTargets(t, r)[id.String()]
	if tv.State != "degraded" || tv.Reason != "key_mismatch" || !strings.Contains(tv.Detail, "--hash-seed") || !tv.CanRoute {
		t.Fatalf("/debug/targets: %+v: want degraded by key_mismatch, still routable", tv)
	}
	if tr := r.ev.Trust(id); tr.Confirmed != 0 || tr.Predictions {
		t.Fatalf("trust %+v: want none in the target's cache", tr)
	}
	series := `prefixrouter_target_wiring_fault{fault="key_mismatch",target="` + id.String() + `"}`
	if v := metricValue(t, r, series); v != 1 {
		t.Fatalf("%s = %v, want 1", series, v)
	}
	if code, body := ready(t, r); code != 200 || !strings.Contains(body, "key_mismatch: 1 target(s)") || !strings.Contains(body, "--hash-seed") {
		t.Fatalf("/ready %d %q", code, body)
	}
	if code, _, b := post(t, "http://"+r.Addr()+"/v1/completions", body); code != 200 {
		t.Fatalf("status %d after the fault: %s", code, b)
	}
}

// TestComposedState: a target health finds fine, or degraded only for a
// passing reason, shows its most severe wiring fault as its reason; a
// target health finds down keeps health's reason; health's own wiring
// faults (prefix caching off, a cache-config conflict) come first.
func TestComposedState(t *testing.T) {
	disconnected := eventplane.Freshness{Faults: []eventplane.Fault{{Kind: eventplane.FaultEventsDisconnected, Detail: "nothing answers"}}}
	tests := []struct {
		name       string
		target     health.Target
		fresh      eventplane.Freshness
		wantState  health.State
		wantReason string
		wantFaults []string
	}{
		{"fine", health.Target{State: health.StateRoutable, Reason: health.ReasonOK}, eventplane.Freshness{},
			health.StateRoutable, "ok", nil},
		{"routable with a stream fault", health.Target{State: health.StateRoutable, Reason: health.ReasonOK}, disconnected,
			health.StateDegraded, "events_disconnected", []string{"events_disconnected"}},
		{"stale metrics give way to the fault", health.Target{State: health.StateDegraded, Reason: health.ReasonMetricsStale}, disconnected,
			health.StateDegraded, "events_disconnected", []string{"events_disconnected"}},
		{"down stays down", health.Target{State: health.StateDown, Reason: health.ReasonProbeFailed}, disconnected,
			health.StateDown, "probe_failed", []string{"events_disconnected"}},
		{"health's faults first", health.Target{State: health.StateDegraded, Reason: health.ReasonPrefixCachingOff, ConfigConflict: "block_size 32, expected 16",
			Cache: health.CacheConfig{Known: true, PrefixCaching: "False"}}, disconnected,
			health.StateDegraded, "prefix_caching_disabled", []string{"prefix_caching_disabled", "cache_config_conflict", "events_disconnected"}},
	}
	for _, k := range wiringFaultKinds {
		if faultHints[k] == "" {
			t.Errorf("fault %s has no hint for /ready", k)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			faults := wiringFaults(&tt.target, &tt.fresh)
			var kinds []string
			for _, f := range faults {
				kinds = append(kinds, f.Kind)
				if f.Detail == "" {
					t.Errorf("fault %s without detail", f.Kind)
				}
			}
			if !slices.Equal(kinds, tt.wantFaults) {
				t.Fatalf("faults %v, want %v", kinds, tt.wantFaults)
			}
			st, reason, _ := composedState(&tt.target, faults)
			if st != tt.wantState || reason != tt.wantReason {
				t.Fatalf("state %s/%s, want %s/%s", st, reason, tt.wantState, tt.wantReason)
			}
			for _, k := range kinds {
				if !slices.Contains(wiringFaultKinds, k) {
					t.Errorf("fault %s has no gauge series", k)
				}
			}
		})
	}
}
