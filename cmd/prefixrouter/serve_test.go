package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/sim"
)

func TestServeUsageErrors(t *testing.T) {
	cases := []struct {
		name     string
		args     []string
		errMatch string
	}{
		{"no targets", nil, "no targets"},
		{"bad policy", []string{"--endpoint", "http://127.0.0.1:1", "--policy", "random"}, "--policy"},
		{"holdback beyond half", []string{"--endpoint", "http://127.0.0.1:1", "--policy", "speculative", "--holdback", "0.7"}, "--holdback"},
		{"bad speculative ttl", []string{"--endpoint", "http://127.0.0.1:1", "--speculative-ttl", "soon"}, "--speculative-ttl"},
		{"percentile of one", []string{"--endpoint", "http://127.0.0.1:1", "--speculative-ttl-percentile", "1"}, "--speculative-ttl-percentile"},
		{"bad endpoint", []string{"--endpoint", "ftp://x?dp=zero"}, "--endpoint"},
		{"bad hash algo", []string{"--endpoint", "http://127.0.0.1:1", "--hash-algo", "md5"}, "--hash-algo"},
		{"bad block size", []string{"--endpoint", "http://127.0.0.1:1", "--block-size", "-1"}, "--block-size"},
		{"bad tokenization", []string{"--endpoint", "http://127.0.0.1:1", "--tokenization", "psychic"}, "--tokenization"},
		{"bad tokenizer path", []string{"--endpoint", "http://127.0.0.1:1", "--tokenizer", "m=/nonexistent/dir"}, "--tokenizer"},
		{"bad duration", []string{"--endpoint", "http://127.0.0.1:1", "--idle-timeout", "soon"}, "idle-timeout"},
		{"bad log level", []string{"--endpoint", "http://127.0.0.1:1", "--log-level", "loud"}, "--log-level"},
		{"bad endpoint named", []string{"--endpoint", "http://127.0.0.1:1/v1"}, `--endpoint "http://127.0.0.1:1/v1": give the server's root URL`},
		{"zero timeout", []string{"--endpoint", "http://127.0.0.1:1", "--connect-timeout", "0"}, "--connect-timeout must be positive"},
		{"every problem at once", []string{"--endpoint", "http://127.0.0.1:1", "--max-retries", "-1", "--kv-threshold", "2"},
			"--kv-threshold 2 must be within [0, 1]; --max-retries must not be negative"},
		{"cross-flag check", []string{"--endpoint", "http://127.0.0.1:1", "--health-probe-timeout", "3s"},
			"--health-probe-timeout 3s exceeds --health-probe-interval 2s"},
		{"negative event staleness", []string{"--endpoint", "http://127.0.0.1:1", "--events-stale-after", "-1s"}, "--events-stale-after must be positive"},
		{"zero routing window", []string{"--endpoint", "http://127.0.0.1:1", "--health-routing-window", "0"}, "--health-routing-window must be positive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, errOut, code := runCLI(t, "", append([]string{"serve"}, c.args...)...)
			if code != exitUsage || !strings.Contains(errOut, c.errMatch) || strings.Count(errOut, "\n") != 1 {
				t.Fatalf("code %d stderr %q: want exit 2 and one line mentioning %q", code, errOut, c.errMatch)
			}
		})
	}
}

// syncBuf is a bytes.Buffer safe to read while the command writes it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitReady polls /ready until it answers 200, the command exits, or the
// time runs out.
func waitReady(addr string, done chan int, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		select {
		case code := <-done:
			done <- code // leave it for the caller
			return false
		default:
		}
		resp, err := http.Get("http://" + addr + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestServeEndToEnd runs `prefixrouter serve` in front of simulated pods,
// sends a request through it and stops it with its context (SIGTERM).
func TestServeEndToEnd(t *testing.T) {
	prof, err := sim.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := sim.StartFleet(context.Background(), sim.Config{Pods: 2, Profile: prof, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	args := []string{"--tokenizer", prof.Model + "=bytes"}
	for _, ep := range fleet.Endpoints() {
		args = append(args, "--endpoint", ep)
	}
	sv := startServe(t, args)
	addr, admin, cancel, done, stderr := sv.addr, sv.admin, sv.cancel, sv.done, sv.stderr
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"`+prof.Model+`","prompt":"hello fleet","max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	err = json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || c.Usage.PromptTokens != 12 {
		t.Fatalf("status %d usage %+v err %v", resp.StatusCode, c.Usage, err)
	}
	m, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(m.Body)
	m.Body.Close()
	for _, name := range []string{"prefixrouter_requests_total", "prefixrouter_health_", "go_goroutines"} {
		if !strings.Contains(string(body), name) {
			t.Fatalf("/metrics lacks %s", name)
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("serve exited %d: %s", code, stderr.String())
	}
}

// served is a `prefixrouter serve` running in the test's process.
type served struct {
	addr, admin string
	cancel      context.CancelFunc
	done        chan int
	stderr      *syncBuf
}

// startServe runs serve with args on free API and admin ports until it is
// ready. Ports picked free may be
// taken by someone else before serve binds them; a bind failure is
// retried with new ones.
func startServe(t *testing.T, args []string) served {
	t.Helper()
	for attempt := 0; ; attempt++ {
		sv := served{addr: freePort(t), admin: freePort(t), done: make(chan int, 1), stderr: &syncBuf{}}
		all := append([]string{"prefixrouter", "serve", "--listen", sv.addr, "--admin-listen", sv.admin, "--log-level", "error",
			"--health-probe-interval", "100ms", "--health-probe-timeout", "100ms"}, args...)
		var ctx context.Context
		ctx, sv.cancel = context.WithCancel(context.Background())
		go func() { sv.done <- run(ctx, all, strings.NewReader(""), io.Discard, sv.stderr) }()
		if waitReady(sv.addr, sv.done, 20*time.Second) {
			return sv
		}
		sv.cancel()
		if attempt < 3 && strings.Contains(sv.stderr.String(), "address already in use") {
			continue
		}
		t.Fatalf("router never ready; stderr %q", sv.stderr.String())
	}
}

// TestServeReplicasShare runs two serve commands in front of the same
// pods, given the same --peers list in the environment (each skips its
// own address): each hears from the other. A third on a --peer-listen
// already bound does not start, and says which flag.
func TestServeReplicasShare(t *testing.T) {
	prof, err := sim.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := sim.StartFleet(context.Background(), sim.Config{Pods: 1, Profile: prof, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	peerA, peerB := "tcp://"+freePort(t), "tcp://"+freePort(t)
	t.Setenv("PREFIXROUTER_PEERS", peerA+","+peerB)
	// The replicas share a key the keygen command wrote.
	key := filepath.Join(t.TempDir(), "peer.key")
	if _, errOut, code := runCLI(t, "", "peer-keygen", "--out", key); code != 0 {
		t.Fatalf("peer-keygen: exit %d: %s", code, errOut)
	}
	t.Setenv("PREFIXROUTER_PEER_KEY_FILE", key)
	args := []string{"--tokenizer", prof.Model + "=bytes", "--endpoint", fleet.Endpoints()[0], "--policy", "speculative"}
	var replicas []served
	for _, listen := range []string{peerA, peerB} {
		sv := startServe(t, append(args, "--peer-listen", listen))
		defer func() {
			sv.cancel()
			if code := <-sv.done; code != 0 {
				t.Errorf("serve exited %d: %s", code, sv.stderr.String())
			}
		}()
		replicas = append(replicas, sv)
	}
	for i, sv := range replicas {
		other := []string{peerB, peerA}[i]
		deadline := time.Now().Add(20 * time.Second)
		for {
			var v struct {
				Peers struct {
					Security string `json:"security"`
					Peers    []struct {
						Peer      string `json:"peer"`
						State     string `json:"state"`
						Connected bool   `json:"connected"`
					} `json:"peers"`
				} `json:"peers"`
			}
			resp, err := http.Get("http://" + sv.admin + "/debug/targets")
			if err != nil {
				t.Fatal(err)
			}
			err = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			connected, self := false, 0
			for _, p := range v.Peers.Peers {
				connected = connected || p.Peer == other && p.Connected
				if p.State == "self" {
					self++
				}
			}
			if connected && self == 1 {
				if v.Peers.Security != "curve" {
					t.Fatalf("replica %d's mesh is %q", i, v.Peers.Security)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d's peers: %+v", i, v.Peers.Peers)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	_, errOut, code := runCLI(t, "", append([]string{"serve", "--listen", freePort(t), "--admin-listen", "", "--peer-listen", peerA}, args...)...)
	if code != exitFailure || !strings.Contains(errOut, "--peer-listen: bind "+peerA) {
		t.Fatalf("a taken --peer-listen: exit %d, %q", code, errOut)
	}
}

// TestDemoCommand runs a small demo (bench --quick with its flags) and
// checks the table and the report's path.
func TestDemoCommand(t *testing.T) {
	out := t.TempDir()
	stdout, errOut, code := runCLI(t, "", "demo", "--pods", "2", "--policies", "round-robin,precise", "--kv-blocks", "256",
		"--system-tokens", "400", "--groups", "3", "--rates", "20", "--stage-duration", "1s", "--output-tokens", "8", "--time-scale", "20", "--out", out)
	if code != 0 {
		t.Fatalf("demo exited %d: %s", code, errOut)
	}
	var lines []string // notes (a lagging clock under -race) aside
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if !strings.HasPrefix(l, "note: ") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 5 || !strings.HasPrefix(lines[1], "policy") || !strings.HasPrefix(lines[2], "round-robin") ||
		!strings.HasPrefix(lines[3], "precise") || lines[4] != "report: "+out+"/report.html" {
		t.Fatalf("demo output:\n%s", stdout)
	}
	for _, l := range lines[2:4] {
		if f := strings.Fields(l); len(f) < 10 || f[1] == "0" || f[2] != "0" {
			t.Fatalf("demo row sent nothing or failed: %q", l)
		}
	}
}

func TestBenchUsageErrors(t *testing.T) {
	clearEnv(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--policies", "precise,magic"}, `unknown policy "magic"`},
		{[]string{"--workload", "chatty"}, `unknown workload "chatty"`},
		{[]string{"--workload", "trace:"}, "want trace:PATH"},
		{[]string{"--workload", "faults", "--target-url", "http://127.0.0.1:1"}, "cannot run with --target-url"},
		{[]string{"--holdback", "0.9"}, "--holdback 0.9"},
		{[]string{"--speculative-ttl", "soon"}, "--speculative-ttl"},
		{[]string{"--gap", "-1s"}, "--gap must not be negative"},
		{[]string{"--workload", "trace:/nonexistent/trace.jsonl"}, "no such file"},
		{[]string{"--rates", "3,x"}, `rate "x"`},
		{[]string{"--arrival", "bursty"}, `unknown arrival "bursty"`},
		{[]string{"--text", "runes"}, `unknown text vocabulary "runes"`},
		{[]string{"--profile", "a100"}, `unknown profile "a100"`},
		{[]string{"--target-url", "localhost:8000"}, "--target-url"},
		{[]string{"--target-url", "http://127.0.0.1:1", "--policies", "precise"}, "--policies: with --target-url"},
		{[]string{"--model", "m"}, "--model goes with --target-url"},
		{[]string{"--groups", "-1"}, "--groups must not be negative"},
		{[]string{"--rates", "1", "--stage-duration", "100ms"}, "no requests"},
		{[]string{"--engine", "des", "--prefill-pods", "1"}, "--prefill-pods: the des engine"},
		{[]string{"--engine", "live", "--prefill-pods", "1", "--policies", "precise,oracle"}, "--prefill-pods: the oracle"},
		{[]string{"--engine", "live", "--workload", "paired-gap", "--prefill-pods", "1"}, "--prefill-pods: the paired-gap workload"},
		{[]string{"--engine", "live", "--pods", "2", "--prefill-pods", "2"}, "prefill pods 2"},
		{[]string{"--engine", "live", "--flow-control", "on"}, "runs without flow control; give --engine des"},
		{[]string{"--engine", "live", "--slo-ttft", "interactive=1s"}, "flow control's, which runs on the des engine"},
		{[]string{"--engine", "des", "--flow-control", "maybe"}, "want on, off, or on,off"},
		{[]string{"--engine", "des", "--flow-control", "on,on"}, "on named twice"},
		{[]string{"--engine", "des", "--slo-ttft", "interactive"}, "want CLASS=DURATION"},
		{[]string{"--engine", "des", "--slo-ttft", "a=1s", "--slo-ttft", "a=2s"}, `class "a" given twice`},
		{[]string{"--workload", "overload", "--quick", "--slo-ttft", "interactive=1s"}, `name class "batch"`},
		{[]string{"--engine", "des", "--tenant-share", "team-a"}, "want TENANT=WEIGHT"},
		{[]string{"--engine", "des", "--tenant-share", "team-a=-1"}, "a share must be a positive"},
		{[]string{"--engine", "des", "--dispatch-budget", "-1s"}, "--dispatch-budget"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, errOut, code := runCLI(t, "", append([]string{"bench"}, tc.args...)...)
			if code != exitUsage || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
				t.Fatalf("code %d stderr %q: want exit 2 and one line with %q", code, errOut, tc.want)
			}
		})
	}
}
