package sim

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/sim/publish/publishtest"
)

// startTestFleet starts pods on OS-chosen loopback ports and closes them
// when the test ends.
func startTestFleet(t *testing.T, cfg Config) *Fleet {
	t.Helper()
	if cfg.Profile.Name == "" {
		cfg.Profile = testProfile()
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 100
	}
	cfg.Host = "127.0.0.1"
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	// A bound for a hung start, not a speed check: parsing a real
	// tokenizer alone takes over 10 s under -race on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f, err := StartFleet(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	})
	return f
}

var testClient = &http.Client{Timeout: 20 * time.Second}

// post sends a JSON body and returns status, headers and body.
func post(t *testing.T, url string, body any, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(http.MethodPost, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, out
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := testClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// vllmVectors is testdata/vllm: base tokens and the KV-event vectors.
type vllmVectors struct {
	BaseTokens []uint32
	Vectors    map[string]vllmVector
}

type vllmVector struct {
	Topic   string
	Seq     uint64
	Frames  [][]byte
	Payload []byte
}

func loadVectors(t *testing.T) vllmVectors {
	t.Helper()
	dir := filepath.Join("..", "testdata", "vllm")
	var bh struct {
		BaseTokens []uint32 `json:"base_tokens"`
	}
	readJSON(t, filepath.Join(dir, "block_hashes.json"), &bh)
	var ev struct {
		Vectors []struct {
			ID        string   `json:"id"`
			Topic     string   `json:"topic"`
			Seq       uint64   `json:"seq"`
			FramesHex []string `json:"frames_hex"`
		} `json:"vectors"`
	}
	readJSON(t, filepath.Join(dir, "kv_events.json"), &ev)
	out := vllmVectors{BaseTokens: bh.BaseTokens, Vectors: map[string]vllmVector{}}
	for _, v := range ev.Vectors {
		vec := vllmVector{Topic: v.Topic, Seq: v.Seq}
		for _, h := range v.FramesHex {
			b, err := hex.DecodeString(h)
			if err != nil {
				t.Fatal(err)
			}
			vec.Frames = append(vec.Frames, b)
		}
		vec.Payload = vec.Frames[len(vec.Frames)-1]
		out.Vectors[v.ID] = vec
	}
	return out
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// warmUp sends throw-away requests until the subscription delivers, so
// that later batches are not lost to ZMQ's slow-joiner window. It returns
// the sequence number of the last warm-up batch.
func warmUp(t *testing.T, s *publishtest.Subscriber, pod *Pod) uint64 {
	t.Helper()
	for i := 0; i < 100; i++ {
		ids := tokenRange(200000+i*100, 17)
		code, _, body := post(t, pod.URL()+"/v1/completions", map[string]any{"prompt": ids, "max_tokens": 1})
		if code != 200 {
			t.Fatalf("warm-up: %d %s", code, body)
		}
		if m, ok := s.Recv(100 * time.Millisecond); ok {
			for {
				m2, ok := s.Recv(50 * time.Millisecond)
				if !ok {
					return m.Seq
				}
				m = m2
			}
		}
	}
	t.Fatal("subscription never delivered")
	return 0
}

func cachedTokens(t *testing.T, body []byte) int {
	t.Helper()
	var r struct {
		Usage struct {
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if r.Usage.PromptTokensDetails == nil {
		t.Fatalf("no prompt_tokens_details in %s", body)
	}
	return r.Usage.PromptTokensDetails.CachedTokens
}

// waitBatches waits until rank has put n batches on the wire: a batch
// leaves after the step that produced it, so just after the response.
func waitBatches(t *testing.T, pod *Pod, rank int, n uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := pod.Stats()[rank]
		if st.EventBatchesSent+st.EventBatchesDropped >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank %d sent %d batches, want %d", rank, st.EventBatchesSent, n)
		}
		time.Sleep(time.Millisecond)
	}
}
