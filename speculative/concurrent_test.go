package speculative

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestConcurrentUse runs the request path, the event path, the slow
// evaluations, the view and a scrape at once (run it with -race), then
// checks that every prediction is accounted for exactly once.
func TestConcurrentUse(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newRigOn(t, DefaultConfig(), reg)
	ctx, cancel := context.WithCancel(t.Context())
	var wg, requestPath sync.WaitGroup
	const workers, requests = 4, 300
	for w := range workers {
		requestPath.Add(1)
		go func() {
			defer requestPath.Done()
			for i := range requests {
				id := podA
				if i%3 == 0 {
					id = podB
				}
				prompt := keyRange((i%40)*10, 12) // prompts overlap, so predictions repeat
				c := r.Assign(Conversation{Model: "m", RequestID: fmt.Sprint(w, i), Keys: prompt})
				ext := r.Lookup(id, prompt, 2)
				f := r.Follow(ext.Ref, "follower")
				h := r.Predict(dispatch(id, "r"), prompt[2:])
				if i%17 == 0 {
					h.Withdraw()
				}
				r.Record(Outcome{Model: "m", Arm: c.Arm, PromptTokens: 192, PredictedCached: 64, ReportedCached: 32, CachedReported: true, Follower: f})
				_ = r.Trust(id)
			}
		}()
	}
	wg.Add(1)
	go func() { // the event path
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			r.confirm(podA, keyRange((i%40)*10+2, 6))
			if i%500 == 0 {
				r.Invalidate(podB, ReasonCleared)
			}
		}
	}()
	wg.Add(1)
	go func() { // Run, the admin listener and a scraper
		defer wg.Done()
		for ctx.Err() == nil {
			r.clock.Advance(50 * time.Millisecond)
			r.tick()
			_ = r.View()
			_ = testutil.CollectAndCount(reg)
		}
	}()
	requestPath.Wait()
	cancel()
	wg.Wait()

	r.settle(20 * time.Second)
	for _, tv := range r.View().Targets {
		m := tv.MatureTotal
		ended := m.Confirmed + m.Expired + m.Invalidated + m.Withdrawn + m.Unknown
		if m.Inserted != int64(tv.Funnel.Inserted) || ended != m.Inserted || tv.Pending.Live != 0 {
			t.Errorf("%s: inserted %d (funnel %d), ended %d, live %d", tv.Target, m.Inserted, tv.Funnel.Inserted, ended, tv.Pending.Live)
		}
	}
}
