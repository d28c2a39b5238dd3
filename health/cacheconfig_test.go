package health

import (
	"strings"
	"testing"
)

// TestCacheConfigDisagreement: pods of one model must agree on block size
// and hash algorithm, with each other (strict majority) and with the flags.
func TestCacheConfigDisagreement(t *testing.T) {
	type pod struct {
		block int
		algo  string
		model string
	}
	tests := []struct {
		name         string
		pods         []pod
		flagBlock    int
		flagAlgo     string
		wantConflict []bool // per pod
		wantBlock    int    // model "m" agreed block size (0: none)
		wantAgreed   bool
	}{
		{name: "all agree", pods: []pod{{16, "sha256", "m"}, {16, "sha256", "m"}}, wantConflict: []bool{false, false}, wantBlock: 16, wantAgreed: true},
		{name: "minority block size", pods: []pod{{16, "sha256", "m"}, {16, "sha256", "m"}, {32, "sha256", "m"}}, wantConflict: []bool{false, false, true}, wantBlock: 16},
		{name: "minority hash algo", pods: []pod{{16, "xxhash", "m"}, {16, "sha256", "m"}, {16, "sha256", "m"}}, wantConflict: []bool{true, false, false}, wantBlock: 16},
		{name: "no majority: all in conflict", pods: []pod{{16, "sha256", "m"}, {32, "sha256", "m"}}, wantConflict: []bool{true, true}},
		{name: "flag decides", pods: []pod{{16, "sha256", "m"}, {16, "sha256", "m"}, {32, "sha256", "m"}}, flagBlock: 32, wantConflict: []bool{true, true, false}, wantBlock: 32},
		{name: "flag algo", pods: []pod{{16, "sha256", "m"}}, flagAlgo: "sha256_cbor", wantConflict: []bool{true}, wantBlock: 16},
		{name: "different models may differ", pods: []pod{{16, "sha256", "m"}, {32, "xxhash", "other"}}, wantConflict: []bool{false, false}, wantBlock: 16, wantAgreed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var specs []string
			var pods []*fakePod
			for _, p := range tt.pods {
				fp := newFakePod(t, p.model)
				fp.setLoad(0, 0, 0, p.block, p.algo)
				pods = append(pods, fp)
				specs = append(specs, fp.spec(""))
			}
			env := newTestMonitor(t, Config{Endpoints: specs, BlockSize: tt.flagBlock, HashAlgo: tt.flagAlgo}, Deps{})
			env.tick()
			for i, fp := range pods {
				tg := env.target(t, fp.id(0))
				if got := tg.ConfigConflict != ""; got != tt.wantConflict[i] {
					t.Fatalf("pod %d: conflict %q, want %v", i, tg.ConfigConflict, tt.wantConflict[i])
				}
				if tt.wantConflict[i] {
					if tg.State != StateDegraded || tg.Reason != ReasonConfigConflict || !tg.CanRoute() {
						t.Fatalf("pod %d: %s/%s", i, tg.State, tg.Reason)
					}
				} else if tg.State != StateRoutable {
					t.Fatalf("pod %d: %s/%s %s", i, tg.State, tg.Reason, tg.Detail)
				}
				want := 0.0
				if tt.wantConflict[i] {
					want = 1
				}
				v, ok := env.gauge(t, "prefixrouter_health_cache_config_conflict", map[string]string{"target": fp.name(0), "model": tt.pods[i].model})
				if !ok || v != want {
					t.Fatalf("pod %d: conflict metric %v (present %v), want %v", i, v, ok, want)
				}
				if tg.Cache.BlockSize != tt.pods[i].block || tg.Cache.HashAlgo != tt.pods[i].algo || tg.Cache.NumGPUBlocks != 19207 {
					t.Fatalf("pod %d: cache config %+v", i, tg.Cache)
				}
			}
			mc := env.m.Snapshot().Models["m"]
			if mc.BlockSize != tt.wantBlock || mc.Agreed != tt.wantAgreed {
				t.Fatalf("model config %+v", mc)
			}
			if !mc.Agreed && len(mc.Conflicts) == 0 {
				t.Fatal("disagreement without conflict text")
			}
			byName := map[string]TargetView{}
			for _, tv := range env.m.Debug().Targets {
				byName[tv.Target] = tv
			}
			for i, fp := range pods {
				if tv := byName[fp.name(0)]; (tv.Conflict != "") != tt.wantConflict[i] {
					t.Fatalf("debug view conflict for %s: %q", tv.Target, tv.Conflict)
				}
			}
		})
	}
}

// TestCacheConfigHealsWhenPodChanges: a conflict disappears once the pod is
// reconfigured.
func TestCacheConfigHeals(t *testing.T) {
	a, b := newFakePod(t, "m"), newFakePod(t, "m")
	b.setLoad(0, 0, 0, 32, "sha256")
	env := newTestMonitor(t, Config{Endpoints: []string{a.spec(""), b.spec("")}, BlockSize: 16}, Deps{})
	env.tick()
	if c := env.target(t, b.id(0)).ConfigConflict; !strings.Contains(c, "block_size 32") || !strings.Contains(c, "--block-size") {
		t.Fatalf("conflict %q", c)
	}
	b.setLoad(0, 0, 0, 16, "sha256")
	env.tick()
	if tg := env.target(t, b.id(0)); tg.ConfigConflict != "" || tg.State != StateRoutable {
		t.Fatalf("after fixing: %q %s", tg.ConfigConflict, tg.State)
	}
}

// TestPrefixCachingDisabled: a pod running without prefix caching publishes
// no KV events and gives no hits. It stays routable but degraded with its
// own reason, which shows in the debug view and the metrics; it heals when
// the pod is restarted with caching on. (That its event stream is not
// trusted meanwhile is the event plane's verdict, fed from Cache.)
func TestPrefixCachingDisabled(t *testing.T) {
	withFlag := func(value string) string {
		exp := vllmExposition(map[int][3]float64{0: {0, 0, 0}}, 16, "sha256")
		if value == "-" { // label absent
			return strings.ReplaceAll(exp, `enable_prefix_caching="True",`, "")
		}
		return strings.ReplaceAll(exp, `enable_prefix_caching="True"`, `enable_prefix_caching="`+value+`"`)
	}
	tests := []struct {
		value    string
		disabled bool
	}{
		{value: "True"},
		{value: "False", disabled: true},
		{value: "false", disabled: true},
		{value: "-"},
		{value: "None"},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			pod := newFakePod(t, "m")
			pod.setMetrics(withFlag(tt.value))
			env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}}, Deps{})
			env.tick()
			tg := env.target(t, pod.id(0))
			wantState, wantReason, wantGauge := StateRoutable, ReasonOK, 0.0
			if tt.disabled {
				wantState, wantReason, wantGauge = StateDegraded, ReasonPrefixCachingOff, 1
			}
			if tg.State != wantState || tg.Reason != wantReason || !tg.CanRoute() {
				t.Fatalf("state %s/%s (%s), can route %v; want %s/%s, routable", tg.State, tg.Reason, tg.Detail, tg.CanRoute(), wantState, wantReason)
			}
			if tg.Cache.PrefixCachingDisabled() != tt.disabled {
				t.Fatalf("cache config %+v: disabled %v, want %v", tg.Cache, tg.Cache.PrefixCachingDisabled(), tt.disabled)
			}
			if tt.disabled && !strings.Contains(tg.Detail, "--enable-prefix-caching") {
				t.Fatalf("detail does not say why: %q", tg.Detail)
			}
			if v, ok := env.gauge(t, "prefixrouter_health_prefix_caching_disabled", map[string]string{"target": pod.name(0)}); !ok || v != wantGauge {
				t.Fatalf("prefix_caching_disabled gauge %v (present %v), want %v", v, ok, wantGauge)
			}
			if v, ok := env.gauge(t, "prefixrouter_health_target_state", map[string]string{"target": pod.name(0), "state": string(wantState), "reason": string(wantReason)}); !ok || v != 1 {
				t.Fatalf("target_state %s/%s missing", wantState, wantReason)
			}
			if tv := env.m.Debug().Targets[0]; tv.PrefixCachingDisabled != tt.disabled || tv.Reason != wantReason {
				t.Fatalf("debug view: prefix_caching_disabled %v, reason %s", tv.PrefixCachingDisabled, tv.Reason)
			}
			if !tt.disabled {
				return
			}
			pod.setMetrics(withFlag("True"))
			env.tick()
			if tg := env.target(t, pod.id(0)); tg.State != StateRoutable || tg.Cache.PrefixCachingDisabled() {
				t.Fatalf("after enabling: %s/%s, cache config %+v", tg.State, tg.Reason, tg.Cache)
			}
		})
	}

	// Disabled caching outranks a block-size conflict (without a cache, the
	// block size decides nothing); the conflict is still reported.
	a, b := newFakePod(t, "m"), newFakePod(t, "m")
	b.setMetrics(strings.ReplaceAll(vllmExposition(map[int][3]float64{0: {0, 0, 0}}, 32, "sha256"), `"True"`, `"False"`))
	env := newTestMonitor(t, Config{Endpoints: []string{a.spec(""), b.spec("")}, BlockSize: 16}, Deps{})
	env.tick()
	if tg := env.target(t, b.id(0)); tg.Reason != ReasonPrefixCachingOff || tg.ConfigConflict == "" {
		t.Fatalf("both problems: reason %s, conflict %q", tg.Reason, tg.ConfigConflict)
	}
}
