package router

import (
	"context"
	"sync"
	"testing"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// TestSettledTailCountsOnlyBlocksHeldBeforeDispatch: a plan that settled
// early looks the winner's whole run up after dispatch, by when the pod may
// already have reported the blocks this very request made it store. Those
// must not count as hits the router predicted; when the index can no
// longer tell which blocks came since, the run read before dispatch
// stands. The request's flight, dispatched with the run read so far, is
// corrected to what the pod has to compute when the tail ends, or, if the
// pod answers first, expects nothing.
func TestSettledTailCountsOnlyBlocksHeldBeforeDispatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// report stores the request's own blocks as the pod's events do.
		report func(ix *kvindex.Index, holder targetid.ID, keys []kvindex.Key, held int)
		// want is the final run given the holder's run before dispatch
		// and the blocks the plan read.
		want func(held, read int) int
	}{
		{"the pod reports the rest",
			func(ix *kvindex.Index, holder targetid.ID, keys []kvindex.Key, held int) {
				ix.Store(holder, kvindex.TierGPU, keys[held:])
			},
			func(held, read int) int { return held }},
		{"the pod restarted and reports the whole prompt",
			func(ix *kvindex.Index, holder targetid.ID, keys []kvindex.Key, held int) {
				ix.Clear(holder)
				ix.Store(holder, kvindex.TierGPU, keys)
			},
			func(held, read int) int { return read }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newFakePod(t, "A", 16, true), newFakePod(t, "B", 16, true)
			cfg := DefaultConfig()
			cfg.Policy = brain.PolicyPrecise
			cfg.Events.BlockSize = 16
			cfg.Health = fastHealth(a.endpoint(), b.endpoint())
			r := startRouter(t, cfg, "m=bytes")
			waitFor(t, "pods fresh", func() bool { return freshCount(r, "m") == 2 })
			waitFor(t, "block keys", func() bool { return r.ev.Keys() != nil })
			var holder, other targetid.ID
			for _, tg := range r.mon.Snapshot().Targets {
				if tg.ID.Endpoint == a.srv.URL {
					holder = tg.ID
				} else {
					other = tg.ID
				}
			}

			body := chatBody(1, true)
			req := new(Request)
			if err := ParseRequest(EndpointChat, body, req); err != nil {
				t.Fatal(err)
			}
			keys := chatKeysAsPodsSee(t, r, "m=bytes")(body)
			// Both pods hold the opening; A holds half the prompt.
			held := len(keys) / 2
			r.ev.Index().Store(other, kvindex.TierGPU, keys[:8])
			r.ev.Index().Store(holder, kvindex.TierGPU, keys[:held])

			d, aerr := r.route(context.Background(), nil, req, "", false)
			if aerr != nil {
				t.Fatal(aerr)
			}
			winner := d.Target()
			read := winner.ConfirmedBlocks
			if !d.Settled() || winner.Target.ID != holder || read >= held {
				t.Fatalf("settled %v on %v after a run of %d blocks; the test needs A chosen before reading its whole run of %d",
					d.Settled(), winner.Target.ID, read, held)
			}

			tc.report(r.ev.Index(), holder, keys, held)
			var mbuf [4]kvindex.Match
			for _, m := range r.ev.Index().Lookup(mbuf[:0], keys) {
				if m.Target == holder && m.Blocks != len(keys) {
					t.Fatalf("after the report A holds %d blocks, want all %d", m.Blocks, len(keys))
				}
			}
			tail := brain.NewTail(d.Decision)
			atDispatch := d.View(tail, d.Chosen())
			// An attempt answered before the tail is done: its flight
			// expects nothing of the pod's events.
			queued := func() int64 { return winner.Target.Busy().QueuedUncachedTokens }
			dispatch := func() *brain.Booking { return d.Dispatch(brain.Dispatch{Tail: tail}) }
			early := dispatch()
			if v := early.FirstByte(); v.Final || v.Predicted != atDispatch.Predicted || queued() != 0 {
				t.Fatalf("tail not done: final %v, predicted %d, queued uncached %d; want false, %d and 0", v.Final, v.Predicted, queued(), atDispatch.Predicted)
			}
			early.End(health.OutcomeSuccess)

			// An attempt still waiting when the tail ends is corrected
			// then, before its first byte, to what the pod has to
			// compute.
			waiting := dispatch()
			var tails sync.WaitGroup
			tail.Start(r.ev.Index(), &tails)
			tails.Wait()
			want := tc.want(held, read)
			v := d.View(tail, d.Chosen())
			if !v.Final || v.Confirmed != want {
				t.Fatalf("final %v, run %d blocks, want %d (held before dispatch %d, read %d, whole prompt %d)",
					v.Final, v.Confirmed, want, held, read, len(keys))
			}
			// vLLM never serves the last token from cache: hits stop at
			// the last full block before it.
			count := v.Prompt.Count
			cached := min(want*16, (count-1)/16*16)
			if v.Predicted != cached || queued() != int64(count-cached) {
				t.Fatalf("tail done: predicted %d, queued uncached %d, want %d and %d", v.Predicted, queued(), cached, count-cached)
			}
			if v := waiting.FirstByte(); v.Predicted != cached || queued() != 0 {
				t.Fatalf("answered: predicted %d, queued uncached %d; want %d and 0", v.Predicted, queued(), cached)
			}
			waiting.End(health.OutcomeSuccess)
			if queued() != 0 {
				t.Fatalf("after both attempts: queued uncached %d", queued())
			}
		})
	}
}
