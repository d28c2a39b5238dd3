package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/sim"
)

func TestParseKeyFile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		tenants map[string]string // key -> tenant
		err     string
	}{
		{name: "keys and tenants", in: "# keys\nsk-one team-a\n\n  sk-two\t team_b # rotated in May\r\nsk-three\n",
			tenants: map[string]string{"sk-one": "team-a", "sk-two": "team_b", "sk-three": ""}},
		{name: "a # inside a key is the key's", in: "sk-a#b\n", tenants: map[string]string{"sk-a#b": ""}},
		{name: "empty", in: "", err: "no keys"},
		{name: "comments only", in: "# nothing\n\n", err: "no keys"},
		{name: "three fields", in: "sk-one team extra\n", err: "line 1: 3 fields"},
		{name: "duplicate", in: "sk-one a\nsk-two\nsk-one b\n", err: "line 3: the key of line 1 again"},
		{name: "bad tenant", in: "sk-one team/a\n", err: "line 1: tenant"},
		{name: "long tenant", in: "sk-one " + strings.Repeat("t", 65) + "\n", err: "tenant longer"},
		{name: "control byte", in: "sk-o\x01ne\n", err: "line 1: key holds a byte"},
		{name: "non-ASCII", in: "sk-ön\n", err: "line 1: key holds a byte"},
		{name: "long key", in: strings.Repeat("k", maxKeyBytes+1), err: "key longer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks, err := parseKeyFile([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				if strings.Contains(err.Error(), "sk-") {
					t.Fatalf("the error quotes a key: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ks.len() != len(tc.tenants) {
				t.Fatalf("%d keys, want %d", ks.len(), len(tc.tenants))
			}
			for key, tenant := range tc.tenants {
				got, res := ks.check([]byte("Bearer " + key))
				if res != authOK || got != tenant {
					t.Errorf("%s: %v tenant %q, want %q", key, res, got, tenant)
				}
			}
		})
	}
}

func TestParseSecretFile(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "sk-up\n", want: "sk-up"},
		{in: "# the pods' key\n\n  sk-up  \r\n", want: "sk-up"},
		{in: "", err: "no key"},
		{in: "sk-up sk-down\n", err: "2 fields"},
		{in: "sk-up\nsk-down\n", err: "a second key"},
		{in: "sk-\x7fup\n", err: "not visible ASCII"},
	} {
		got, err := parseSecretFile([]byte(tc.in))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: err %v, want %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%q: %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// TestKeyCheck: the checker accepts the exact key alone, with the bearer
// scheme in any case, and tells a missing credential from a wrong one. It
// holds digests, never a key's bytes, and decides by a constant-time
// compare of digests: a key sharing all but its last byte with an
// accepted one fares as any other wrong key.
func TestKeyCheck(t *testing.T) {
	const key = "sk-0123456789abcdef"
	ks, err := parseKeyFile([]byte(key + " acme\n"))
	if err != nil {
		t.Fatal(err)
	}
	if dump := fmt.Sprintf("%#v", ks); strings.Contains(dump, key) || strings.Contains(dump, fmt.Sprintf("%x", key)) {
		t.Fatal("the key set holds the key's bytes")
	}
	for _, tc := range []struct {
		header string
		want   authResult
	}{
		{"Bearer " + key, authOK},
		{"bearer " + key, authOK},
		{"BEARER  " + key + " ", authOK},
		{"", authMissing},
		{"Bearer", authMissing},
		{"Bearer   ", authMissing},
		{"Basic " + key, authMissing},
		{"Bearer" + key, authMissing},
		{"Bearer " + key[:len(key)-1], authWrong},
		{"Bearer " + key[:len(key)-1] + "g", authWrong},
		{"Bearer " + key + "0", authWrong},
		{"Bearer " + strings.ToUpper(key), authWrong},
		{"Bearer x", authWrong},
	} {
		tenant, res := ks.check([]byte(tc.header))
		if res != tc.want || (res == authOK) != (tenant == "acme") {
			t.Errorf("%q: %v %q, want %v", tc.header, res, tenant, tc.want)
		}
	}
}

func FuzzParseKeyFile(f *testing.F) {
	for _, seed := range []string{
		"sk-one team-a\nsk-two\n", "# c\n\nsk-x y # z\r\n", "a b c\n", "sk-a\nsk-a\n", "\x00\xff\n", "k #\n#k\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ks, err := parseKeyFile(data)
		if err != nil {
			if ks != nil {
				t.Fatal("a key set with an error")
			}
			return
		}
		if ks.len() == 0 {
			t.Fatal("no keys without an error")
		}
		for d, e := range ks.byDigest {
			if checkTenant([]byte(e.tenant)) != nil {
				t.Fatalf("entry %+v under %x", e, d)
			}
		}
		// Every key line's first field is accepted, with its tenant.
		for _, line := range bytes.Split(data, []byte("\n")) {
			if fields := lineFields(line); len(fields) > 0 {
				tenant, res := ks.check(append([]byte("Bearer "), fields[0]...))
				if res != authOK || (len(fields) == 2) != (tenant != "") {
					t.Fatalf("line %q: %v %q", line, res, tenant)
				}
			}
		}
		_, _ = parseSecretFile(data)
	})
}

// writeAtomic replaces path's contents as editors and config tools do: a
// new file renamed over the old.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// request sends a request with headers (name, value pairs) and returns
// the status, headers and body.
func request(t testing.TB, method, url, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// TestAPIKeys: with --api-key-file, the API wants a key it lists (401 in
// OpenAI's shape, with WWW-Authenticate: Bearer, without one or with a
// wrong one, counted as unauthorized), /health and /ready stay open,
// /v1/models is guarded; the key's tenant reaches the access log, the key
// never; the client's Authorization and Cookie never reach the pod, and
// X-Forwarded-For is the connection's peer, whatever the client wrote.
func TestAPIKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	writeAtomic(t, keys, "# clients\nsk-acme-0123456789 acme\nsk-solo-0123456789\n")
	p := newFakePod(t, "A", 16, false)
	seen := make(chan http.Header, 8)
	p.setHandler(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		p.echo(w, r)
	})
	cfg := DefaultConfig()
	cfg.Health = fastHealth(p.endpoint())
	cfg.APIKeyFile = keys
	cfg.AccessLog = filepath.Join(dir, "access.log")
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })
	base := "http://" + r.Addr()
	body := `{"model":"m","prompt":"hi"}`

	for _, tc := range []struct {
		name      string
		auth      string
		challenge string
		message   string
	}{
		{"no key", "", "Bearer", "You didn't provide an API key"},
		{"wrong key", "Bearer sk-acme-012345678", `Bearer error="invalid_token"`, "Incorrect API key provided."},
		{"other scheme", "Basic c2stYWNtZQ==", "Bearer", "You didn't provide an API key"},
	} {
		code, hdr, b := request(t, http.MethodPost, base+"/v1/completions", body, "Authorization", tc.auth)
		if code != http.StatusUnauthorized || hdr.Get("WWW-Authenticate") != tc.challenge {
			t.Fatalf("%s: %d, WWW-Authenticate %q: %s", tc.name, code, hdr.Get("WWW-Authenticate"), b)
		}
		var e struct {
			Error struct {
				Message, Type string
				Code          *string
			}
		}
		if err := json.Unmarshal(b, &e); err != nil || !strings.HasPrefix(e.Error.Message, tc.message) ||
			e.Error.Type != "invalid_request_error" || e.Error.Code == nil || *e.Error.Code != "invalid_api_key" {
			t.Fatalf("%s: body %s", tc.name, b)
		}
		if strings.Contains(string(b), "sk-") {
			t.Fatalf("%s: the answer echoes a key: %s", tc.name, b)
		}
	}
	if n := p.hits.Load(); n != 0 {
		t.Fatalf("%d refused requests reached the pod", n)
	}
	for _, path := range []string{"/v1/models", "/v1/models/m", "/no/such/path"} {
		if code, _, b := request(t, http.MethodGet, base+path, ""); code != http.StatusUnauthorized {
			t.Fatalf("GET %s without a key: %d %s", path, code, b)
		}
	}
	for _, path := range []string{"/health", "/ready"} {
		if code, _, b := request(t, http.MethodGet, base+path, ""); code != http.StatusOK {
			t.Fatalf("GET %s without a key: %d %s", path, code, b)
		}
	}
	if code, _, b := request(t, http.MethodGet, base+"/v1/models", "", "Authorization", "Bearer sk-solo-0123456789"); code != http.StatusOK {
		t.Fatalf("GET /v1/models with a key: %d %s", code, b)
	}
	code, _, b := request(t, http.MethodPost, base+"/v1/completions", body,
		"Authorization", "Bearer sk-acme-0123456789", "Cookie", "session=s3cret", "X-Forwarded-For", "203.0.113.7",
		"Forwarded", "for=203.0.113.7", "X-Real-Ip", "203.0.113.7", "X-Request-Id", "acme-1")
	if code != http.StatusOK {
		t.Fatalf("with the key: %d %s", code, b)
	}
	h := <-seen
	for _, k := range []string{"Authorization", "Cookie", "Forwarded", "X-Real-Ip"} {
		if v := h.Get(k); v != "" {
			t.Errorf("the pod got the client's %s: %q", k, v)
		}
	}
	if v := h.Get("X-Forwarded-For"); v != "127.0.0.1" {
		t.Errorf("X-Forwarded-For %q, want the peer alone", v)
	}
	if v := metricValue(t, r, `prefixrouter_requests_rejected_total{reason="unauthorized"}`); v != 6 {
		t.Errorf("unauthorized refusals %v, want 6", v)
	}
	if v := metricValue(t, r, "prefixrouter_api_keys"); v != 2 {
		t.Errorf("prefixrouter_api_keys %v, want 2", v)
	}
	var line []byte
	waitFor(t, "the access line", func() bool {
		raw, _ := os.ReadFile(cfg.AccessLog)
		for l := range bytes.SplitSeq(raw, []byte("\n")) {
			if bytes.Contains(l, []byte(`"acme-1"`)) {
				line = l
				return true
			}
		}
		return false
	})
	if !bytes.Contains(line, []byte(`"tenant":"acme"`)) {
		t.Errorf("access line without the tenant: %s", line)
	}
	raw, _ := os.ReadFile(cfg.AccessLog)
	if bytes.Contains(raw, []byte("sk-")) || !bytes.Contains(raw, []byte(`"outcome":"unauthorized"`)) {
		t.Errorf("access log: %s", raw)
	}
}

// TestAPIKeyFileReload: a key file swapped as Kubernetes swaps a Secret's
// files (a new directory, the ..data symlink renamed over) is picked up;
// one that does not parse keeps the keys read before, logged and counted.
func TestAPIKeyFileReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mount := func(gen, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, gen), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, gen, "keys"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(gen, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	mount("..gen1", "sk-old-0123456789\n")
	keys := filepath.Join(dir, "keys")
	if err := os.Symlink(filepath.Join("..data", "keys"), keys); err != nil {
		t.Fatal(err)
	}
	p := newFakePod(t, "A", 16, false)
	cfg := DefaultConfig()
	cfg.Health = fastHealth(p.endpoint())
	cfg.APIKeyFile = keys
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })
	url := "http://" + r.Addr() + "/v1/completions"
	status := func(key string) int {
		code, _, _ := request(t, http.MethodPost, url, `{"model":"m","prompt":"hi"}`, "Authorization", "Bearer "+key)
		return code
	}
	if status("sk-old-0123456789") != 200 || status("sk-new-0123456789") != 401 {
		t.Fatal("before the swap")
	}
	mount("..gen2", "sk-new-0123456789 rotated\n")
	waitFor(t, "the new key", func() bool { return status("sk-new-0123456789") == 200 })
	if status("sk-old-0123456789") != 401 {
		t.Fatal("the old key still passes")
	}
	if v := metricValue(t, r, `prefixrouter_credential_reloads_total{file="api-key-file",result="ok"}`); v != 1 {
		t.Fatalf("reloads ok %v", v)
	}
	mount("..gen3", "sk-a sk-b sk-c\n")
	waitFor(t, "the failed reload counted", func() bool {
		return metricValue(t, r, `prefixrouter_credential_reloads_total{file="api-key-file",result="error"}`) == 1
	})
	if v := metricValue(t, r, `prefixrouter_credential_file_error{file="api-key-file"}`); v != 1 {
		t.Fatalf("file error gauge %v", v)
	}
	if status("sk-new-0123456789") != 200 || status("sk-a") != 401 {
		t.Fatal("a broken file changed the keys")
	}
}

// TestUpstreamKeyToSimPods: simulated pods started with --api-key serve a
// router given --upstream-api-key-file: it discovers their models and
// block keys, tokenizes through their render endpoints, splits requests
// between a prefill and a decode pod, answers /v1/models from them, and
// every call it makes to a pod carries the key, its own and the ones it
// forwards, while the client's key (the router's) stays at the router.
func TestUpstreamKeyToSimPods(t *testing.T) {
	t.Parallel()
	const podKey = "sk-pods-0123456789"
	f := startFleetWith(t, sim.Config{Pods: 3, PrefillPods: 1, APIKey: podKey})
	dir := t.TempDir()
	writeAtomic(t, filepath.Join(dir, "upstream"), podKey+"\n")
	writeAtomic(t, filepath.Join(dir, "keys"), "sk-client-0123456789 acme\n")
	cfg := DefaultConfig()
	cfg.Policy = brain.PolicyPrecise
	cfg.DebugHeaders = true
	cfg.Events.HashSeed, cfg.Events.HasHashSeed = "0", true
	cfg.Health = fastHealth(f.Endpoints()...)
	cfg.UpstreamAPIKeyFile = filepath.Join(dir, "upstream")
	cfg.APIKeyFile = filepath.Join(dir, "keys")
	r := startRouter(t, cfg, "sim-tiny:remote=")
	waitFor(t, "3 fresh pods", func() bool { return freshCount(r, "sim-tiny") == 3 })
	waitFor(t, "block keys learned from the pods", r.KeysReady)
	client := []string{"Authorization", "Bearer sk-client-0123456789"}
	prompt := strings.Repeat("Every call to a pod carries the fleet's key. ", 20)
	code, hdr, b := request(t, http.MethodPost, "http://"+r.Addr()+"/v1/completions",
		fmt.Sprintf(`{"model":"sim-tiny","max_tokens":2,"prompt":%q}`, prompt), client...)
	if code != http.StatusOK {
		t.Fatalf("completion: %d %s", code, b)
	}
	if hdr.Get("X-Prefixrouter-Prefill-Target") == "" || hdr.Get("X-Prefixrouter-Prompt-Blocks") == "0" {
		t.Fatalf("not split, or not tokenized by the pods: prefill %q, prompt blocks %q",
			hdr.Get("X-Prefixrouter-Prefill-Target"), hdr.Get("X-Prefixrouter-Prompt-Blocks"))
	}
	code, _, b = request(t, http.MethodPost, "http://"+r.Addr()+"/v1/chat/completions",
		`{"model":"sim-tiny","max_tokens":2,"messages":[{"role":"user","content":"hello"}]}`, client...)
	if code != http.StatusOK {
		t.Fatalf("chat: %d %s", code, b)
	}
	code, _, b = request(t, http.MethodGet, "http://"+r.Addr()+"/v1/models", "", client...)
	if code != http.StatusOK || !strings.Contains(string(b), `"sim-tiny"`) {
		t.Fatalf("/v1/models: %d %s", code, b)
	}
	for _, p := range f.Pods {
		if n, k := p.Unauthorized(), p.Keyless(); n != 0 || k != 0 {
			t.Errorf("pod %s: %d refused, %d without the key", p.URL(), n, k)
		}
	}
}

// TestNoUpstreamKeySimPods: without --upstream-api-key-file, pods started
// with --api-key are not used, and /debug/targets says why: their 401,
// and the flag to set.
func TestNoUpstreamKeySimPods(t *testing.T) {
	t.Parallel()
	f := startFleetWith(t, sim.Config{Pods: 1, APIKey: "sk-pods-0123456789"})
	cfg := DefaultConfig()
	cfg.Health = fastHealth(f.Endpoints()...)
	r := startRouter(t, cfg, "sim-tiny=bytes")
	var detail string
	waitFor(t, "the 401 shown", func() bool {
		var v struct {
			Health struct {
				Targets []struct {
					State  string `json:"state"`
					Detail string `json:"detail"`
				} `json:"targets"`
			} `json:"health"`
		}
		adminDebugTargets(t, r, &v)
		if len(v.Health.Targets) != 1 {
			return false
		}
		detail = v.Health.Targets[0].Detail
		return strings.Contains(detail, "status 401") && v.Health.Targets[0].State != "routable"
	})
	if !strings.Contains(detail, "--upstream-api-key-file") {
		t.Fatalf("detail %q names no flag", detail)
	}
	code, _, b := post(t, "http://"+r.Addr()+"/v1/completions", `{"model":"sim-tiny","max_tokens":1,"prompt":"hi"}`)
	if code == http.StatusOK {
		t.Fatalf("a pod refusing the router served: %s", b)
	}
}

// TestUpstreamKeyReplacesClientAuthorization: without router keys, the
// upstream key replaces the client's Authorization; without either, the
// client's goes through as before.
func TestUpstreamKeyReplacesClientAuthorization(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, upstream, want string
	}{
		{"upstream key", "sk-up-0123456789", "Bearer sk-up-0123456789"},
		{"none", "", "Bearer client"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newFakePod(t, "A", 16, false)
			var got atomic.Pointer[string]
			p.setHandler(func(w http.ResponseWriter, r *http.Request) {
				v := strings.Join(r.Header.Values("Authorization"), ";")
				got.Store(&v)
				p.echo(w, r)
			})
			cfg := DefaultConfig()
			cfg.Health = fastHealth(p.endpoint())
			if tc.upstream != "" {
				cfg.UpstreamAPIKeyFile = filepath.Join(t.TempDir(), "upstream")
				writeAtomic(t, cfg.UpstreamAPIKeyFile, tc.upstream+"\n")
			}
			r := startRouter(t, cfg)
			waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })
			code, _, b := request(t, http.MethodPost, "http://"+r.Addr()+"/v1/completions", `{"model":"m","prompt":"hi"}`, "Authorization", "Bearer client")
			if code != http.StatusOK {
				t.Fatalf("%d %s", code, b)
			}
			if v := got.Load(); v == nil || *v != tc.want {
				t.Fatalf("the pod got Authorization %v, want %q", v, tc.want)
			}
		})
	}
}

// TestAdminToken: --admin-token-file guards /debug and the dry run (401
// without or with a wrong token, counted), leaves /metrics open, and the
// admin server bounds the time a request may take to arrive and leave.
func TestAdminToken(t *testing.T) {
	t.Parallel()
	p := newFakePod(t, "A", 16, false)
	cfg := DefaultConfig()
	cfg.Health = fastHealth(p.endpoint())
	cfg.AdminTokenFile = filepath.Join(t.TempDir(), "admin")
	writeAtomic(t, cfg.AdminTokenFile, "adm-0123456789\n")
	r := startRouter(t, cfg)
	waitFor(t, "pod routable", func() bool { return routableCount(r, "m") == 1 })
	admin := "http://" + r.AdminAddr()
	dry := `{"model":"m","prompt":"hi"}`
	for _, auth := range []string{"", "Bearer adm-012345678", "adm-0123456789"} {
		for _, q := range []struct{ method, path, body string }{
			{http.MethodGet, "/debug/targets", ""},
			{http.MethodGet, "/debug/speculative", ""},
			{http.MethodPost, "/debug/route/v1/completions", dry},
		} {
			code, hdr, b := request(t, q.method, admin+q.path, q.body, "Authorization", auth)
			if code != http.StatusUnauthorized || hdr.Get("WWW-Authenticate") != "Bearer" || !strings.Contains(string(b), "invalid_api_key") {
				t.Fatalf("%s %s with %q: %d %s", q.method, q.path, auth, code, b)
			}
		}
	}
	if v := metricValue(t, r, `prefixrouter_admin_rejected_total{reason="unauthorized"}`); v != 9 {
		t.Fatalf("admin refusals %v, want 9", v)
	}
	good := []string{"Authorization", "Bearer adm-0123456789"}
	if code, _, b := request(t, http.MethodGet, admin+"/debug/targets", "", good...); code != http.StatusOK {
		t.Fatalf("/debug/targets with the token: %d %s", code, b)
	}
	if code, _, b := request(t, http.MethodPost, admin+"/debug/route/v1/completions", dry, good...); code != http.StatusOK {
		t.Fatalf("dry run with the token: %d %s", code, b)
	}
	if code, _, _ := request(t, http.MethodGet, admin+"/metrics", ""); code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	if r.adm.ReadTimeout <= 0 || r.adm.WriteTimeout <= 0 || r.adm.IdleTimeout <= 0 {
		t.Fatalf("admin server timeouts: read %v, write %v, idle %v", r.adm.ReadTimeout, r.adm.WriteTimeout, r.adm.IdleTimeout)
	}
}

// TestCredentialFlagsChecked: a missing file fails Validate, naming the
// flag; a file that does not parse fails New, naming the flag and never
// quoting a key.
func TestCredentialFlagsChecked(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Health.Endpoints = []string{"http://127.0.0.1:1"}
	cfg.APIKeyFile = filepath.Join(t.TempDir(), "absent")
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--api-key-file") {
		t.Fatalf("Validate: %v", err)
	}
	cfg.APIKeyFile = ""
	cfg.UpstreamAPIKeyFile = filepath.Join(t.TempDir(), "upstream")
	writeAtomic(t, cfg.UpstreamAPIKeyFile, "sk-one sk-two\n")
	_, err := New(cfg, Deps{Logger: quietLogger()})
	if err == nil || !strings.Contains(err.Error(), "--upstream-api-key-file") || strings.Contains(err.Error(), "sk-") {
		t.Fatalf("New: %v", err)
	}
	cfg.AdminTokenFile, cfg.UpstreamAPIKeyFile = cfg.UpstreamAPIKeyFile, ""
	cfg.AdminListen = ""
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--admin-token-file") {
		t.Fatalf("an admin token without an admin listener: %v", err)
	}
}

// authorizeRig is a router with two keys and a request carrying one.
func authorizeRig(tb testing.TB) (*Router, *exchange, []byte) {
	tb.Helper()
	ks, err := parseKeyFile([]byte("sk-acme-0123456789abcdef0123456789 acme\nsk-solo-0123456789abcdef0123456789\n"))
	if err != nil {
		tb.Fatal(err)
	}
	r := &Router{cred: &credentials{keysOn: true}}
	r.cred.keys.Store(ks)
	ctx := &fasthttp.RequestCtx{}
	ctx.Request.Header.Set("Authorization", "Bearer sk-acme-0123456789abcdef0123456789")
	return r, &exchange{in: ctx}, []byte("/v1/completions")
}

// TestAuthorizeAllocatesNothing: the check on every request costs no
// allocation.
func TestAuthorizeAllocatesNothing(t *testing.T) {
	r, x, path := authorizeRig(t)
	if n := testing.AllocsPerRun(100, func() {
		if !r.authorize(x, path) || x.tenant != "acme" {
			t.Fatal("refused")
		}
	}); n != 0 {
		t.Fatalf("%v allocations per check", n)
	}
}

func BenchmarkAuthorize(b *testing.B) {
	r, x, path := authorizeRig(b)
	b.ReportAllocs()
	for b.Loop() {
		if !r.authorize(x, path) {
			b.Fatal("refused")
		}
	}
}
