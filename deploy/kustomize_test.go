package deploy

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the rendered manifests under testdata/rendered")

// kustomizations are every kustomization under deploy/, each rendered to
// testdata/rendered/NAME.yaml.
var kustomizations = map[string]string{
	"base":     "kustomize/base",
	"vllm":     "kustomize/vllm",
	"per-pod":  "kustomize/overlays/per-pod",
	"central":  "kustomize/overlays/central",
	"replicas": "kustomize/overlays/replicas",
	"rules":    "prometheus",
	"grafana":  "grafana",
}

// objects is one rendered kustomization, decoded.
type objects struct {
	deployments     map[string]*appsv1.Deployment
	services        map[string]*corev1.Service
	pdbs            []*policyv1.PodDisruptionBudget
	networkPolicies []*networkingv1.NetworkPolicy
	serviceMonitors []*monitoringv1.ServiceMonitor
	rules           []*monitoringv1.PrometheusRule
	configMaps      map[string]*corev1.ConfigMap
	accounts        []*corev1.ServiceAccount
}

// built caches each kustomization's rendering for the run (tests only read it).
var built sync.Map // dir -> builtKustomization

type builtKustomization struct {
	out []byte
	o   objects
}

// build renders a kustomization with kustomize's own library and decodes
// every object strictly: a field its API type does not have is an error.
func build(t *testing.T, dir string) ([]byte, objects) {
	t.Helper()
	if b, ok := built.Load(dir); ok {
		return b.(builtKustomization).out, b.(builtKustomization).o
	}
	out, o := buildOnce(t, dir)
	built.Store(dir, builtKustomization{out, o})
	return out, o
}

func buildOnce(t *testing.T, dir string) ([]byte, objects) {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := rm.AsYaml()
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	o := objects{deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{}, configMaps: map[string]*corev1.ConfigMap{}}
	for _, r := range rm.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		kind := r.GetApiVersion() + " " + r.GetKind()
		var into any
		switch kind {
		case "apps/v1 Deployment":
			d := &appsv1.Deployment{}
			o.deployments[r.GetName()], into = d, d
		case "v1 Service":
			s := &corev1.Service{}
			o.services[r.GetName()], into = s, s
		case "v1 ConfigMap":
			c := &corev1.ConfigMap{}
			o.configMaps[r.GetName()], into = c, c
		case "v1 ServiceAccount":
			a := &corev1.ServiceAccount{}
			o.accounts, into = append(o.accounts, a), a
		case "policy/v1 PodDisruptionBudget":
			p := &policyv1.PodDisruptionBudget{}
			o.pdbs, into = append(o.pdbs, p), p
		case "networking.k8s.io/v1 NetworkPolicy":
			n := &networkingv1.NetworkPolicy{}
			o.networkPolicies, into = append(o.networkPolicies, n), n
		case "monitoring.coreos.com/v1 ServiceMonitor":
			s := &monitoringv1.ServiceMonitor{}
			o.serviceMonitors, into = append(o.serviceMonitors, s), s
		case "monitoring.coreos.com/v1 PrometheusRule":
			p := &monitoringv1.PrometheusRule{}
			o.rules, into = append(o.rules, p), p
		default:
			t.Fatalf("%s: %s %s has no decoder here: add its API type", dir, kind, r.GetName())
		}
		if err := yaml.UnmarshalStrict(b, into); err != nil {
			t.Fatalf("%s: %s %s does not decode strictly: %v", dir, kind, r.GetName(), err)
		}
	}
	return out, o
}

// TestKustomizationsRender: every kustomization builds, decodes strictly,
// and renders as testdata/rendered holds it (go test -update rewrites it).
func TestKustomizationsRender(t *testing.T) {
	for name, dir := range kustomizations {
		t.Run(name, func(t *testing.T) {
			out, _ := build(t, dir)
			golden := filepath.Join("testdata", "rendered", name+".yaml")
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, out, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test ./deploy -run TestKustomizationsRender -update writes it)", err)
			}
			if !bytes.Equal(out, want) {
				t.Fatalf("%s renders differently from %s: go test ./deploy -run TestKustomizationsRender -update, and review the diff", dir, golden)
			}
		})
	}
}

// TestRouterDeployment checks what the base promises an operator.
func TestRouterDeployment(t *testing.T) {
	_, o := build(t, kustomizations["base"])
	d := o.deployments["prefixrouter"]
	if d == nil {
		t.Fatal("no prefixrouter Deployment")
	}
	s := d.Spec.Template.Spec
	c := s.Containers[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("replicas %v: want at least 2", d.Spec.Replicas)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/health" {
		t.Errorf("liveness probe %+v: want GET /health", c.LivenessProbe)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/ready" {
		t.Errorf("readiness probe %+v: want GET /ready", c.ReadinessProbe)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want CPU and memory requests and a memory limit", c.Resources)
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container security context %+v: want a read-only root and no privilege escalation", sc)
	}
	if ps := s.SecurityContext; ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser != 65532 {
		t.Errorf("pod security context %+v: want runAsNonRoot as 65532 (the image's user)", ps)
	}
	if s.Affinity == nil || s.Affinity.PodAntiAffinity == nil {
		t.Error("no pod anti-affinity")
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = true
	}
	for _, p := range []string{"/tmp", "/var/cache/prefixrouter"} {
		if !mounts[p] {
			t.Errorf("%s is not mounted: the root filesystem is read-only", p)
		}
	}
	if !slices.Contains(c.Args, "--admin-listen=0.0.0.0:9090") {
		t.Errorf("args %q: the admin listener must listen beyond loopback for Prometheus", c.Args)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 8000 || ports["admin"] != 9090 {
		t.Errorf("ports %v: want http 8000 and admin 9090", ports)
	}
	if len(o.pdbs) != 1 {
		t.Errorf("%d PodDisruptionBudgets, want 1", len(o.pdbs))
	}
	admin := o.services["prefixrouter-admin"]
	if admin == nil || admin.Spec.Type != corev1.ServiceTypeClusterIP || !admin.Spec.PublishNotReadyAddresses {
		t.Errorf("admin Service %+v: want ClusterIP, publishing not-ready replicas", admin)
	}
	if api := o.services["prefixrouter"]; api == nil || len(api.Spec.Ports) != 1 || api.Spec.Ports[0].Port != 8000 {
		t.Errorf("API Service %+v: want port 8000 only", api)
	}
	if len(o.serviceMonitors) != 1 || o.serviceMonitors[0].Spec.Endpoints[0].Port != "admin" {
		t.Fatalf("ServiceMonitor: want one, scraping the admin port")
	}
	sm := o.serviceMonitors[0].Spec.Selector.MatchLabels
	for k, v := range sm {
		if admin.Labels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%s, the admin Service has %q", k, v, admin.Labels[k])
		}
	}
	for k, v := range admin.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("admin Service selects %s=%s, the router's pods have %q", k, v, d.Spec.Template.Labels[k])
		}
	}
}

// monitoringLabel is the namespace label the operator sets where Prometheus
// runs; the NetworkPolicy admits the admin port from those namespaces only
// (docs/operations.md, "The admin port").
const monitoringLabel = "prefixrouter.io/monitoring"

// TestAdminPortOnlyFromMonitoring: in every kustomization with a router,
// the NetworkPolicies that select its pods admit the admin port (metrics,
// /debug, the dry run) only from namespaces labelled monitoringLabel, and
// do admit it from there (the ServiceMonitor's scrapes), while the API
// port stays open to every client.
func TestAdminPortOnlyFromMonitoring(t *testing.T) {
	for _, name := range []string{"base", "per-pod", "central", "replicas"} {
		t.Run(name, func(t *testing.T) {
			_, o := build(t, kustomizations[name])
			d := o.deployments["prefixrouter"]
			if d == nil {
				t.Fatal("no prefixrouter Deployment")
			}
			ports := d.Spec.Template.Spec.Containers[0].Ports
			policies, scraped, api := 0, false, false
			for _, np := range o.networkPolicies {
				if !selects(np.Spec.PodSelector.MatchLabels, d.Spec.Template.Labels) {
					continue
				}
				policies++
				for i, rule := range np.Spec.Ingress {
					if admitsPort(rule.Ports, ports, "http") && len(rule.From) == 0 {
						api = true
					}
					if !admitsPort(rule.Ports, ports, "admin") {
						continue
					}
					if len(rule.From) == 0 {
						t.Errorf("NetworkPolicy %s rule %d admits the admin port from everywhere", np.Name, i)
						continue
					}
					ok := true
					for _, peer := range rule.From {
						if !monitoringOnly(peer) {
							ok = false
							t.Errorf("NetworkPolicy %s rule %d admits the admin port from %+v: want namespaces labelled %s: \"true\" only", np.Name, i, peer, monitoringLabel)
						}
					}
					scraped = scraped || ok
				}
			}
			if policies == 0 {
				t.Fatal("no NetworkPolicy selects the router's pods: the admin port is open to the cluster")
			}
			if !scraped {
				t.Errorf("no NetworkPolicy admits the admin port from the namespaces labelled %s: \"true\": Prometheus cannot scrape", monitoringLabel)
			}
			if !api {
				t.Error("no NetworkPolicy admits the API port from every client")
			}
		})
	}
}

// monitoringOnly reports whether a peer is pods (any, or some) of the
// namespaces labelled monitoringLabel, and nothing wider.
func monitoringOnly(p networkingv1.NetworkPolicyPeer) bool {
	ns := p.NamespaceSelector
	return p.IPBlock == nil && ns != nil && len(ns.MatchExpressions) == 0 && ns.MatchLabels[monitoringLabel] == "true"
}

// admitsPort reports whether a rule's ports include the container port of
// this name (no ports, or a port without a number, is every port).
func admitsPort(rulePorts []networkingv1.NetworkPolicyPort, ports []corev1.ContainerPort, name string) bool {
	if len(rulePorts) == 0 {
		return true
	}
	number := int32(-1)
	for _, cp := range ports {
		if cp.Name == name {
			number = cp.ContainerPort
		}
	}
	for _, p := range rulePorts {
		switch {
		case p.Port == nil:
			return true
		case p.Port.StrVal == name && p.Port.StrVal != "":
			return true
		case p.Port.StrVal == "" && p.Port.IntVal == number:
			return true
		case p.Port.StrVal == "" && p.EndPort != nil && p.Port.IntVal <= number && number <= *p.EndPort:
			return true
		}
	}
	return false
}
