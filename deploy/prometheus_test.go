package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// loadRules decodes deploy/prometheus/rules.yaml strictly.
func loadRules(t *testing.T) *monitoringv1.PrometheusRule {
	t.Helper()
	b, err := os.ReadFile("prometheus/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pr monitoringv1.PrometheusRule
	if err := yaml.UnmarshalStrict(b, &pr); err != nil {
		t.Fatalf("rules.yaml: %v", err)
	}
	return &pr
}

// promtool runs Debian's promtool (scripts/ensure-deps.sh installs it).
func promtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Fatal("promtool is not installed: make deps (Debian's prometheus package) installs it")
	}
	cmd := exec.Command("promtool", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// writeSpec writes the rule groups as a Prometheus rule file.
func writeSpec(t *testing.T, path string, spec monitoringv1.PrometheusRuleSpec) {
	t.Helper()
	b, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestAlertingRules: promtool checks the rules (templates included) and
// runs rules_test.yaml; every alert has a unit test, a summary, a
// description and a runbook that docs/operations.md has.
func TestAlertingRules(t *testing.T) {
	pr := loadRules(t)
	dir := t.TempDir()
	writeSpec(t, filepath.Join(dir, "rules.yaml"), pr.Spec)
	promtool(t, dir, "check", "rules", "rules.yaml")

	stripped := *pr.Spec.DeepCopy()
	for g := range stripped.Groups {
		for r := range stripped.Groups[g].Rules {
			stripped.Groups[g].Rules[r].Annotations = nil
		}
	}
	writeSpec(t, filepath.Join(dir, "rules.promtool.yaml"), stripped)
	tests, err := os.ReadFile("prometheus/rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, dir, "test", "rules", "rules_test.yaml")

	var unit struct {
		Tests []struct {
			Name       string `json:"name"`
			AlertTests []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(tests, &unit); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range unit.Tests {
		for _, a := range tc.AlertTests {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	docs, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := headingAnchors(string(docs))
	n := 0
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("%s: rules_test.yaml must show it firing and not firing", r.Alert)
			}
			for _, k := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[k] == "" {
					t.Errorf("%s: no %s", r.Alert, k)
				}
			}
			_, anchor, _ := strings.Cut(r.Annotations["runbook_url"], "docs/operations.md#")
			if !anchors[anchor] {
				t.Errorf("%s: runbook %q is not a heading of docs/operations.md", r.Alert, r.Annotations["runbook_url"])
			}
			if r.Labels["severity"] == "" {
				t.Errorf("%s: no severity", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alerts in rules.yaml")
	}
}

// headingAnchors are the GitHub anchors of a Markdown file's headings.
func headingAnchors(md string) map[string]bool {
	drop := regexp.MustCompile("[^a-z0-9 _-]")
	out := map[string]bool{}
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		out[strings.ReplaceAll(drop.ReplaceAllString(h, ""), " ", "-")] = true
	}
	return out
}

// dashboardExprs are the PromQL expressions of the dashboard's panels.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("grafana/prefixrouter.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := yaml.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	return out
}

// grafanaVars are the dashboard's variables and what promtool sees instead.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$namespace", ".*", "$pod", ".*")

// TestDashboardQueriesParse: promtool parses every panel's query (as a
// recording rule, Grafana's variables replaced).
func TestDashboardQueriesParse(t *testing.T) {
	exprs := dashboardExprs(t)
	if len(exprs) < 20 {
		t.Fatalf("%d queries in the dashboard", len(exprs))
	}
	var spec monitoringv1.PrometheusRuleSpec
	g := monitoringv1.RuleGroup{Name: "dashboard"}
	for i, e := range exprs {
		g.Rules = append(g.Rules, monitoringv1.Rule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: intstr.FromString(grafanaVars.Replace(e))})
	}
	spec.Groups = append(spec.Groups, g)
	dir := t.TempDir()
	writeSpec(t, filepath.Join(dir, "dashboard.yaml"), spec)
	promtool(t, dir, "check", "rules", "dashboard.yaml")
}
