package sim

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestFleetCloseStopsEverything(t *testing.T) {
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := StartFleet(ctx, Config{Pods: 3, DP: 2, Profile: testProfile(), Host: "127.0.0.1", TimeScale: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	eps := f.Endpoints()
	if len(eps) != 3 {
		t.Fatalf("endpoints %v", eps)
	}
	for _, ep := range eps {
		if !strings.HasPrefix(ep, "http://127.0.0.1:") || !strings.Contains(ep, "&dp=2&model=sim-test") {
			t.Fatalf("endpoint %q", ep)
		}
	}
	// A request in flight when the fleet closes must not keep it alive.
	url := f.Pods[0].URL()
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1,2,3],"max_tokens":800}`))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for f.Pods[0].Stats()[0].Running+f.Pods[0].Stats()[1].Running == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	<-done
	if err := f.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	http.DefaultClient.CloseIdleConnections()
	for time.Now().Before(deadline) && runtime.NumGoroutine() > before {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines after close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
	if _, err := http.Get(url + "/health"); err == nil {
		t.Fatal("pod still answers after close")
	}
}

func TestStartFleetFixedPortsAndConflicts(t *testing.T) {
	// Fixed ports: pod i on HTTP+i; events base + 2·DP·i, replay after the
	// events. Free bases are found by starting on port 0 and reusing those
	// numbers after closing; another process may grab one in between (or
	// the replay port next to the probed events port may be taken), so a
	// failed start probes again, a bounded number of times, instead of
	// skipping.
	ctx := context.Background()
	var (
		f                *Fleet
		cfg              Config
		httpPort, evPort int
		lastErr          error
	)
	for attempt := 0; attempt < 20 && f == nil; attempt++ {
		probe := startTestFleet(t, Config{})
		httpPort = portOf(t, probe.Pods[0].URL())
		evPort = probe.Pods[0].EventsPort()
		if err := probe.Close(); err != nil {
			t.Fatal(err)
		}
		cfg = Config{Pods: 1, Profile: testProfile(), Host: "127.0.0.1", HTTPPort: httpPort, EventsPort: evPort,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		f, lastErr = StartFleet(ctx, cfg)
	}
	if f == nil {
		t.Fatalf("no free fixed ports in 20 probes: %v", lastErr)
	}
	defer f.Close()
	p := f.Pods[0]
	if portOf(t, p.URL()) != httpPort || p.EventsPort() != evPort || p.ReplayPort() != evPort+1 {
		t.Fatalf("ports %s %d %d, want %d %d %d", p.URL(), p.EventsPort(), p.ReplayPort(), httpPort, evPort, evPort+1)
	}
	// A second fleet on the same ports fails cleanly.
	if f2, err := StartFleet(ctx, cfg); err == nil {
		f2.Close()
		t.Fatal("second fleet bound the same ports")
	}
}

func portOf(t *testing.T, url string) int {
	t.Helper()
	i := strings.LastIndexByte(url, ':')
	var p int
	for _, c := range url[i+1:] {
		p = p*10 + int(c-'0')
	}
	return p
}
