package sim

import (
	"net/http"
	"strings"
	"testing"
)

// TestAPIKey: with Config.APIKey a pod guards /v1 as vLLM's --api-key does
// (401 {"error": "Unauthorized"} without the bearer key, the scheme in any
// case) and leaves /health, /metrics and /tokenize open.
func TestAPIKey(t *testing.T) {
	f := startTestFleet(t, Config{APIKey: "sk-sim-secret"})
	pod := f.Pods[0]
	body := map[string]any{"model": "sim-test", "prompt": "hello there", "max_tokens": 2}
	for _, tc := range []struct {
		name   string
		hdr    []string
		status int
	}{
		{"none", nil, http.StatusUnauthorized},
		{"wrong", []string{"Authorization", "Bearer sk-sim-secreT"}, http.StatusUnauthorized},
		{"prefix", []string{"Authorization", "Bearer sk-sim-secret2"}, http.StatusUnauthorized},
		{"basic", []string{"Authorization", "Basic sk-sim-secret"}, http.StatusUnauthorized},
		{"right", []string{"Authorization", "Bearer sk-sim-secret"}, http.StatusOK},
		{"lower-case scheme", []string{"Authorization", "bearer sk-sim-secret"}, http.StatusOK},
	} {
		code, _, raw := post(t, pod.URL()+"/v1/completions", body, tc.hdr...)
		if code != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, code, raw, tc.status)
		}
		if code == http.StatusUnauthorized && strings.TrimSpace(string(raw)) != `{"error":"Unauthorized"}` {
			t.Errorf("%s: body %s", tc.name, raw)
		}
	}
	if code, raw := get(t, pod.URL()+"/v1/models"); code != http.StatusUnauthorized {
		t.Errorf("/v1/models without the key: %d %s", code, raw)
	}
	for _, path := range []string{"/health", "/metrics"} {
		if code, raw := get(t, pod.URL()+path); code != http.StatusOK {
			t.Errorf("%s without the key: %d %s", path, code, raw)
		}
	}
	if code, _, raw := post(t, pod.URL()+"/tokenize", map[string]any{"model": "sim-test", "prompt": "hi"}); code != http.StatusOK {
		t.Errorf("/tokenize without the key: %d %s", code, raw)
	}
	// 5 refusals: none, wrong, prefix, basic, models; keyless adds the 3
	// open requests.
	if n := pod.Unauthorized(); n != 5 {
		t.Errorf("Unauthorized %d, want 5", n)
	}
	if n := pod.Keyless(); n != 8 {
		t.Errorf("Keyless %d, want 8", n)
	}
}

// TestNoAPIKeyIsOpen: without Config.APIKey nothing is guarded.
func TestNoAPIKeyIsOpen(t *testing.T) {
	f := startTestFleet(t, Config{})
	if code, raw := get(t, f.Pods[0].URL()+"/v1/models"); code != http.StatusOK {
		t.Fatalf("%d %s", code, raw)
	}
}
