package report

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sampleResults is a small run of three policies, two pods and a ladder.
func sampleResults() *Results {
	recs := func(base float64, pods ...string) []Record {
		var out []Record
		for i := range 40 {
			r := Record{Session: i, Group: i % 4, Stage: i / 20, Sent: float64(i) * 0.5, TTFT: base * float64(1+i%10),
				E2E: base*float64(1+i%10) + 2, PromptTokens: 1000, CachedTokens: 800 - int(base*100)%800, OutputTokens: 100,
				Pod: pods[i%len(pods)], Status: 200}
			if i == 39 {
				r = Record{Session: i, Sent: 19.5, Status: 503, Err: "HTTP 503"}
			}
			out = append(out, r)
		}
		return out
	}
	res := &Results{Workload: map[string]any{"name": "shared-prefix", "groups": 4}, Engine: "live", Seed: 1, TimeScale: 5,
		Fleet: map[string]any{"pods": 2}, Order: []string{"round-robin", "precise", "oracle"}, Policies: map[string]*Policy{},
		Stages: []StageSpan{{Rate: 2, Start: 0, End: 10}, {Rate: 4, Start: 10, End: 20}}}
	res.Policies["round-robin"] = Summarize(recs(1.5, "pod-0", "pod-1"))
	res.Policies["precise"] = Summarize(recs(0.05, "pod-0", "pod-1", "pod-1"))
	res.Policies["oracle"] = Summarize(recs(0.04, "pod-1"))
	return res
}

func TestSummarize(t *testing.T) {
	recs := []Record{
		{Sent: 0, TTFT: 1, E2E: 3, PromptTokens: 100, CachedTokens: 50, OutputTokens: 10, Pod: "pod-0", Status: 200},
		{Sent: 1, TTFT: 2, E2E: 4, PromptTokens: 100, CachedTokens: 0, OutputTokens: 10, Pod: "pod-1", Status: 200},
		{Sent: 2, TTFT: 3, E2E: 3, PromptTokens: 200, CachedTokens: 150, OutputTokens: 20, Pod: "pod-0", Status: 200},
		{Sent: 3, Status: 503, Err: "HTTP 503"},
		{Sent: 3, Status: 0, Err: "stream cut"},
	}
	p := Summarize(recs)
	want := Policy{Requests: 5, Errors: 2, Shed: 1, PromptTokens: 400, CachedTokens: 200, CacheHitRate: 0.5,
		TTFT: Dist{Mean: 2, P50: 2, P90: 3, P99: 3}, E2E: Dist{Mean: 10.0 / 3, P50: 3, P90: 4, P99: 4},
		DurationS: 5, OutputTokensPerS: 8}
	if p.Requests != want.Requests || p.Errors != want.Errors || p.Shed != want.Shed || p.PromptTokens != want.PromptTokens ||
		p.CachedTokens != want.CachedTokens || p.CacheHitRate != want.CacheHitRate || p.TTFT != want.TTFT ||
		math.Abs(p.E2E.Mean-want.E2E.Mean) > 1e-9 || p.E2E.P90 != want.E2E.P90 || p.DurationS != want.DurationS || p.OutputTokensPerS != want.OutputTokensPerS {
		t.Fatalf("summary\n%+v\nwant\n%+v", *p, want)
	}
	if math.Abs(p.PodShare["pod-0"]-2.0/3) > 1e-9 || p.ErrorKinds["HTTP 503"] != 1 || p.ErrorKinds["stream cut"] != 1 {
		t.Fatalf("pod share %v, error kinds %v", p.PodShare, p.ErrorKinds)
	}
	if last := p.TTFTCDF[len(p.TTFTCDF)-1]; last != [2]float64{3, 1} || p.TTFTCDF[0] != [2]float64{1, 1.0 / 3} {
		t.Fatalf("cdf %v", p.TTFTCDF)
	}
}

func TestQuantileIsTheNearestRank(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct{ q, want float64 }{{0.5, 5}, {0.9, 9}, {0.99, 10}, {0, 1}, {1, 10}} {
		if got := quantile(xs, tc.q); got != tc.want {
			t.Errorf("q%v = %v, want %v", tc.q, got, tc.want)
		}
	}
}

func TestTable(t *testing.T) {
	var b bytes.Buffer
	if err := Table(&b, sampleResults()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "policy") || !strings.HasPrefix(lines[3], "oracle") {
		t.Fatalf("table:\n%s", b.String())
	}
	if f := strings.Fields(lines[3]); f[1] != "40" || f[2] != "1" || f[3] != "1" || f[len(f)-2] != "0%" || f[len(f)-1] != "100%" {
		t.Fatalf("oracle row %q", lines[3])
	}
}

func TestSeconds(t *testing.T) {
	for _, tc := range []struct {
		s    float64
		want string
	}{{0, "-"}, {0.0042, "4.2ms"}, {0.54, "540ms"}, {92.61, "92.61s"}, {1234, "1234s"}} {
		if got := Seconds(tc.s); got != tc.want {
			t.Errorf("Seconds(%v) = %q, want %q", tc.s, got, tc.want)
		}
	}
}

// TestHTMLCharts checks the page's structure without a browser: every
// chart names the policies it draws, and each is drawn. The browser test
// (bench/report/browser_test.go) checks that it renders.
func TestHTMLCharts(t *testing.T) {
	res := sampleResults()
	page, err := HTML(res)
	if err != nil {
		t.Fatal(err)
	}
	s := string(page)
	for _, id := range []string{"ttft-cdf", "cache-hit", "throughput", "pod-share", "ttft-over-time"} {
		i := strings.Index(s, `id="`+id+`" data-expect="round-robin,precise,oracle"`)
		if i < 0 {
			t.Fatalf("chart %s missing or without its series", id)
		}
		fig := s[i : i+strings.Index(s[i:], "</figure>")]
		for _, p := range res.Order {
			if !strings.Contains(fig, `data-series="`+p+`"`) {
				t.Fatalf("chart %s does not draw %s", id, p)
			}
		}
	}
	for _, bad := range []string{"<script", "http://", "https://", "src="} {
		if strings.Contains(strings.ReplaceAll(s, `xmlns="http://www.w3.org/2000/svg"`, ""), bad) {
			t.Fatalf("the page holds %q: it must need nothing else", bad)
		}
	}
}

func TestWriteRoundTrips(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	res := sampleResults()
	path, err := res.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Results
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if back.Policies["precise"].TTFT != res.Policies["precise"].TTFT || len(back.Order) != 3 {
		t.Fatalf("results.json does not read back: %+v", back.Policies["precise"])
	}
	var generic map[string]any
	_ = json.Unmarshal(raw, &generic)
	pol := generic["policies"].(map[string]any)["precise"].(map[string]any)
	for _, k := range []string{"requests", "errors", "shed", "ttft_s", "e2e_s", "output_tokens_per_s", "cache_hit_rate", "prompt_tokens", "cached_tokens", "pod_share"} {
		if _, ok := pol[k]; !ok {
			t.Errorf("results.json lacks policies.precise.%s", k)
		}
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
}

func TestSpeculativeSection(t *testing.T) {
	res := sampleResults()
	rate, per, inc, se := 0.9, 640.0, 1200.0, 700.0
	res.Policies["precise"].Speculative = &Speculative{Settled: true,
		Funnel:           SpecFunnel{Inserted: 400, Confirmed: 380, Referenced: 200, Followed: 150, FollowerRoutes: 9, FollowerCachedTokens: 5400},
		Mature:           SpecMature{Inserted: 400, Confirmed: 380, ExpiredStale: 20, BlockRate: &rate},
		Pods:             []SpecPod{{Pod: "pod-0", TTLS: 0.61, TTLWhy: "p99 of 256 latencies", Trust: 0.87, BlockRate: &rate}},
		HoldbackFraction: 0.05, Arms: []SpecArm{{Arm: "speculative", Requests: 38, CachedPerRequest: &per}, {Arm: "holdback", Requests: 2}},
		IncrementalCachedTokens: &inc, IncrementalStdErr: &se, IncrementalGroups: 10,
	}
	page, err := HTML(res)
	if err != nil {
		t.Fatal(err)
	}
	s := string(page)
	for _, want := range []string{`id="speculative-funnel" data-expect="inserted,confirmed,referenced,followed"`,
		`id="speculative-holdback" data-expect="speculative,holdback"`, `<h2>Speculative routing: precise</h2>`,
		"<td>pod-0</td><td>610ms</td><td>0.87</td><td>90%</td>", "1200 ± 700 cached tokens (within 2.26 standard errors of none, the 95% bound for 10 groups: no difference shown) over the speculative arm", "20 expired stale"} {
		if !strings.Contains(s, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	res.Policies["precise"].Speculative = nil
	page, _ = HTML(res)
	if strings.Contains(string(page), "speculative-funnel") || strings.Contains(string(page), "Speculative routing") {
		t.Fatal("a run without the speculative policy shows its section")
	}
}

func TestHolderOf(t *testing.T) {
	recs := []Record{
		{Group: 0, Sent: 0, Pod: "pod-1"}, {Group: 0, Sent: 1, Pod: "pod-1"}, {Group: 0, Sent: 2, Pod: "pod-0"},
		{Group: 1, Sent: 5, Pod: "pod-2"}, {Group: 1, Sent: 3, Err: "HTTP 500"}, {Group: 1, Sent: 6, Pod: "pod-2"},
		{Group: -1, Sent: 1, Pod: "pod-0"},
	}
	if h := HolderOf(recs); h == nil || *h != (Holder{Followers: 3, OnHolder: 2}) {
		t.Fatalf("holder %+v, want 2 of 3 (a failed first request holds nothing)", h)
	}
	if HolderOf([]Record{{Group: -1}}) != nil {
		t.Fatal("holder counted without groups")
	}
}

func samplePairs() []Pair {
	var out []Pair
	for i, b := range []string{BasisNone, BasisPrediction, BasisConfirmed, BasisConfirmed} {
		out = append(out, Pair{Condition: "none", Gap: []string{"below-p50", "near-p95", "near-ttl", "beyond-ttl"}[i], GapS: 0.3 * float64(i+1),
			FirstPod: "pod-0", Pod: "pod-0", SamePod: b != BasisNone, Basis: b, CachedTokens: 2000})
	}
	out = append(out, Pair{Condition: "restart", Gap: "below-p50", GapS: 0.3, FirstPod: "pod-1", Pod: "pod-2", Basis: BasisNone, FirstErr: "no answer"})
	return out
}

func TestPairsTableAndChart(t *testing.T) {
	res := sampleResults()
	res.Policies["precise"].Pairs = samplePairs()
	spec := samplePairs()
	for i := range spec {
		spec[i].Spec = &PairSpec{EndedUnconfirmed: int64(i)}
	}
	res.Policies["round-robin"].Pairs = spec
	var b bytes.Buffer
	if err := PairsTable(&b, res); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 6 || !strings.Contains(lines[0], "round-robin: first") || !strings.Contains(lines[0], "unconfirmed") {
		t.Fatalf("table:\n%s", b.String())
	}
	if f := strings.Fields(lines[5]); strings.Join(f, " ") != "restart below-p50 (300ms) no answer none no 0 4 0 no answer none no 0" {
		t.Fatalf("restart row %q", lines[5])
	}
	page, err := HTML(res)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), `id="paired-gap" data-expect="round-robin,precise"`) {
		t.Fatal("the page lacks the paired-gap chart of both policies")
	}
}

func TestSummarizeByStage(t *testing.T) {
	recs := []Record{
		{Stage: 0, TTFT: 1, OutputTokens: 10},
		{Stage: 0, TTFT: 3, OutputTokens: 10},
		{Stage: 1, TTFT: 5, OutputTokens: 7},
		{Stage: 1, Err: "no answer"},
		{Stage: -1, TTFT: 9, OutputTokens: 1},
	}
	got := Summarize(recs).TTFTByStage
	if len(got) != 2 {
		t.Fatalf("%d stages, want 2: %+v", len(got), got)
	}
	if got[0].Answered != 2 || got[0].Output != 20 || got[0].TTFT.P90 != 3 || got[0].TTFT.Mean != 2 {
		t.Errorf("stage 0: %+v", got[0])
	}
	if got[1].Answered != 1 || got[1].Output != 7 || got[1].TTFT.P90 != 5 {
		t.Errorf("stage 1 (a failed request left out): %+v", got[1])
	}
	if Summarize([]Record{{Stage: -1, TTFT: 1}}).TTFTByStage != nil {
		t.Error("stages summarized without a ladder")
	}
}

func TestIncrementalText(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		inc, se *float64
		groups  int
		want    string
	}{
		{nil, nil, 0, ""},
		{f(500), nil, 1, "500 cached tokens (an arm too small for a standard error)"},
		{f(-68968), f(20000), 6, "-68968 ± 20000 cached tokens (beyond 2.57 standard errors, the 95% bound for 6 groups)"},
		{f(-68968), f(30000), 6, "-68968 ± 30000 cached tokens (within 2.57 standard errors of none, the 95% bound for 6 groups: no difference shown)"},
		{f(239904), f(40000), 40, "239904 ± 40000 cached tokens (beyond 2.00 standard errors, the 95% bound for 40 groups)"},
		{f(239904), f(40000), 2, "239904 ± 40000 cached tokens (within 12.71 standard errors of none, the 95% bound for 2 groups: no difference shown)"},
	} {
		s := Speculative{IncrementalCachedTokens: tc.inc, IncrementalStdErr: tc.se, IncrementalGroups: tc.groups}
		if got := s.IncrementalText(); got != tc.want {
			t.Errorf("IncrementalText() = %q, want %q", got, tc.want)
		}
	}
}
