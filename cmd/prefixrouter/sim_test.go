package main

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestSimFlagErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // fragment of the one-line error
	}{
		{"no pods", []string{"--pods", "0"}, "--pods"},
		{"unknown profile", []string{"--profile", "a100"}, "--profile"},
		{"unknown flag", []string{"--bogus"}, "bogus"},
		{"bad listen", []string{"--listen", "nohost"}, "--listen"},
		{"bad port", []string{"--listen", "127.0.0.1:99999"}, "--listen"},
		{"empty hash seed", []string{"--hash-seed", ""}, "--hash-seed"},
		{"bad hash algo", []string{"--hash-algo", "md5"}, "--hash-algo"},
		{"bad encoding", []string{"--event-encoding", "json"}, "--event-encoding"},
		{"zero time scale", []string{"--time-scale", "0"}, "--time-scale"},
		{"unknown kv spec", []string{"--kv-spec", "mamba"}, "--kv-spec"},
		{"zero sliding window", []string{"--kv-spec", "hybrid", "--sliding-window", "0"}, "--sliding-window"},
		{"all pods prefill", []string{"--pods", "2", "--prefill-pods", "2"}, "--prefill-pods"},
		{"prefill pods with one pod", []string{"--prefill-pods", "1"}, "--prefill-pods"},
		{"negative prefill pods", []string{"--pods", "2", "--prefill-pods", "-1"}, "--prefill-pods"},
		{"negative kv transfer time", []string{"--kv-transfer-per-block", "-1ms"}, "--kv-transfer-per-block"},
		{"negative cpu tier", []string{"--cpu-offload-blocks", "-1"}, "--cpu-offload-blocks"},
		{"zero cpu load time", []string{"--cpu-offload-blocks", "8", "--cpu-load-per-block", "0s"}, "--cpu-load-per-block"},
		{"cpu tier with hybrid", []string{"--cpu-offload-blocks", "8", "--kv-spec", "hybrid"}, "hybrid"},
		{"bad drop probability", []string{"--drop-events", "2"}, "drop_events"},
		{"overlapping ports", []string{"--listen", "127.0.0.1:15000", "--events-port", "15000"}, "overlap"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, "", append([]string{"sim"}, tc.args...)...)
			if code != exitUsage {
				t.Fatalf("exit %d, want %d (stderr %q)", code, exitUsage, errOut)
			}
			if out != "" {
				t.Fatalf("stdout %q, want nothing", out)
			}
			if !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
				t.Fatalf("stderr %q, want one line naming %q", errOut, tc.want)
			}
		})
	}
}

// lineBuffer is an io.Writer safe for the command's goroutine and the test,
// which waits for lines on it.
type lineBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	wrote chan struct{}
}

func (b *lineBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case b.wrote <- struct{}{}:
	default:
	}
	return b.buf.Write(p)
}

func (b *lineBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := strings.TrimSuffix(b.buf.String(), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// TestSimRunsUntilCancelled starts two pods on OS-chosen ports, checks the
// endpoint lines and that the pods serve, then cancels the context as a
// SIGINT would and expects a clean exit with every listener closed.
func TestSimRunsUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines, wait := startSim(ctx, t, 2, "--pods", "2", "--profile", "tiny",
		"--listen", "127.0.0.1:0", "--events-port", "0", "--log-level", "error",
		"--hash-seed", "random", "--kv-spec", "hybrid", "--cpu-offload-blocks", "0", "--time-scale", "100")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2: %q", len(lines), lines)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	var bases []string
	for _, line := range lines {
		u, err := url.Parse(line)
		if err != nil {
			t.Fatalf("endpoint %q: %v", line, err)
		}
		q := u.Query()
		if u.Scheme != "http" || u.Hostname() != "127.0.0.1" || u.Port() == "0" ||
			!strings.HasPrefix(q.Get("events"), "tcp://127.0.0.1:") || !strings.HasPrefix(q.Get("replay"), "tcp://127.0.0.1:") ||
			q.Get("dp") != "1" || q.Get("model") != "sim-tiny" || q.Has("role") {
			t.Fatalf("endpoint %q is not a serve --endpoint value", line)
		}
		base := u.Scheme + "://" + u.Host
		bases = append(bases, base)
		resp, err := client.Get(base + "/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s/health: %d", base, resp.StatusCode)
		}
	}
	if bases[0] == bases[1] {
		t.Fatalf("both pods on %s", bases[0])
	}
	cancel()
	if code, stderr := wait(); code != 0 {
		t.Fatalf("exit %d after cancel: %s", code, stderr)
	}
	client.CloseIdleConnections()
	for _, base := range bases {
		if resp, err := client.Get(base + "/health"); err == nil {
			resp.Body.Close()
			t.Fatalf("%s still serving after exit", base)
		}
	}
}

// TestSimPrefillPodsAnnounceRoles: with --prefill-pods the first pods are
// announced as prefill pods and the rest as decode pods, in the endpoint
// syntax serve takes.
func TestSimPrefillPodsAnnounceRoles(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines, wait := startSim(ctx, t, 3, "--pods", "3", "--prefill-pods", "1", "--profile", "tiny",
		"--listen", "127.0.0.1:0", "--events-port", "0", "--log-level", "error", "--kv-transfer-per-block", "50us")
	for i, want := range []string{"prefill", "decode", "decode"} {
		u, err := url.Parse(lines[i])
		if err != nil {
			t.Fatalf("endpoint %q: %v", lines[i], err)
		}
		if got := u.Query()["role"]; len(got) != 1 || got[0] != want {
			t.Fatalf("pod %d endpoint %q: role %v, want %s", i, lines[i], got, want)
		}
	}
	cancel()
	if code, stderr := wait(); code != 0 {
		t.Fatalf("exit %d after cancel: %s", code, stderr)
	}
}

// startSim runs `prefixrouter sim ARGS` until ctx ends and returns its
// first n endpoint lines once printed, and wait, which returns its exit
// code and stderr once it has ended.
func startSim(ctx context.Context, t *testing.T, n int, args ...string) (lines []string, wait func() (int, string)) {
	t.Helper()
	stdout := &lineBuffer{wrote: make(chan struct{}, 1)}
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"prefixrouter", "sim"}, args...), strings.NewReader(""), stdout, &stderr)
	}()
	deadline := time.After(20 * time.Second)
	for len(stdout.lines()) < n {
		select {
		case <-stdout.wrote:
		case code := <-done:
			t.Fatalf("sim exited early with %d: %s", code, stderr.String())
		case <-deadline:
			t.Fatalf("no %d endpoint lines within 20s; stdout %q", n, stdout.lines())
		}
	}
	return stdout.lines(), func() (int, string) {
		select {
		case code := <-done:
			return code, stderr.String()
		case <-time.After(20 * time.Second):
			t.Fatal("sim did not exit within 20s of cancel")
			return 0, ""
		}
	}
}
