package health_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/health"
)

// Example shows how the router wires the monitor: construction from flags,
// registry changes driving the event plane, the lock-free request path, and
// the admin view.
func Example() {
	cfg := health.DefaultConfig()
	cfg.Endpoints = []string{"http://127.0.0.1:8000?dp=2&model=llama"}

	m, err := health.New(cfg, health.Deps{
		Registerer: prometheus.NewRegistry(),
		Logger:     slog.Default(),
	})
	if err != nil {
		slog.Error("health", "err", err)
		return
	}
	// Tell the event plane where each target publishes; invalidate
	// placements and predictions of removed targets.
	cancel := m.Subscribe(func(c health.Change) {
		switch c.Kind {
		case health.Added, health.Updated:
			_ = c.Target.Events // (re)connect its subscriber here, replay from c.Target.Replay
		case health.Removed:
			_ = c.Target.ID // close the subscriber, drop its placements and predictions
		}
	})
	defer cancel()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go m.Run(ctx)

	// Request path: no locks.
	snap := m.Snapshot()
	var best *health.Target
	for _, t := range snap.ForModel("llama") {
		if !t.CanRoute() || t.Spec.Role == health.RolePrefill {
			continue
		}
		busy := t.Busy() // scraped gauges + this router's in-flight accounting
		_ = busy
		best = t
	}
	if best != nil {
		f := best.Dispatch(4096, 1024) // prompt tokens, uncached estimate
		f.Revise(4096, 512)            // the router learned more before the first byte
		f.FirstByte()                  // when the first response byte arrives
		_, _ = f.Tokens()              // what the pod computed, for the event plane
		f.Finish(health.OutcomeSuccess)
	}

	// Admin: GET /debug/targets.
	_ = json.NewEncoder(os.Stdout).Encode
	_ = m.Debug()
}
