package brain

import (
	"slices"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/internal/manualclock"
	"github.com/prefixrouter/prefixrouter/speculative"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// recordingPeers is what the peer replicas are told, in order.
type recordingPeers struct {
	calls  []string
	shared []Prediction
}

func (p *recordingPeers) Changed(targetid.ID) { p.calls = append(p.calls, "changed") }
func (p *recordingPeers) Share(pr Prediction) uint64 {
	p.calls = append(p.calls, "share")
	p.shared = append(p.shared, pr)
	return uint64(len(p.shared))
}
func (p *recordingPeers) Withdraw(uint64) { p.calls = append(p.calls, "withdraw") }

// TestBookingTellsThePeers: a speculative booking tells the peers of its
// target's work at the dispatch, the first byte and the end, shares the
// blocks it predicted once, and withdraws them when the pod rejects the
// request; its flight leaves the target's ledger at the end, once.
func TestBookingTellsThePeers(t *testing.T) {
	clk := manualclock.New()
	ev := eventplane.DefaultConfig()
	ev.BlockSize = 16
	plane, err := eventplane.New(ev, eventplane.Deps{Logger: quietLogger(), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	scfg := speculative.DefaultConfig()
	scfg.Holdback = 0
	spec, err := speculative.New(scfg, speculative.Deps{Logger: quietLogger(), Now: clk.Now,
		Stream: func(targetid.ID) speculative.Stream { return speculative.Stream{Fresh: true} }})
	if err != nil {
		t.Fatal(err)
	}
	id := targetid.ID{Endpoint: "http://pod-0:8000"}
	tg, err := health.Standalone(id, "m", health.DefaultConfig(), clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	spec.AddTarget(id)
	plane.SetCaches(map[targetid.ID]eventplane.Cache{id: {Serving: true, Reported: true, BlockSize: 16, HashAlgo: ev.HashAlgo, NumGPUBlocks: 1000}})
	plane.SetTarget(id, eventplane.Source{InProcess: true})
	dc := New(PolicySpeculative, DefaultCostConfig(), plane, spec)
	ids := make([]uint32, 4*16+3)
	for i := range ids {
		ids[i] = uint32(i + 1)
	}
	for _, tc := range []struct {
		name   string
		reject bool
		want   []string
	}{
		{"answered", false, []string{"changed", "share", "changed", "changed"}},
		{"rejected before computing", true, []string{"changed", "share", "withdraw", "changed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := dc.Decide(Input{Model: "m", Targets: []*health.Target{tg}, Prompt: IDsPrompt(slices.Clone(ids)),
				Conversation: speculative.Conversation{RequestID: tc.name}})
			if err != nil {
				t.Fatal(err)
			}
			p := &recordingPeers{}
			b := d.Dispatch(Dispatch{RequestID: tc.name, Peers: p})
			if got := tg.Busy().InFlight; got != 1 {
				t.Fatalf("in flight after dispatch %d, want 1", got)
			}
			if tc.reject {
				b.Withdraw()
				b.End(health.OutcomeUpstreamError)
			} else {
				clk.Advance(time.Millisecond)
				b.FirstByte()
				b.End(health.OutcomeSuccess)
			}
			b.End(health.OutcomeSuccess) // once only
			if !slices.Equal(p.calls, tc.want) {
				t.Fatalf("peers told %v, want %v", p.calls, tc.want)
			}
			if len(p.shared) != 1 {
				t.Fatalf("shared %d predictions, want 1", len(p.shared))
			}
			if pr := p.shared[0]; pr.Target != id || pr.Namespace.BlockSize != 16 || len(pr.Keys) == 0 {
				t.Fatalf("shared %+v, want blocks of 16 on %v", pr, id)
			}
			if got := tg.Busy().InFlight; got != 0 {
				t.Fatalf("in flight after the end %d, want 0", got)
			}
		})
	}
}
