package health

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// guardedPod is a fakePod behind a bearer key on every path, recording
// each path called without it.
type guardedPod struct {
	*fakePod
	key     atomic.Pointer[string]
	mu      sync.Mutex
	refused map[string]int
	called  map[string]int
}

func newGuardedPod(t *testing.T, key string, models ...string) *guardedPod {
	return newGuardedPodOn(t, "/", key, models...)
}

// newGuardedPodOn guards the paths starting with prefix alone.
func newGuardedPodOn(t *testing.T, prefix, key string, models ...string) *guardedPod {
	g := &guardedPod{fakePod: newFakePod(t, models...), refused: map[string]int{}, called: map[string]int{}}
	g.key.Store(&key)
	inner := g.srv.Config.Handler
	g.srv.Close()
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.called[r.URL.Path]++
		ok := !strings.HasPrefix(r.URL.Path, prefix) || r.Header.Get("Authorization") == "Bearer "+*g.key.Load()
		if !ok {
			g.refused[r.URL.Path]++
		}
		g.mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"Unauthorized"}`))
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *guardedPod) counts() (called, refused map[string]int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return copyCounts(g.called), copyCounts(g.refused)
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestAuthorizationOnEveryCall: Deps.Authorization goes out on the probe,
// the model list and the metrics scrape, read at each call (a rotated
// credential applies at the next one); without it a guarded pod's 401
// shows in the target's detail with the flag to set.
func TestAuthorizationOnEveryCall(t *testing.T) {
	pod := newGuardedPod(t, "k1", "llama")
	var cred atomic.Pointer[string]
	bearer := func(k string) { v := "Bearer " + k; cred.Store(&v) }
	bearer("k1")
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("")}}, Deps{Authorization: func() string { return *cred.Load() }})
	env.tick()
	tg := env.target(t, pod.id(0))
	if tg.State != StateRoutable || strings.Join(tg.Models, ",") != "llama" {
		t.Fatalf("with the credential: %s/%s %s, models %v", tg.State, tg.Reason, tg.Detail, tg.Models)
	}
	called, refused := pod.counts()
	for _, path := range []string{"/health", "/v1/models", "/metrics"} {
		if called[path] == 0 || refused[path] != 0 {
			t.Errorf("%s: called %d, refused %d", path, called[path], refused[path])
		}
	}
	k2 := "k2"
	pod.key.Store(&k2)
	bearer("k2")
	env.tick()
	if _, refused := pod.counts(); len(refused) != 0 {
		t.Fatalf("after rotation: refused %v", refused)
	}

	open := newGuardedPod(t, "k1", "llama")
	env2 := newTestMonitor(t, Config{Endpoints: []string{open.spec("")}}, Deps{})
	env2.tick()
	tg = env2.target(t, open.id(0))
	if tg.State == StateRoutable || !strings.Contains(tg.Detail, "401") || !strings.Contains(tg.Detail, "--upstream-api-key-file") {
		t.Fatalf("without the credential: %s/%s %q", tg.State, tg.Reason, tg.Detail)
	}
}

// TestUnauthorizedTakesNoWork: a pod that answers its probes but refuses
// the model list (vLLM with --api-key guards /v1 alone) is down as
// unauthorized, even when its models are configured, and comes back once
// the credential is right.
func TestUnauthorizedTakesNoWork(t *testing.T) {
	pod := newGuardedPodOn(t, "/v1", "k1", "llama")
	var cred atomic.Pointer[string]
	none := ""
	cred.Store(&none)
	env := newTestMonitor(t, Config{Endpoints: []string{pod.spec("model=llama")}}, Deps{Authorization: func() string { return *cred.Load() }})
	env.tick()
	tg := env.target(t, pod.id(0))
	if tg.State != StateDown || tg.Reason != ReasonUnauthorized || !strings.Contains(tg.Detail, "status 401") {
		t.Fatalf("without the credential: %s/%s %q", tg.State, tg.Reason, tg.Detail)
	}
	good := "Bearer k1"
	cred.Store(&good)
	env.clock.Advance(DefaultConfig().ModelsInterval)
	env.tick()
	if tg = env.target(t, pod.id(0)); tg.State != StateRoutable {
		t.Fatalf("with the credential: %s/%s %q", tg.State, tg.Reason, tg.Detail)
	}
}
