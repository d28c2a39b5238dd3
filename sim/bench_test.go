package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkPodRequests drives one pod over real loopback HTTP with 32
// concurrent clients (shared-prefix prompts of 256 tokens, 8 output tokens)
// and reports requests/s. Run it on one core to check the simulator's own
// cost: GOMAXPROCS=1 go test -run '^$' -bench PodRequests ./sim.
// lag_ms is the largest wall-clock lag of the model clock seen at the end:
// 0 means the engine kept up with its profile and the HTTP work, not the
// simulation, set the pace.
func BenchmarkPodRequests(b *testing.B) {
	for _, bc := range []struct {
		name    string
		profile string
		scale   float64
		stream  bool
	}{
		{"tiny-x10", "tiny", 10, false},
		{"tiny-x10-stream", "tiny", 10, true},
		{"h100-8b-x100", "h100-8b", 100, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			prof, err := LookupProfile(bc.profile)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			f, err := StartFleet(ctx, Config{Profile: prof, TimeScale: bc.scale, Host: "127.0.0.1",
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			pod := f.Pods[0]
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
			defer client.CloseIdleConnections()
			bodies := make([][]byte, 64)
			for i := range bodies {
				prompt := append(tokenRange((i%8)*10000, 192), tokenRange(100000+i*100, 64)...)
				bodies[i], _ = json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 8, "stream": bc.stream})
			}
			var next, failed atomic.Int64
			b.SetParallelism(32)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					body := bodies[next.Add(1)%int64(len(bodies))]
					resp, err := client.Post(pod.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
					if err != nil {
						failed.Add(1)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						failed.Add(1)
					}
				}
			})
			el := time.Since(start)
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d requests failed", n)
			}
			st := pod.Stats()[0]
			b.ReportMetric(float64(b.N)/el.Seconds(), "req/s")
			b.ReportMetric(float64(st.Lag)/float64(time.Millisecond), "lag_ms")
			if st.PrefixQueries > 0 {
				b.ReportMetric(float64(st.PrefixHits)/float64(st.PrefixQueries), "hit_ratio")
			}
		})
	}
}
