package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/poll"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/sim"
)

// TestVLLMGuide follows docs/vllm.md: simulated pods are started as its
// `vllm serve` line configures vLLM (seed, hash algorithm, block size,
// data parallelism, prompt-token details, event sockets), and its
// `prefixrouter serve` line runs against them with only the pods'
// addresses swapped for the simulated ones. The router must come up with
// vLLM-exact keys that every pod's events confirm, no wiring fault, and a
// repeated prompt served from the cache of the pod that holds it.
func TestVLLMGuide(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "vllm.md"))
	if err != nil {
		t.Fatal(err)
	}
	vllmArgs := guideCommand(t, string(doc), "vllm serve")
	serveArgs := guideCommand(t, string(doc), "prefixrouter serve")
	pod := parseVLLMServe(t, vllmArgs)

	hub := fakeHubEnv(t)
	hub.AddRepo(pod.model, qwen3Files(t))
	t.Setenv("HF_HUB_OFFLINE", "")

	var docEndpoints []*url.URL
	for i := 0; i < len(serveArgs); i++ {
		if serveArgs[i] == "--endpoint" && i+1 < len(serveArgs) {
			u, err := url.Parse(serveArgs[i+1])
			if err != nil {
				t.Fatalf("the guide's --endpoint %q: %v", serveArgs[i+1], err)
			}
			// The serve line must name what the vllm line binds.
			q := u.Query()
			if u.Port() != pod.httpPort || portOf(q.Get("events")) != pod.eventsPort ||
				portOf(q.Get("replay")) != pod.replayPort || q.Get("dp") != strconv.Itoa(pod.dp) {
				t.Fatalf("the guide's --endpoint %s does not match its vllm line (port %s, events %s, replay %s, dp %d)",
					u, pod.httpPort, pod.eventsPort, pod.replayPort, pod.dp)
			}
			docEndpoints = append(docEndpoints, u)
		}
	}
	if len(docEndpoints) == 0 {
		t.Fatal("the guide's serve line names no --endpoint")
	}

	prof, err := sim.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	prof.BlockSize = pod.blockSize
	fleet, err := sim.StartFleet(context.Background(), sim.Config{
		Pods: len(docEndpoints), Profile: prof, Model: pod.model, DP: pod.dp,
		Tokenizer: filepath.Join("..", "..", "testdata", "tokenizers", "models", "qwen3"),
		HashAlgo:  pod.algo, HashSeed: pod.seed, DisablePromptTokensDetails: !pod.promptDetails,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()

	// The guide's serve line, each documented pod replaced by a simulated
	// one: its address and its sockets' rank-0 addresses, everything else
	// (dp=, the flags) as written.
	simEndpoints := fleet.Endpoints()
	args := make([]string, 0, len(serveArgs)+12)
	n := 0
	for i := 0; i < len(serveArgs); i++ {
		args = append(args, serveArgs[i])
		if serveArgs[i] == "--endpoint" && i+1 < len(serveArgs) {
			i++
			args = append(args, swapPod(t, serveArgs[i], simEndpoints[n]))
			n++
		}
	}
	addr, admin := freePort(t), freePort(t)
	args = append(args, "--listen", addr, "--admin-listen", admin, "--log-level", "error",
		"--health-probe-interval", "100ms", "--health-probe-timeout", "100ms")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	stderr := &syncBuf{}
	go func() { done <- run(ctx, args, strings.NewReader(""), io.Discard, stderr) }()
	if !waitReady(addr, done, 60*time.Second) {
		t.Fatalf("the guide's router never became ready (args %q); stderr %q", args, stderr.String())
	}

	wantTargets := len(docEndpoints) * pod.dp
	var view struct {
		Keys struct {
			Mode      string `json:"mode"`
			BlockSize int    `json:"block_size"`
			Algo      string `json:"algo"`
		} `json:"block_keys"`
		Health struct {
			Targets []struct {
				Target       string            `json:"target"`
				State        string            `json:"state"`
				WiringFaults []json.RawMessage `json:"wiring_faults"`
				EventStream  struct {
					Verdict string `json:"verdict"`
				} `json:"event_stream"`
			} `json:"targets"`
		} `json:"health"`
		Index []struct {
			HashChecks     uint64 `json:"hash_checks"`
			HashMismatches uint64 `json:"hash_mismatches"`
		} `json:"index"`
	}
	debugTargets := func() {
		t.Helper()
		resp, err := http.Get("http://" + admin + "/debug/targets")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&view); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 30*time.Second, "every documented target routable with fresh events and exact keys", func() bool {
		debugTargets()
		if len(view.Health.Targets) != wantTargets || view.Keys.Mode != "exact" {
			return false
		}
		for _, tg := range view.Health.Targets {
			if tg.State != "routable" || tg.EventStream.Verdict != "fresh" || len(tg.WiringFaults) > 0 {
				return false
			}
		}
		return true
	})
	if view.Keys.BlockSize != pod.blockSize || view.Keys.Algo != pod.algo.String() {
		t.Fatalf("block keys %+v, want block size %d and %s as the pods", view.Keys, pod.blockSize, pod.algo)
	}

	// A long prompt twice: the second lands where the first was computed
	// and is served from that pod's cache.
	body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":"Which pod am I on?"}]}`,
		pod.model, strings.Repeat("The fleet operator reads the router's guide before the first request. ", 40))
	chat := func() (cached int) {
		t.Helper()
		resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var c struct {
			Usage struct {
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("chat: status %d, %v", resp.StatusCode, err)
		}
		return c.Usage.PromptTokensDetails.CachedTokens
	}
	chat()
	waitUntil(t, 30*time.Second, "the first prompt's blocks confirmed and verified", func() bool {
		debugTargets()
		checks := uint64(0)
		for _, ix := range view.Index {
			if ix.HashMismatches > 0 {
				t.Fatalf("%d block hashes of the pods' events disagree with the router's: the guide's flags do not match", ix.HashMismatches)
			}
			checks += ix.HashChecks
		}
		return checks > 0
	})
	if cached := chat(); cached < pod.blockSize {
		t.Fatalf("the repeated prompt was served with %d cached tokens; want it routed to the pod holding it", cached)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("serve exited %d: %s", code, stderr.String())
	}
}

// guidePod is a pod as the guide's vllm serve line configures it.
type guidePod struct {
	model         string
	seed          string
	algo          kvindex.HashAlgo
	blockSize     int
	dp            int
	promptDetails bool
	// The ports vllm serve binds: HTTP, and the event sockets' rank 0.
	httpPort, eventsPort, replayPort string
}

// parseVLLMServe reads the settings the router depends on from a vllm serve
// command line, failing on an option it does not know (so that the guide
// cannot show one this test ignores).
func parseVLLMServe(t *testing.T, args []string) guidePod {
	t.Helper()
	p := guidePod{algo: kvindex.AlgoSHA256, blockSize: 16, dp: 1}
	i := 0
	for ; i < len(args) && strings.Contains(args[i], "="); i++ {
		name, value, _ := strings.Cut(args[i], "=")
		if name != "PYTHONHASHSEED" {
			t.Fatalf("the guide's vllm line sets %s, which this test does not model", name)
		}
		p.seed = value
	}
	if len(args) < i+3 || args[i] != "vllm" || args[i+1] != "serve" {
		t.Fatalf("not a vllm serve line: %q", args)
	}
	p.model = args[i+2]
	num := func(flag, v string) int {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("the guide's %s %q: %v", flag, v, err)
		}
		return n
	}
	for j := i + 3; j < len(args); j++ {
		flag := args[j]
		value := ""
		if j+1 < len(args) {
			value = args[j+1]
		}
		switch flag {
		case "--enable-prompt-tokens-details":
			p.promptDetails = true
			continue
		case "--port":
			p.httpPort = value
		case "--block-size":
			p.blockSize = num(flag, value)
		case "--data-parallel-size":
			p.dp = num(flag, value)
		case "--prefix-caching-hash-algo":
			a, err := kvindex.ParseHashAlgo(value)
			if err != nil {
				t.Fatalf("the guide's %s: %v", flag, err)
			}
			p.algo = a
		case "--kv-events-config":
			var c struct {
				Enable    bool   `json:"enable_kv_cache_events"`
				Publisher string `json:"publisher"`
				Endpoint  string `json:"endpoint"`
				Replay    string `json:"replay_endpoint"`
			}
			if err := json.Unmarshal([]byte(value), &c); err != nil {
				t.Fatalf("the guide's --kv-events-config is not JSON: %v", err)
			}
			var ok1, ok2 bool
			p.eventsPort, ok1 = strings.CutPrefix(c.Endpoint, "tcp://*:")
			p.replayPort, ok2 = strings.CutPrefix(c.Replay, "tcp://*:")
			if !c.Enable || c.Publisher != "zmq" || !ok1 || !ok2 {
				t.Fatalf("the guide's --kv-events-config %s does not bind a zmq publisher and replay socket", value)
			}
		default:
			t.Fatalf("the guide's vllm line has %s, which this test does not model", flag)
		}
		j++
	}
	if p.seed == "" {
		t.Fatal("the guide's vllm line sets no PYTHONHASHSEED")
	}
	return p
}

// portOf is the port of a tcp://HOST:PORT address.
func portOf(addr string) string {
	u, err := url.Parse(addr)
	if err != nil {
		return ""
	}
	return u.Port()
}

// swapPod replaces the pod in a documented --endpoint by a simulated one:
// the HTTP address and the event sockets' rank-0 addresses; the rest of
// the documented query stays.
func swapPod(t *testing.T, documented, simulated string) string {
	t.Helper()
	d, err := url.Parse(documented)
	if err != nil {
		t.Fatal(err)
	}
	s, err := url.Parse(simulated)
	if err != nil {
		t.Fatal(err)
	}
	dq, sq := d.Query(), s.Query()
	for _, k := range []string{"events", "replay"} {
		if dq.Get(k) == "" {
			t.Fatalf("the guide's --endpoint %s has no %s=", documented, k)
		}
		dq.Set(k, sq.Get(k))
	}
	d.Host = s.Host
	d.RawQuery = dq.Encode()
	return d.String()
}

// guideCommand returns the shell words of the first fenced code block line
// (with its continuations) that contains prefix.
func guideCommand(t *testing.T, doc, prefix string) []string {
	t.Helper()
	inBlock := false
	var cmd strings.Builder
	collecting := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			if collecting {
				break
			}
			inBlock = !inBlock
			continue
		}
		if !inBlock {
			continue
		}
		if !collecting && !strings.Contains(line, prefix) {
			continue
		}
		collecting = true
		if body, more := strings.CutSuffix(line, "\\"); more {
			cmd.WriteString(body + " ")
			continue
		}
		cmd.WriteString(line)
		break
	}
	if !collecting {
		t.Fatalf("docs/vllm.md has no code line with %q", prefix)
	}
	words, err := shellWords(cmd.String())
	if err != nil {
		t.Fatalf("the guide's %q line: %v", prefix, err)
	}
	return words
}

// shellWords splits a command line as a POSIX shell would for the quoting
// the guide uses: single quotes, double quotes with backslash escapes, and
// backslashes outside quotes.
func shellWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words, inWord = append(words, w.String()), false
				w.Reset()
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated single quote")
			}
			w.WriteString(s[i+1 : i+1+j])
			i, inWord = i+1+j, true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`", s[i+1]) >= 0 {
					i++
				}
				w.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, fmt.Errorf("unterminated double quote")
			}
			inWord = true
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			inWord = true
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// waitUntil waits for cond, at most within (internal/poll).
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	poll.Within(t, within, what, cond)
}
