package speculative

import (
	"strings"
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	tests := []struct {
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{nil, 0.99, 0},
		{ms(7), 0.5, 7 * time.Millisecond},
		{ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{ms(1, 2, 3, 4), 0.51, 3 * time.Millisecond},
		{hundred, 0.99, 99 * time.Millisecond},
		{hundred, 0.95, 95 * time.Millisecond},
		{hundred, 0.999, 100 * time.Millisecond},
		{hundred, 0.001, 1 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := Quantile(tt.sorted, tt.q); got != tt.want {
			t.Errorf("Quantile(%d samples, %v) = %s, want %s", len(tt.sorted), tt.q, got, tt.want)
		}
	}
}

func TestMinSamples(t *testing.T) {
	for q, want := range map[float64]int{0.99: 200, 0.5: 32, 0.95: 40, 0.999: latencyWindow} {
		if got := MinSamples(q); got != want {
			t.Errorf("MinSamples(%v) = %d, want %d", q, got, want)
		}
	}
}

// confirmBatch predicts n blocks on podA and confirms them after the
// given latencies, in order (each after the previous), starting at key
// from.
func confirmBatch(r *rig, from int, lat ...time.Duration) {
	r.Predict(dispatch(podA, "batch"), keyRange(from, len(lat)))
	passed := time.Duration(0)
	for i, d := range lat {
		r.clock.Advance(d - passed)
		passed = d
		r.confirm(podA, keyRange(from+i, 1))
	}
}

func repeat(d time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

// TestTTLController: 2 s until enough latencies are measured, then the
// TTL moves a fifth of the way each second toward quantile + backlog +
// timer resolution, and arrives there.
func TestTTLController(t *testing.T) {
	r := newRig(t, DefaultConfig())
	if got := r.TTL(podA); got != InitialTTL {
		t.Fatalf("TTL of an unknown target %s, want %s", got, InitialTTL)
	}
	confirmBatch(r, 0, repeat(500*time.Millisecond, 100)...)
	r.step(time.Second)
	tv := r.targetView(t, podA)
	if tv.TTL.S != 2 || !strings.Contains(tv.TTL.Why, "initial 2s: 100 of 200") {
		t.Fatalf("TTL with 100 samples: %+v", tv.TTL)
	}
	// p99 of 1,000 samples is the 990th: 889 at 0.5 s and 111 at 1.15 s.
	lat := append(repeat(500*time.Millisecond, 789), repeat(1150*time.Millisecond, 111)...)
	confirmBatch(r, 1000, lat...)
	r.streams.set(podA, Stream{Fresh: true, Backlog: 250 * time.Millisecond})
	want := TTLFor(1150*time.Millisecond, 250*time.Millisecond, TimerResolution, 5*time.Second) // 1.41 s
	r.step(time.Second)
	if got := r.TTL(podA); got != 1890*time.Millisecond {
		t.Fatalf("TTL after one evaluation %s, want 1.89s (2 s − 0.2 × 0.59 s, rounded up)", got)
	}
	prev := r.TTL(podA)
	for i := range 60 {
		r.step(time.Second)
		got := r.TTL(podA)
		if got > prev || got < want {
			t.Fatalf("evaluation %d: TTL %s after %s, toward %s", i, got, prev, want)
		}
		prev = got
	}
	if prev != want {
		t.Fatalf("TTL settled at %s, want %s", prev, want)
	}
	tv = r.targetView(t, podA)
	if tv.TTL.QuantileS != 1.15 || tv.TTL.BacklogS != 0.25 || tv.TTL.TargetS != 1.41 || !strings.Contains(tv.TTL.Why, "p99 of 1000 latencies 1.15s + backlog 250ms") {
		t.Fatalf("TTL view %+v", tv.TTL)
	}
}

// TestTTLLateConfirmations: confirmations after the deadline count in the
// quantile, so a TTL below the latency grows; those of a stream that was
// not fresh do not, so a broken pipe never stretches it.
func TestTTLLateConfirmations(t *testing.T) {
	r := newRig(t, DefaultConfig())
	for i := range 4 {
		confirmBatch(r, i*100, repeat(3*time.Second, 100)...)
		r.step(time.Second)
	}
	for range 30 {
		r.step(time.Second)
	}
	if got, want := r.TTL(podA), TTLFor(3*time.Second, 0, TimerResolution, 5*time.Second); got != want {
		t.Fatalf("TTL %s after confirmations 3 s after routing, want %s", got, want)
	}

	b := newRig(t, DefaultConfig())
	b.AddTarget(podA)
	b.streams.set(podA, Stream{Fresh: false})
	b.step(10 * time.Millisecond)
	b.streams.set(podA, Stream{Fresh: true})
	for i := range 4 {
		confirmBatch(b, i*100, repeat(3*time.Second, 100)...)
		b.streams.set(podA, Stream{Fresh: false})
		b.step(time.Second)
		b.streams.set(podA, Stream{Fresh: true})
	}
	b.settle(30 * time.Second)
	if got := b.TTL(podA); got != InitialTTL {
		t.Fatalf("TTL %s: stretched by confirmations of a broken pipe", got)
	}
	if n := b.targetView(t, podA).TTL.Samples; n != 0 {
		t.Fatalf("%d latency samples from a stream that was not fresh", n)
	}
}

func TestTTLFixedAndCapped(t *testing.T) {
	r := newRig(t, Config{TTL: 1500 * time.Millisecond})
	confirmBatch(r, 0, repeat(300*time.Millisecond, 300)...)
	r.settle(10 * time.Second)
	tv := r.targetView(t, podA)
	if tv.TTL.S != 1.5 || !strings.Contains(tv.TTL.Why, "fixed by --speculative-ttl 1.5s") {
		t.Fatalf("fixed TTL: %+v", tv.TTL)
	}
	if tv.Latency.Confirmed.Samples != 300 || val(tv.Latency.Confirmed.P50) != 0.3 {
		t.Fatalf("a fixed TTL still measures latency: %+v", tv.Latency)
	}

	c := newRig(t, Config{MaxStale: time.Second})
	if got := c.TTL(podA); got != time.Second {
		t.Fatalf("initial TTL under a 1 s max-stale: %s", got)
	}
	for i := range 3 {
		confirmBatch(c, i*100, repeat(1500*time.Millisecond, 100)...) // late: within the 1 s grace
		c.step(time.Second)
	}
	c.settle(30 * time.Second)
	if got := c.TTL(podA); got != time.Second {
		t.Fatalf("TTL %s past the 1 s max-stale", got)
	}
	if tv := c.targetView(t, podA); tv.TTL.TargetS != 1 || tv.Latency.Late.Samples != 300 {
		t.Fatalf("TTL view %+v, latency %+v: want the 1.51 s arithmetic capped at 1 s", tv.TTL, tv.Latency)
	}
}
