package lockedhist

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestBuckets: observations land in the first bucket whose bound they do
// not exceed, cumulated on export, the rest in +Inf.
func TestBuckets(t *testing.T) {
	h := New([]float64{1, 2, 4})
	for _, v := range []float64{0.5, 1, 1.5, 4, 9} {
		h.Observe(v)
	}
	var m dto.Metric
	if err := h.Metric(prometheus.NewDesc("x", "x", []string{"l"}, nil), "v").Write(&m); err != nil {
		t.Fatal(err)
	}
	hist := m.GetHistogram()
	want := []uint64{2, 3, 4}
	for i, b := range hist.GetBucket() {
		if b.GetCumulativeCount() != want[i] {
			t.Errorf("bucket ≤ %v: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want[i])
		}
	}
	if hist.GetSampleCount() != 5 || hist.GetSampleSum() != 16 || h.Count() != 5 {
		t.Fatalf("count %d sum %v", hist.GetSampleCount(), hist.GetSampleSum())
	}
}
