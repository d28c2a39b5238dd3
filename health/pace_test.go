package health

import (
	"math"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/targetid"
)

func TestPaceFit(t *testing.T) {
	for _, tc := range []struct {
		name            string
		tokens          func(i int) float64
		floor, perToken float64 // the fleet's truth, seconds
		wantFloor       float64
	}{
		{"queues of every length: floor and slope", func(i int) float64 { return float64(i%20) * 500 }, 0.03, 1e-4, 0.03},
		{"every request alike: the ratio", func(int) float64 { return 2000 }, 0.03, 1e-4, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f paceFit
			for i := range 400 {
				x := tc.tokens(i)
				f.observe(x, time.Duration((tc.floor+tc.perToken*x)*float64(time.Second)))
			}
			p := f.pace()
			if !p.Known() {
				t.Fatalf("pace %+v not known after 400 samples", p)
			}
			// Whatever the fit, the time of the typical queue is right.
			x := tc.tokens(7)
			if got, want := p.Time(x).Seconds(), tc.floor+tc.perToken*x; math.Abs(got-want) > 0.01*want {
				t.Fatalf("pace %+v says %v s for %v tokens, want %v", p, got, x, want)
			}
			if math.Abs(p.Floor-tc.wantFloor) > 1e-3 {
				t.Fatalf("floor %v, want %v", p.Floor, tc.wantFloor)
			}
		})
	}
	var f paceFit
	for range paceMinSamples - 1 {
		f.observe(100, time.Millisecond)
	}
	if f.pace().Known() {
		t.Fatal("known before paceMinSamples first bytes")
	}
	f.observe(-1, time.Second)
	f.observe(10, 0)
	if f.pace().Samples != paceMinSamples-1 {
		t.Fatal("a negative queue or a zero time was taken as a sample")
	}
}

// TestFlightFeedsThePace: a flight given its queue ahead feeds the
// target's pace at its first byte; one not given does not.
func TestFlightFeedsThePace(t *testing.T) {
	now := time.Unix(0, 0)
	tg, err := Standalone(targetid.ID{Endpoint: "http://pod:8000"}, "m", DefaultConfig(), func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		f := tg.Dispatch(1000, 1000)
		if i%2 == 0 {
			f.Ahead(1000)
		}
		now = now.Add(200 * time.Millisecond)
		f.FirstByte()
		f.Finish(OutcomeSuccess)
	}
	p := tg.Pace()
	if p.Samples != 5 || math.Abs(p.PerToken-1e-4) > 1e-9 {
		t.Fatalf("pace %+v, want 5 samples of 2,000 tokens in 200 ms", p)
	}
}
