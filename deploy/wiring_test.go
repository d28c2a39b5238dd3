package deploy

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/peers"
)

// fleet is an overlay's router and example vLLM pods, as the wiring tests
// read them.
type fleet struct {
	o          objects
	router     *appsv1.Deployment
	routerArgs []string
	vllm       *appsv1.Deployment
	vc         corev1.Container
	kv         kvEventsConfig
}

// kvEventsConfig is vLLM's --kv-events-config, the fields the router
// depends on (others are refused: the test would not know them).
type kvEventsConfig struct {
	Enable    bool   `json:"enable_kv_cache_events"`
	Publisher string `json:"publisher"`
	Endpoint  string `json:"endpoint"`
	Replay    string `json:"replay_endpoint"`
	Topic     string `json:"topic"`
}

func loadFleet(t *testing.T, overlay string) fleet {
	t.Helper()
	_, o := build(t, kustomizations[overlay])
	f := fleet{o: o, router: o.deployments["prefixrouter"], vllm: o.deployments["vllm"]}
	if f.router == nil || f.vllm == nil {
		t.Fatal("want the prefixrouter and vllm Deployments")
	}
	f.routerArgs = f.router.Spec.Template.Spec.Containers[0].Args
	f.vc = f.vllm.Spec.Template.Spec.Containers[0]
	config, ok := argValue(f.vc.Args, "--kv-events-config")
	if !ok {
		t.Fatalf("vLLM args %q: no --kv-events-config", f.vc.Args)
	}
	if err := yaml.UnmarshalStrict([]byte(config), &f.kv); err != nil {
		t.Fatalf("--kv-events-config %q: %v", config, err)
	}
	if !f.kv.Enable || f.kv.Publisher != "zmq" || f.kv.Topic == "" {
		t.Errorf("--kv-events-config %+v: want events on, zmq, a topic", f.kv)
	}
	return f
}

// argValue is the value of the last --name=VALUE in args.
func argValue(args []string, name string) (string, bool) {
	v, ok := "", false
	for _, a := range args {
		if s, found := strings.CutPrefix(a, name+"="); found {
			v, ok = s, true
		}
	}
	return v, ok
}

// routerFlag is the router's --name, which the overlay must set.
func (f fleet) routerFlag(t *testing.T, name string) string {
	t.Helper()
	v, ok := argValue(f.routerArgs, name)
	if !ok {
		t.Errorf("router args %q: no %s", f.routerArgs, name)
	}
	return v
}

// dataParallel is the pods' --data-parallel-size (1 without it).
func (f fleet) dataParallel(t *testing.T) int {
	t.Helper()
	v, ok := argValue(f.vc.Args, "--data-parallel-size")
	if !ok {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("vLLM --data-parallel-size=%q: want a positive number", v)
	}
	return n
}

// hasContainerPort reports whether the container declares port.
func hasContainerPort(c corev1.Container, port int) bool {
	return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return int(p.ContainerPort) == port })
}

// servicePortReaches reports whether the Service exposes port and sends it
// to that same port of the container (by number or by its name there).
func servicePortReaches(s *corev1.Service, c corev1.Container, port int) bool {
	for _, sp := range s.Spec.Ports {
		if int(sp.Port) != port {
			continue
		}
		target := sp.TargetPort
		if target.Type == intstr.String {
			for _, cp := range c.Ports {
				if cp.Name == target.StrVal {
					return int(cp.ContainerPort) == port
				}
			}
			return false
		}
		return target.IntValue() == port || (target.IntValue() == 0 && hasContainerPort(c, port))
	}
	return false
}

// selects reports whether a selector matches a pod template's labels.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

// tcpPort reads the port of tcp://HOST:PORT (HOST may be *).
func tcpPort(t *testing.T, what, addr string) (string, int) {
	t.Helper()
	host, port, err := kvindex.ParseListenAddr(addr)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return host, port
}

// headlessDiscovery checks the router's --discover-dns against the vLLM
// pods: a headless Service of that name selecting them, on the port vLLM
// serves HTTP, with the pods' data-parallel size.
func (f fleet) headlessDiscovery(t *testing.T) health.DNSSpec {
	t.Helper()
	d, err := health.ParseDNSSpec(f.routerFlag(t, "--discover-dns"))
	if err != nil {
		t.Fatal(err)
	}
	svc := f.o.services[d.Name]
	if svc == nil || svc.Spec.ClusterIP != corev1.ClusterIPNone || !selects(svc.Spec.Selector, f.vllm.Spec.Template.Labels) {
		t.Fatalf("--discover-dns %s: want a headless Service of that name selecting the vLLM pods", d.Name)
	}
	if port, _ := argValue(f.vc.Args, "--port"); port != strconv.Itoa(d.Port) || !servicePortReaches(svc, f.vc, d.Port) {
		t.Errorf("--discover-dns port %d: vLLM serves on --port=%s, Service ports %v", d.Port, port, svc.Spec.Ports)
	}
	if dp := f.dataParallel(t); d.DP != dp {
		t.Errorf("--discover-dns dp=%d, vLLM --data-parallel-size %d", d.DP, dp)
	}
	return d
}

// checkReplay: the pods bind their replay socket on every rank's port and
// the router asks there.
func (f fleet) checkReplay(t *testing.T, routerReplayPort int) {
	t.Helper()
	if want := fmt.Sprintf("tcp://*:%d", routerReplayPort); f.kv.Replay != want {
		t.Errorf("router replay port %d, vLLM replay_endpoint %q (want %s)", routerReplayPort, f.kv.Replay, want)
	}
	for r := range f.dataParallel(t) {
		if !hasContainerPort(f.vc, routerReplayPort+r) {
			t.Errorf("rank %d's replay port %d is not a port of the vLLM container", r, routerReplayPort+r)
		}
	}
}

// checkBlockKeys: the router repeats the pods' hash seed, algorithm and
// block size, and the pods report cached tokens.
func (f fleet) checkBlockKeys(t *testing.T) {
	t.Helper()
	pod := map[string]string{}
	for _, e := range f.vc.Env {
		if e.Name == "PYTHONHASHSEED" {
			pod["--hash-seed"] = e.Value
		}
	}
	for router, podFlag := range map[string]string{"--block-size": "--block-size", "--hash-algo": "--prefix-caching-hash-algo"} {
		pod[router], _ = argValue(f.vc.Args, podFlag)
	}
	for _, flag := range slices.Sorted(maps.Keys(pod)) {
		if got, want := f.routerFlag(t, flag), pod[flag]; got != want || want == "" {
			t.Errorf("router %s=%q, pods %q", flag, got, want)
		}
	}
	if !slices.Contains(f.vc.Args, "--enable-prompt-tokens-details") {
		t.Error("vLLM without --enable-prompt-tokens-details: the router cannot compare cached tokens")
	}
}

// TestPerPodWiring: the overlay's router finds the vLLM pods through the
// headless Service on the ports their KV-event configuration binds, and
// repeats the pods' hash seed, algorithm and block size.
func TestPerPodWiring(t *testing.T) {
	f := loadFleet(t, "per-pod")
	d := f.headlessDiscovery(t)
	if d.EventsImplied || d.ReplayPort == 0 {
		t.Fatalf("--discover-dns %+v: want events-port and replay-port", d)
	}
	if _, port := tcpPort(t, "vLLM endpoint", f.kv.Endpoint); f.kv.Endpoint != fmt.Sprintf("tcp://*:%d", d.EventsPort) || port != d.EventsPort {
		t.Errorf("--discover-dns events-port=%d, vLLM binds %s", d.EventsPort, f.kv.Endpoint)
	}
	for r := range f.dataParallel(t) {
		if !servicePortReaches(f.o.services[d.Name], f.vc, d.EventsPort+r) {
			t.Errorf("rank %d's events port %d does not reach the vLLM container through Service %s", r, d.EventsPort+r, d.Name)
		}
	}
	f.checkReplay(t, d.ReplayPort)
	f.checkBlockKeys(t)
}

// TestCentralWiring: the vLLM pods' publishers connect, through a Service
// selecting the router, to the socket the router binds (every rank's
// port), under a topic naming the address --discover-dns gives the same
// pod; replay stays on the pods; one router replica takes every pod.
func TestCentralWiring(t *testing.T) {
	f := loadFleet(t, "central")
	d := f.headlessDiscovery(t)
	if !d.EventsImplied {
		t.Errorf("--discover-dns %+v names events-port: the pods would be expected on their own sockets, not the bus", d)
	}

	listenHost, listenPort := tcpPort(t, "--events-listen", f.routerFlag(t, "--events-listen"))
	if listenHost != "0.0.0.0" && listenHost != "*" {
		t.Errorf("--events-listen on %s: the pods cannot reach it", listenHost)
	}
	if strings.Contains(f.kv.Endpoint, "*") {
		t.Fatalf("vLLM endpoint %s binds: it must connect to the router", f.kv.Endpoint)
	}
	busName, busPort := tcpPort(t, "vLLM endpoint", f.kv.Endpoint)
	if busPort != listenPort {
		t.Errorf("vLLM connects to port %d, the router listens on %d", busPort, listenPort)
	}
	bus := f.o.services[busName]
	rc := f.router.Spec.Template.Spec.Containers[0]
	if bus == nil || !selects(bus.Spec.Selector, f.router.Spec.Template.Labels) {
		t.Fatalf("vLLM connects to %s: want a Service of that name selecting the router", busName)
	}
	if bus.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s publishes replicas that are not ready: in a rollout, publishers would reconnect to the terminating one", busName)
	}
	for r := range f.dataParallel(t) {
		if !servicePortReaches(bus, rc, listenPort+r) {
			t.Errorf("rank %d's bus port %d does not reach the router through Service %s", r, listenPort+r, busName)
		}
	}

	replay, err := strconv.Atoi(f.routerFlag(t, "--replay-port"))
	if err != nil {
		t.Fatalf("--replay-port: %v", err)
	}
	f.checkReplay(t, replay)

	// The topic names the pod as --discover-dns will: POD_IP from the
	// downward API, which Kubernetes substitutes for $(POD_IP) in args.
	podIP := slices.IndexFunc(f.vc.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_IP" })
	if podIP < 0 || f.vc.Env[podIP].ValueFrom == nil || f.vc.Env[podIP].ValueFrom.FieldRef == nil || f.vc.Env[podIP].ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Fatal("vLLM container: want env POD_IP from the downward API (status.podIP)")
	}
	const ip = "10.0.0.7"
	topic, err := kvindex.ParseTopic(strings.ReplaceAll(f.kv.Topic, "$(POD_IP)", ip))
	if err != nil {
		t.Fatalf("topic %q: %v", f.kv.Topic, err)
	}
	spec, err := d.SpecFor(ip)
	if err != nil {
		t.Fatal(err)
	}
	if want := d.Scheme + "://" + topic.HostPort(); spec.Endpoint != want {
		t.Errorf("pod %s: topic %q names %s, --discover-dns gives target %s", ip, f.kv.Topic, want, spec.Endpoint)
	}
	if topic.Model != f.vc.Args[0] {
		t.Errorf("topic model %q, vLLM serves %q", topic.Model, f.vc.Args[0])
	}

	// A publisher connects to one address, and the Service gives each
	// connection to one replica: more replicas would each miss pods.
	if n := f.router.Spec.Replicas; n == nil || *n != 1 {
		t.Errorf("router replicas %s: central collection needs exactly 1 (overlays/per-pod for more)", replicas(n))
	}
	if len(f.o.pdbs) != 0 {
		t.Errorf("%d PodDisruptionBudgets on a single replica: it could only block node drains", len(f.o.pdbs))
	}
	f.checkBusAdmitted(t, listenPort, f.dataParallel(t))
	f.checkBlockKeys(t)
}

// replicas prints a Deployment's replica count (unset: the API's default, 1).
func replicas(n *int32) string {
	if n == nil {
		return "unset"
	}
	return strconv.Itoa(int(*n))
}

// checkBusAdmitted: when NetworkPolicies select the router, one of them
// admits the vLLM pods on every rank's bus port.
func (f fleet) checkBusAdmitted(t *testing.T, port, dp int) {
	t.Helper()
	rc := f.router.Spec.Template.Spec.Containers[0]
	admitted := map[int]bool{}
	for _, np := range f.o.networkPolicies {
		if !selects(np.Spec.PodSelector.MatchLabels, f.router.Spec.Template.Labels) {
			continue
		}
		for _, rule := range np.Spec.Ingress {
			fromPods := len(rule.From) == 0 || slices.ContainsFunc(rule.From, func(p networkingv1.NetworkPolicyPeer) bool {
				return p.PodSelector != nil && p.NamespaceSelector == nil && selects(p.PodSelector.MatchLabels, f.vllm.Spec.Template.Labels)
			})
			if !fromPods {
				continue
			}
			for _, p := range rule.Ports {
				for r := range dp {
					if p.Port != nil && (p.Port.IntValue() == port+r || slices.ContainsFunc(rc.Ports, func(cp corev1.ContainerPort) bool {
						return cp.Name == p.Port.StrVal && int(cp.ContainerPort) == port+r
					})) {
						admitted[port+r] = true
					}
				}
			}
		}
	}
	for r := range dp {
		if len(f.o.networkPolicies) > 0 && !admitted[port+r] {
			t.Errorf("no NetworkPolicy admits the vLLM pods to the router's bus port %d", port+r)
		}
	}
}

// TestReplicaSharingWiring: the replicas overlay runs several replicas,
// each following every pod itself (per-pod), predicting (speculative),
// publishing on a port its peers reach through a headless Service that
// --peers names, on the same port, and admitting only the other replicas
// there.
func TestReplicaSharingWiring(t *testing.T) {
	f := loadFleet(t, "replicas")
	f.headlessDiscovery(t)
	if n := f.router.Spec.Replicas; n == nil || *n < 2 {
		t.Errorf("router replicas %s: sharing wants at least 2", replicas(n))
	}
	if p := f.routerFlag(t, "--policy"); p != "speculative" {
		t.Errorf("--policy=%s: predictions exist only with the speculative policy", p)
	}
	listen := f.routerFlag(t, "--peer-listen")
	host, port := tcpPort(t, "--peer-listen", listen)
	if host != "0.0.0.0" && host != "*" {
		t.Errorf("--peer-listen on %s: the other replicas cannot reach it", host)
	}
	spec, err := peers.ParseSpec(f.routerFlag(t, "--peers"))
	if err != nil {
		t.Fatal(err)
	}
	if !spec.DNS || spec.Port != port {
		t.Errorf("--peers %s: want dns:NAME:%d, a headless Service's name on the --peer-listen port", spec.Text, port)
	}
	cfg := peers.DefaultConfig()
	cfg.Listen, cfg.Peers, cfg.KeyFile = listen, []string{spec.Text}, f.routerFlag(t, "--peer-key-file")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	f.peerKeyFromSecret(t, cfg.KeyFile)
	svc := f.o.services[spec.Host]
	rc := f.router.Spec.Template.Spec.Containers[0]
	if svc == nil || svc.Spec.ClusterIP != corev1.ClusterIPNone || !selects(svc.Spec.Selector, f.router.Spec.Template.Labels) {
		t.Fatalf("--peers names %s: want a headless Service of that name selecting the router's pods", spec.Host)
	}
	if !servicePortReaches(svc, rc, port) {
		t.Errorf("Service %s does not reach the router's port %d", spec.Host, port)
	}
	if !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s leaves out replicas that are not ready: a new replica would not be found before it serves", spec.Host)
	}
	admitted := false
	for _, np := range f.o.networkPolicies {
		if !selects(np.Spec.PodSelector.MatchLabels, f.router.Spec.Template.Labels) {
			continue
		}
		for _, rule := range np.Spec.Ingress {
			fromRouters := slices.ContainsFunc(rule.From, func(p networkingv1.NetworkPolicyPeer) bool {
				return p.PodSelector != nil && p.NamespaceSelector == nil && selects(p.PodSelector.MatchLabels, f.router.Spec.Template.Labels)
			})
			for _, p := range rule.Ports {
				if fromRouters && p.Port != nil && (p.Port.IntValue() == port || slices.ContainsFunc(rc.Ports, func(cp corev1.ContainerPort) bool {
					return cp.Name == p.Port.StrVal && int(cp.ContainerPort) == port
				})) {
					admitted = true
				}
			}
		}
	}
	if !admitted {
		t.Errorf("no NetworkPolicy admits the other replicas on the peer port %d", port)
	}
	f.checkBlockKeys(t)
}

// peerKeyFromSecret checks that the router reads the --peer-key-file path
// from a Secret mounted read-only, readable by the pod's group and no
// one else.
func (f *fleet) peerKeyFromSecret(t *testing.T, path string) {
	t.Helper()
	pod := f.router.Spec.Template.Spec
	for _, m := range pod.Containers[0].VolumeMounts {
		dir := strings.TrimSuffix(m.MountPath, "/") + "/"
		if !strings.HasPrefix(path, dir) {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("--peer-key-file's volume %s is mounted writable", m.Name)
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.Secret == nil {
				t.Fatalf("--peer-key-file %s is on volume %s, not a Secret", path, v.Name)
			}
			if mode := v.Secret.DefaultMode; mode == nil || *mode&0o037 != 0 || *mode&0o040 == 0 {
				t.Errorf("--peer-key-file's Secret %s: defaultMode %v, want readable by the pod's group (fsGroup) and no one else", v.Secret.SecretName, mode)
			}
			key := strings.TrimPrefix(path, dir)
			for _, it := range v.Secret.Items {
				if it.Path == key {
					key = it.Key
				}
			}
			if key == "" || strings.Contains(key, "/") {
				t.Errorf("--peer-key-file %s: want a file at the top of the Secret's mount %s", path, dir)
			}
			return
		}
	}
	t.Fatalf("--peer-key-file %s is on no volume the router mounts: give it from a Secret", path)
}
