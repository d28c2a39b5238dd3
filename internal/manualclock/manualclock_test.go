package manualclock

import (
	"testing"
	"time"
)

func TestAdvance(t *testing.T) {
	c := New()
	t0 := c.Now()
	if c.Now() != t0 {
		t.Fatal("the clock moved by itself")
	}
	c.Advance(1500 * time.Millisecond)
	if got := c.Now().Sub(t0); got != 1500*time.Millisecond {
		t.Fatalf("advanced by %s, want 1.5s", got)
	}
}
