package health

import (
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/internal/manualclock"
	"github.com/prefixrouter/prefixrouter/targetid"
)

func TestStandaloneTargetKeepsItsLedgerAcrossScrapes(t *testing.T) {
	clk := manualclock.New()
	id := targetid.ID{Endpoint: "http://pod:8000"}
	tg, err := Standalone(id, "m", Config{BreakerFailures: 2, BreakerCooldown: time.Second}, clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	if !tg.CanRoute() || !tg.Busy().Stale || tg.Spec.Models[0] != "m" {
		t.Fatalf("new target: routable %v, load %+v, models %v; want routable, unscraped, serving m", tg.CanRoute(), tg.Busy(), tg.Spec.Models)
	}
	f := tg.Dispatch(100, 60)
	scraped := tg.WithLoad(Load{Running: 3, Waiting: 1, KVUsage: 0.5, At: clk.Now()})
	b := scraped.Busy()
	if b.Running != 3 || b.Waiting != 1 || b.Stale || b.InFlight != 1 || b.QueuedUncachedTokens != 60 {
		t.Errorf("after a scrape: %+v, want the scrape's gauges and the dispatched flight", b)
	}
	if tg.Busy().Running != 0 {
		t.Error("WithLoad changed the target it was called on")
	}
	f.FirstByte()
	f.Finish(OutcomeUpstreamError)
	g := scraped.Dispatch(10, 10)
	g.Finish(OutcomeUpstreamError)
	if tg.CanRoute() || scraped.CanRoute() {
		t.Error("two upstream failures did not open the breaker the copies share")
	}
	clk.Advance(time.Second)
	if !tg.CanRoute() {
		t.Error("the breaker did not half-open after its cooldown on the injected clock")
	}
}

func TestStandaloneRefusesABadConfig(t *testing.T) {
	if _, err := Standalone(targetid.ID{Endpoint: "http://pod:8000"}, "m", Config{BreakerCooldown: -time.Second}, time.Now); err == nil {
		t.Fatal("a negative breaker cooldown was accepted")
	}
}
