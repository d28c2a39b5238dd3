package router

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
)

// A wiring fault is a mistake in how the router and a pod were set up that
// an operator must fix: a flag or a vLLM setting. Health finds those in the
// pod's cache configuration (a conflict with its peers or the flags,
// prefix caching off); the event plane finds those on its KV-event stream
// (disconnected while the pod serves, keys that disagree, unchained
// blocks, block keys unknown). Each owner logs its own. The router composes
// both here into the target's state in GET /debug/targets, the
// prefixrouter_target_wiring_fault gauge and the body of /ready.

// wiringFault is one wiring fault of a target.
type wiringFault struct {
	Kind string `json:"fault"`
	// Detail names what to check; it may carry internal addresses, so it
	// goes to the admin listener only.
	Detail string    `json:"detail"`
	Since  time.Time `json:"since,omitzero"`
}

// Wiring faults health reports, named as its reasons.
const (
	faultPrefixCachingOff = string(health.ReasonPrefixCachingOff)
	faultConfigConflict   = string(health.ReasonConfigConflict)
)

// wiringFaultKinds are the fault label's values, most severe first: health's
// (the pod's own configuration) before the event plane's (its stream).
var wiringFaultKinds = func() []string {
	out := []string{faultPrefixCachingOff, faultConfigConflict}
	for _, k := range eventplane.FaultKinds {
		out = append(out, string(k))
	}
	return out
}()

// faultHints say in a line, without addresses, what each fault means and
// where to look: the public /ready names faults with them.
var faultHints = map[string]string{
	faultPrefixCachingOff:                      "prefix caching is off on the pod: start vLLM with --enable-prefix-caching",
	faultConfigConflict:                        "the pod's block size or hash algorithm disagrees with its peers or --block-size/--hash-algo",
	string(eventplane.FaultNoBlockKeys):        "block keys unknown: the pods report no vllm:cache_config_info; set --block-size (and --hash-algo with --hash-seed)",
	string(eventplane.FaultEventsDisconnected): "no KV-event stream from a serving pod: check vLLM's --kv-events-config and events= in --endpoint (or, on a bus, the pod's topic)",
	string(eventplane.FaultKeyMismatch):        "block keys disagree with the pod's: check --hash-seed (PYTHONHASHSEED), --hash-algo and --block-size",
	string(eventplane.FaultUnchained):          "stored blocks arrive without their parents: set replay= in --endpoint, or --hash-seed for exact keys",
	string(eventplane.FaultEventsRefused):      "KV-event batches refused (not from the pod's address or connection, a second topic, or past the --events-max-* bounds): see the fault's detail in /debug/targets",
}

// wiringFaults lists t's wiring faults, most severe first: health's from
// its snapshot, the event plane's from f.
func wiringFaults(t *health.Target, f *eventplane.Freshness) []wiringFault {
	var out []wiringFault
	if t.Cache.PrefixCachingDisabled() {
		out = append(out, wiringFault{Kind: faultPrefixCachingOff, Detail: fmt.Sprintf(
			"the pod reports enable_prefix_caching=%s in vllm:cache_config_info: no KV events, no cache hits; start vLLM with --enable-prefix-caching", t.Cache.PrefixCaching)})
	}
	if t.ConfigConflict != "" {
		out = append(out, wiringFault{Kind: faultConfigConflict, Detail: t.ConfigConflict})
	}
	for _, x := range f.Faults {
		out = append(out, wiringFault{Kind: string(x.Kind), Detail: x.Detail, Since: x.Since})
	}
	return out
}

// composedState is t's state as the router sees it: health's, except that
// a target health finds fine, or degraded only for a passing reason (stale
// metrics, a half-open breaker), is degraded by its most severe wiring
// fault, which its reason then names.
func composedState(t *health.Target, faults []wiringFault) (health.State, string, string) {
	if len(faults) > 0 {
		switch t.Reason {
		case health.ReasonOK, health.ReasonMetricsStale, health.ReasonCircuitHalf:
			return health.StateDegraded, faults[0].Kind, faults[0].Detail
		}
	}
	return t.State, string(t.Reason), t.Detail
}

// readyBody is the body of a 200 /ready: "ready", then, when some targets
// are degraded or down, how many and why by fault or reason, without
// addresses (the API listener is public; GET /debug/targets on the admin
// listener names them). Its size is bounded by the number of reasons.
func (r *Router) readyBody(snap *health.Snapshot) string {
	why := map[string]int{}
	total, bad := 0, 0
	for _, t := range snap.Targets {
		if t.State == health.StateDraining {
			continue
		}
		total++
		f := r.ev.Freshness(t.ID)
		faults := wiringFaults(t, &f)
		st, reason, _ := composedState(t, faults)
		if st == health.StateRoutable && len(faults) == 0 {
			continue
		}
		bad++
		seen := map[string]bool{}
		for _, x := range faults {
			seen[x.Kind] = true
		}
		if _, wiring := faultHints[reason]; !wiring {
			seen[reason] = true
		}
		for k := range seen {
			why[k]++
		}
	}
	var b strings.Builder
	b.WriteString("ready\n")
	if bad == 0 {
		return b.String()
	}
	fmt.Fprintf(&b, "degraded or down: %d of %d targets (GET /debug/targets on the admin listener names them)\n", bad, total)
	for _, k := range slices.Sorted(maps.Keys(why)) {
		fmt.Fprintf(&b, "%s: %d target(s)", k, why[k])
		if h := faultHints[k]; h != "" {
			b.WriteString(": " + h)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// wiringCollector produces prefixrouter_target_wiring_fault at scrape time
// from the health snapshot and the event plane's verdicts: one series per
// target and fault kind, 0 or 1, so that an alert sees every target from
// the start and a removed target's series vanish with it.
type wiringCollector struct{ r *Router }

var descWiringFault = prometheus.NewDesc("prefixrouter_target_wiring_fault",
	"1 while the target has this wiring fault (a flag or vLLM setting to fix; GET /debug/targets says which), else 0.",
	[]string{"target", "fault"}, nil)

// Describe implements prometheus.Collector.
func (c wiringCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descWiringFault }

// Collect implements prometheus.Collector.
func (c wiringCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.r.mon.Snapshot()
	if snap == nil {
		return
	}
	for _, t := range snap.Targets {
		f := c.r.ev.Freshness(t.ID)
		faults := wiringFaults(t, &f)
		for _, k := range wiringFaultKinds {
			v := 0.0
			if slices.ContainsFunc(faults, func(x wiringFault) bool { return x.Kind == k }) {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descWiringFault, prometheus.GaugeValue, v, t.Name, k)
		}
	}
}
