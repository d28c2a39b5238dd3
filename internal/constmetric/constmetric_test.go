package constmetric

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestNew(t *testing.T) {
	d := prometheus.NewDesc("x_total", "x.", []string{"target"}, nil)
	var out dto.Metric
	if err := New(d, prometheus.CounterValue, 3, "a").Write(&out); err != nil || out.GetCounter().GetValue() != 3 {
		t.Fatalf("counter: %v, %v", out.String(), err)
	}
	if err := New(d, prometheus.GaugeValue, 1).Write(&out); err == nil {
		t.Fatal("a missing label wrote a metric; want the invalid metric's error")
	}
}
