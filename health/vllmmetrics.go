package health

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The vLLM metric families health reads. vllm:gpu_cache_usage_perc is the
// name older releases used for the KV usage gauge.
const (
	metricRunning     = "vllm:num_requests_running"
	metricWaiting     = "vllm:num_requests_waiting"
	metricKVUsage     = "vllm:kv_cache_usage_perc"
	metricKVUsageOld  = "vllm:gpu_cache_usage_perc"
	metricCacheConfig = "vllm:cache_config_info"
	// metricProcessStart comes from the Prometheus client's process
	// collector that vLLM's /metrics includes: a new value means a new
	// process, whose KV cache holds nothing the old one announced.
	metricProcessStart = "process_start_time_seconds"
)

var wantedFamilies = []string{metricRunning, metricWaiting, metricKVUsage, metricKVUsageOld, metricCacheConfig, metricProcessStart}

type engineLoad struct {
	running, waiting, kv float64
	haveKV               bool
}

// podMetrics is what one scrape yields, keyed by the "engine" label (the
// data-parallel rank in vLLM's V1 metrics); "" when unlabelled.
type podMetrics struct {
	load  map[string]*engineLoad
	cache map[string]CacheConfig
	// processStart is the API server process's start time (Unix seconds,
	// 0 when not exposed).
	processStart float64
}

// anyCache returns the cache config of the lowest engine label.
func (p podMetrics) anyCache() CacheConfig {
	keys := make([]string, 0, len(p.cache))
	for k := range p.cache {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) == 0 {
		return CacheConfig{}
	}
	return p.cache[keys[0]]
}

// filterFamilies keeps only the lines of the families health reads: the
// text parser then sees a small, well-formed input, and a malformed family
// health does not read cannot fail the scrape.
func filterFamilies(body []byte) []byte {
	var out bytes.Buffer
	for line := range bytes.Lines(body) {
		l := bytes.TrimLeft(line, " \t")
		name := l
		if bytes.HasPrefix(l, []byte("#")) {
			f := bytes.Fields(l)
			if len(f) < 3 || (string(f[1]) != "HELP" && string(f[1]) != "TYPE") {
				continue
			}
			name = f[2]
		}
		for _, w := range wantedFamilies {
			if bytes.HasPrefix(name, []byte(w)) {
				rest := name[len(w):]
				if len(rest) == 0 || rest[0] == '{' || rest[0] == ' ' || rest[0] == '\t' || rest[0] == '\n' || rest[0] == '\r' {
					out.Write(l)
					if !bytes.HasSuffix(l, []byte("\n")) {
						out.WriteByte('\n')
					}
				}
				break
			}
		}
	}
	return out.Bytes()
}

// parseVLLMMetrics reads the load gauges and cache config from a Prometheus
// text exposition.
func parseVLLMMetrics(body []byte) (podMetrics, error) {
	pm := podMetrics{load: map[string]*engineLoad{}, cache: map[string]CacheConfig{}}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(filterFamilies(body)))
	if err != nil {
		return pm, fmt.Errorf("parsing metrics: %w", err)
	}
	get := func(engine string) *engineLoad {
		l := pm.load[engine]
		if l == nil {
			l = &engineLoad{}
			pm.load[engine] = l
		}
		return l
	}
	kvName := metricKVUsage
	if _, ok := fams[kvName]; !ok {
		kvName = metricKVUsageOld
	}
	for _, name := range []string{metricRunning, metricWaiting, kvName} {
		fam, ok := fams[name]
		if !ok {
			continue
		}
		for _, mt := range fam.GetMetric() {
			v, ok := sampleValue(mt)
			if !ok {
				continue
			}
			l := get(label(mt, "engine"))
			switch name {
			case metricRunning:
				l.running += v
			case metricWaiting:
				l.waiting += v
			default:
				v = min(max(v, 0), 1)
				l.kv = max(l.kv, v)
				l.haveKV = true
			}
		}
	}
	if fam, ok := fams[metricProcessStart]; ok {
		for _, mt := range fam.GetMetric() {
			v := mt.GetGauge().GetValue()
			if mt.GetGauge() == nil {
				v = mt.GetUntyped().GetValue()
			}
			if v > 0 && !math.IsInf(v, 0) {
				pm.processStart = v
			}
		}
	}
	if fam, ok := fams[metricCacheConfig]; ok {
		for _, mt := range fam.GetMetric() {
			cc := CacheConfig{
				Known:         true,
				BlockSize:     labelInt(mt, "block_size"),
				NumGPUBlocks:  labelInt(mt, "num_gpu_blocks"),
				HashAlgo:      label(mt, "prefix_caching_hash_algo"),
				PrefixCaching: label(mt, "enable_prefix_caching"),
			}
			pm.cache[label(mt, "engine")] = cc
		}
	}
	return pm, nil
}

// sampleValue reads a gauge, untyped or counter value; NaN and infinities
// are rejected.
func sampleValue(mt *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case mt.GetGauge() != nil:
		v = mt.GetGauge().GetValue()
	case mt.GetUntyped() != nil:
		v = mt.GetUntyped().GetValue()
	case mt.GetCounter() != nil:
		v = mt.GetCounter().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false
	}
	return min(v, math.MaxInt32), true
}

func label(mt *dto.Metric, name string) string {
	for _, lp := range mt.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// labelInt reads an integer label; vLLM prints "None" for unknown values.
func labelInt(mt *dto.Metric, name string) int {
	v := strings.TrimSpace(label(mt, name))
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0
	}
	return n
}
