package tokenize

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestStreamChat steps a chat through a Stream, stopping early and then
// finishing: the ids equal EncodeChat's, the count estimate is near, and
// the encode is recorded once.
func TestStreamChat(t *testing.T) {
	promReg := prometheus.NewRegistry()
	reg := NewRegistry(Options{Registerer: promReg})
	defer reg.Close()
	var models []*Model
	for name, spec := range map[string]string{"qwen3": fetchedModel(t, "qwen3"), "bytes": "bytes"} {
		m, err := reg.Add(name, spec, ModeLocal)
		if err != nil {
			t.Fatal(err)
		}
		models = append(models, m)
	}
	req := chatTurns(t, 6, "What next?")
	for _, m := range models {
		_, want, err := m.EncodeChat(req)
		if err != nil {
			t.Fatal(err)
		}
		// The second pass estimates with the model's rate the first taught.
		for pass := range 2 {
			st, err := m.StreamChat(req, "")
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Step(); err != nil {
				t.Fatal(err)
			}
			first := slices.Clone(st.IDs())
			if !slices.Equal(first, want[:len(first)]) {
				t.Fatalf("%s: first step %v is not a prefix", m.Name(), first)
			}
			if est := st.EstimateCount(); pass == 1 && (est < len(want)*8/10 || est > len(want)*12/10) {
				t.Errorf("%s: estimate %d for %d tokens", m.Name(), est, len(want))
			}
			got, err := st.Finish()
			if err != nil || !slices.Equal(got, want) || st.EstimateCount() != len(want) {
				t.Fatalf("%s: finish %d ids (err %v), want %d", m.Name(), len(got), err, len(want))
			}
			if _, err := st.Finish(); err != nil {
				t.Fatal(err)
			}
		}
		if n := testutil.ToFloat64(reg.metrics.requests.WithLabelValues(m.Name(), "local")); n != 2 {
			t.Errorf("%s: %v encodes recorded, want 2", m.Name(), n)
		}
	}
}

func TestStreamRefusesRemote(t *testing.T) {
	reg := NewRegistry(Options{CacheMaxBytes: -1})
	defer reg.Close()
	m, err := reg.Add("r", "", ModeRemote)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.StreamChat(ChatRequest{Messages: []byte(`[]`)}, ""); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("chat: %v, want ErrNotLocal", err)
	}
	if _, err := m.StreamPrompt("x", true, ""); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("prompt: %v, want ErrNotLocal", err)
	}
}

// TestStreamAutoCompares: an auto model's stream compares its finished ids
// with the pod, and a mismatch switches the model to remote.
func TestStreamAutoCompares(t *testing.T) {
	reg := NewRegistry(Options{SampleRate: 1, CacheMaxBytes: -1})
	defer reg.Close()
	m, err := reg.Add("b", "bytes", ModeAuto)
	if err != nil {
		t.Fatal(err)
	}
	pod := newFakePod(t, []uint32{1, 2, 3})
	st, err := m.StreamPrompt(strings.Repeat("ab", 10), true, pod.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the switch to remote", func() bool { return m.Mode() == ModeRemote })
	if _, err := m.StreamPrompt("ab", true, pod.srv.URL); !errors.Is(err, ErrNotLocal) {
		t.Fatal(fmt.Errorf("after the switch: %w", err))
	}
}
