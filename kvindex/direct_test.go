package kvindex

import (
	"slices"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/manualclock"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/targetid"
)

func TestDirectSequences(t *testing.T) {
	for _, tc := range []struct {
		name        string
		seqs        []uint64
		handled     []uint64
		gaps        uint64
		unrecovered uint64
		restarts    int
	}{
		{name: "in order", seqs: []uint64{0, 1, 2}, handled: []uint64{0, 1, 2}},
		{name: "a gap is unrecovered without replay", seqs: []uint64{0, 1, 4, 5}, handled: []uint64{0, 1, 4, 5}, gaps: 1, unrecovered: 2},
		{name: "backwards is a restart", seqs: []uint64{0, 1, 2, 0, 1}, handled: []uint64{0, 1, 2, 0, 1}, restarts: 1},
		{name: "a publisher numbering from 1", seqs: []uint64{1, 2}, handled: []uint64{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := manualclock.New()
			var handled []uint64
			restarts := 0
			d := NewDirect(DirectConfig{
				Target:    targetid.ID{Endpoint: "http://pod:8000"},
				Handle:    func(seq uint64, _ *events.Batch, _ bool) { handled = append(handled, seq) },
				Restarted: func() { restarts++ },
				Now:       clk.Now,
			})
			if st := d.Status(); !st.Connected || st.HaveSeq {
				t.Fatalf("new stream: %+v, want connected without a sequence", st)
			}
			for _, s := range tc.seqs {
				clk.Advance(time.Second)
				d.Deliver(s, &events.Batch{Events: []events.Event{{Kind: events.KindAllBlocksCleared}}})
			}
			st := d.Status()
			if len(handled) != len(tc.handled) {
				t.Fatalf("handled %v, want %v", handled, tc.handled)
			}
			for i := range handled {
				if handled[i] != tc.handled[i] {
					t.Fatalf("handled %v, want %v", handled, tc.handled)
				}
			}
			if st.Gaps != tc.gaps || st.Unrecovered != tc.unrecovered || restarts != tc.restarts {
				t.Errorf("gaps %d, unrecovered %d, restarts %d; want %d, %d, %d", st.Gaps, st.Unrecovered, restarts, tc.gaps, tc.unrecovered, tc.restarts)
			}
			if !st.LastEvent.Equal(clk.Now()) || st.LastSeq != tc.seqs[len(tc.seqs)-1] {
				t.Errorf("last event %v seq %d, want the injected clock's %v and seq %d", st.LastEvent, st.LastSeq, clk.Now(), tc.seqs[len(tc.seqs)-1])
			}
		})
	}
}

// TestDirectReplay: with the pod's replay buffer, an in-process stream
// recovers what a subscriber recovers through the replay socket: a gap, a
// late first batch, and what a cut connection missed (caught up when it
// reconnects, without waiting for the next batch).
func TestDirectReplay(t *testing.T) {
	batch := &events.Batch{Events: []events.Event{{Kind: events.KindAllBlocksCleared}}}
	// The pod published 0..9; the buffer holds them all.
	buffer := func(start uint64, fn func(uint64, *events.Batch) bool) {
		for s := start; s < 10; s++ {
			if !fn(s, batch) {
				return
			}
		}
	}
	type step struct {
		deliver uint64
		cut     bool // Disconnect, then deliver nothing
		mend    bool // Connect
	}
	for _, tc := range []struct {
		name    string
		steps   []step
		handled []uint64
		gaps    uint64
	}{
		{name: "a gap is replayed", steps: []step{{deliver: 0}, {deliver: 1}, {deliver: 4}}, handled: []uint64{0, 1, 2, 3, 4}, gaps: 1},
		{name: "a late join replays from 0", steps: []step{{deliver: 3}, {deliver: 4}}, handled: []uint64{0, 1, 2, 3, 4}},
		{name: "a reconnection catches up", steps: []step{{deliver: 0}, {deliver: 1}, {cut: true}, {mend: true}}, handled: []uint64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := manualclock.New()
			var handled []uint64
			d := NewDirect(DirectConfig{
				Target: targetid.ID{Endpoint: "http://pod:8000"},
				Handle: func(seq uint64, _ *events.Batch, _ bool) { handled = append(handled, seq) },
				Now:    clk.Now, Replay: buffer,
			})
			for _, s := range tc.steps {
				clk.Advance(time.Second)
				switch {
				case s.cut:
					d.Disconnect()
					if st := d.Status(); st.Connected || !st.ConnectionChanged.Equal(clk.Now()) {
						t.Fatalf("after Disconnect: %+v", st)
					}
				case s.mend:
					d.Connect()
				default:
					d.Deliver(s.deliver, batch)
				}
			}
			if !slices.Equal(handled, tc.handled) {
				t.Fatalf("handled %v, want %v", handled, tc.handled)
			}
			if st := d.Status(); st.Gaps != tc.gaps || st.Unrecovered != 0 || !st.Connected {
				t.Errorf("gaps %d, unrecovered %d, connected %v; want %d, 0, true", st.Gaps, st.Unrecovered, st.Connected, tc.gaps)
			}
		})
	}
}
