package deploy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/peers"
	"github.com/prefixrouter/prefixrouter/router"
	"github.com/prefixrouter/prefixrouter/sim"
	"github.com/prefixrouter/prefixrouter/tokenize"
)

// exported is what a router's registry exports: every family's labels, and
// which families are histograms.
type exported struct {
	labels     map[string][]string
	histograms map[string]bool
}

// liveRegistry starts simulated pods (events held back 300 ms, so
// predictions live and get confirmed) and a router with the speculative
// policy in front, sends requests sharing a prefix, then reads the
// router's registry: the families gathered and every registered
// descriptor (series that have not happened yet, like retries, are
// registered all the same).
func liveRegistry(t *testing.T) exported {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	prof, err := sim.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := sim.StartFleet(context.Background(), sim.Config{Pods: 2, Profile: prof, Logger: quiet,
		Faults: sim.Faults{EventDelay: 300 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })

	cfg := router.DefaultConfig()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Policy = brain.PolicySpeculative
	cfg.Events.HashSeed, cfg.Events.HasHashSeed = "0", true
	cfg.Health.Endpoints = fleet.Endpoints()
	cfg.Health.ProbeInterval, cfg.Health.ProbeTimeout = 150*time.Millisecond, 150*time.Millisecond
	cfg.Health.ModelsInterval, cfg.Health.SuccessThreshold = 300*time.Millisecond, 1
	cfg.Health.ScrapeInterval, cfg.Health.ScrapeTimeout = 150*time.Millisecond, 150*time.Millisecond
	cfg.Health.EvalInterval = 50 * time.Millisecond
	cfg.Speculative.Holdback = 0.5 // both arms see traffic
	cfg.Speculative.MaxStale = time.Second
	// Sharing with peer replicas (overlays/replicas): this replica and one
	// nobody runs yet are listed, so the peer series exist.
	var peerAddrs []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		peerAddrs = append(peerAddrs, "tcp://"+ln.Addr().String())
		ln.Close()
	}
	cfg.Peers.Listen, cfg.Peers.Peers = peerAddrs[0], peerAddrs
	key, err := peers.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Peers.KeyFile = filepath.Join(t.TempDir(), "peer.key")
	if err := os.WriteFile(cfg.Peers.KeyFile, key.Format(), 0o600); err != nil {
		t.Fatal(err)
	}
	// As serve wires it: the tokenizers' metrics on the router's registry.
	reg := prometheus.NewRegistry()
	toks := tokenize.NewRegistry(tokenize.Options{Registerer: reg, Logger: quiet, HTTPClient: &http.Client{}})
	if _, err := toks.AddSpec("sim-tiny" + "=bytes"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(toks.Close)
	r, err := router.New(cfg, router.Deps{Registry: reg, Tokenizers: toks, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = r.Shutdown(sctx)
		cancel()
	})
	deadline := time.Now().Add(20 * time.Second)
	for !r.KeysReady() || !r.Monitor().Snapshot().Routable() {
		if time.Now().After(deadline) {
			t.Fatal("router never had routable targets with block keys")
		}
		time.Sleep(20 * time.Millisecond)
	}
	prefix := strings.Repeat("One long shared context for every request here. ", 20)
	for i := range 8 {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"user":"u%d","prompt":%q}`, "sim-tiny", i, prefix+fmt.Sprintf(" Task %d.", i))
		resp, err := http.Post("http://"+r.Addr()+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
	}
	// An unknown model: a rejected request.
	resp, err := http.Post("http://"+r.Addr()+"/v1/completions", "application/json", strings.NewReader(`{"model":"nope","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	ex := exported{labels: map[string][]string{}, histograms: map[string]bool{}}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		var ls []string
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(ls, l.GetName()) {
					ls = append(ls, l.GetName())
				}
			}
		}
		ex.labels[f.GetName()] = ls
		ex.histograms[f.GetName()] = f.GetType() == dto.MetricType_HISTOGRAM
	}
	descs := make(chan *prometheus.Desc)
	go func() { reg.Describe(descs); close(descs) }()
	descRE := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	for d := range descs {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("descriptor %s: unexpected form", d)
		}
		if _, ok := ex.labels[m[1]]; !ok {
			ex.labels[m[1]] = strings.FieldsFunc(m[2], func(r rune) bool { return r == ',' })
		}
	}
	return ex
}

var (
	metricRE  = regexp.MustCompile(`\b(prefixrouter_[a-z0-9_]+)(\{[^}]*\})?`)
	matcherRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	byRE      = regexp.MustCompile(`\b(?:by|on|without|ignoring)\s*\(([^)]*)\)`)
)

// scrapeLabels are added by Prometheus (the ServiceMonitor's target
// labels) or by histograms, not by the router.
var scrapeLabels = []string{"namespace", "pod", "job", "instance", "service", "container", "endpoint", "le"}

// TestMetricsExist: every metric the alerting rules and the dashboard
// name is one a live router exports, with the labels they select and
// group by.
func TestMetricsExist(t *testing.T) {
	ex := liveRegistry(t)
	var exprs []string
	for _, g := range loadRules(t).Spec.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr.String())
		}
	}
	exprs = append(exprs, dashboardExprs(t)...)
	named := map[string]bool{}
	for _, e := range exprs {
		var labels []string
		for _, m := range metricRE.FindAllStringSubmatch(e, -1) {
			name := m[1]
			if base, ok := strings.CutSuffix(name, "_bucket"); ok && ex.histograms[base] {
				name = base
			} else if base, ok := strings.CutSuffix(name, "_count"); ok && ex.histograms[base] {
				name = base
			} else if base, ok := strings.CutSuffix(name, "_sum"); ok && ex.histograms[base] {
				name = base
			}
			own, ok := ex.labels[name]
			if !ok {
				t.Errorf("%s is not exported by the router (in %s)", m[1], e)
				continue
			}
			named[name] = true
			labels = append(labels, own...)
			for _, mm := range matcherRE.FindAllStringSubmatch(m[2], -1) {
				if !slices.Contains(own, mm[1]) && !slices.Contains(scrapeLabels, mm[1]) {
					t.Errorf("%s has no label %s (in %s)", name, mm[1], e)
				}
			}
		}
		for _, b := range byRE.FindAllStringSubmatch(e, -1) {
			for _, l := range strings.Split(b[1], ",") {
				l = strings.TrimSpace(l)
				if l != "" && !slices.Contains(labels, l) && !slices.Contains(scrapeLabels, l) {
					t.Errorf("no metric of %q has the label %s", e, l)
				}
			}
		}
	}
	t.Logf("%d metrics named by the rules and the dashboard, all exported", len(named))
}
