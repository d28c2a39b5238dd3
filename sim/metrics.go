package sim

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
)

// handleMetrics writes the Prometheus text format with vLLM's metric names
// and labels (engine = data-parallel rank, model_name), plus the simulator's
// own prefixrouter_sim_* series. TTFT is observed in model seconds.
func (p *Pod) handleMetrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	b := bufio.NewWriter(w)
	defer b.Flush()
	model := escapeLabel(p.cfg.Model)
	stats := p.Stats()
	type series struct {
		name, typ, help string
		value           func(r int) float64
	}
	list := []series{
		{"vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", func(r int) float64 { return float64(stats[r].Running) }},
		{"vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", func(r int) float64 { return float64(stats[r].Waiting) }},
		{"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", func(r int) float64 { return stats[r].KVUsage }},
		{"vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", func(r int) float64 { return float64(stats[r].PrefixQueries) }},
		{"vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", func(r int) float64 { return float64(stats[r].PrefixHits) }},
		{"vllm:external_prefix_cache_hits_total", "counter", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.", func(r int) float64 { return float64(stats[r].CPUHits + stats[r].KVTransferHits) }},
		{"vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", func(r int) float64 { return float64(stats[r].Preemptions) }},
		{"vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", func(r int) float64 { return float64(p.engines[r].stats.promptTokens.Load()) }},
		{"vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", func(r int) float64 { return float64(p.engines[r].stats.genTokens.Load()) }},
	}
	for _, s := range list {
		header(b, s.name, s.typ, s.help)
		for r := range stats {
			line(b, s.name, `engine="`+strconv.Itoa(r)+`",model_name="`+model+`"`, s.value(r))
		}
	}
	header(b, "vllm:request_success_total", "counter", "Count of successfully processed requests.")
	for r := range stats {
		line(b, "vllm:request_success_total", `engine="`+strconv.Itoa(r)+`",finished_reason="length",model_name="`+model+`"`, float64(p.engines[r].stats.success.Load()))
	}
	header(b, "vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds (simulated model time).")
	for r, e := range p.engines {
		h := &e.stats.ttft
		h.mu.Lock()
		counts, sum, n := h.counts, h.sum, h.n
		h.mu.Unlock()
		lbl := `engine="` + strconv.Itoa(r) + `",model_name="` + model + `"`
		cum := uint64(0)
		for i, le := range ttftBuckets {
			cum += counts[i]
			line(b, "vllm:time_to_first_token_seconds_bucket", lbl+`,le="`+strconv.FormatFloat(le, 'f', -1, 64)+`"`, float64(cum))
		}
		line(b, "vllm:time_to_first_token_seconds_bucket", lbl+`,le="+Inf"`, float64(n))
		line(b, "vllm:time_to_first_token_seconds_sum", lbl, sum)
		line(b, "vllm:time_to_first_token_seconds_count", lbl, float64(n))
	}
	header(b, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
	for r := range stats {
		line(b, "vllm:cache_config_info", `block_size="`+strconv.Itoa(p.prof.BlockSize)+
			`",cache_dtype="auto",enable_prefix_caching="True",engine="`+strconv.Itoa(r)+
			`",gpu_memory_utilization="0.9",num_gpu_blocks="`+strconv.Itoa(p.prof.NumGPUBlocks)+
			`",prefix_caching_hash_algo="`+p.cfg.HashAlgo.String()+`"`, 1)
	}
	// vLLM's /metrics carries the Prometheus client's process collector; a
	// restart shows as a new start time.
	header(b, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.")
	line(b, "process_start_time_seconds", "", float64(p.started.Load())/1e9)
	header(b, "prefixrouter_sim_time_scale", "gauge", "Model seconds simulated per wall-clock second; multiply wall-clock durations by it.")
	line(b, "prefixrouter_sim_time_scale", "", p.cfg.TimeScale)
	header(b, "prefixrouter_sim_lag_seconds", "gauge", "Wall-clock seconds the engine's model clock trails real time (0 unless the simulator is the bottleneck).")
	for r := range stats {
		line(b, "prefixrouter_sim_lag_seconds", `engine="`+strconv.Itoa(r)+`"`, stats[r].Lag.Seconds())
	}
	header(b, "prefixrouter_sim_event_batches_total", "counter", "KV event batches by outcome on the PUB socket.")
	for r := range stats {
		e := `engine="` + strconv.Itoa(r) + `"`
		line(b, "prefixrouter_sim_event_batches_total", e+`,outcome="sent"`, float64(stats[r].EventBatchesSent))
		line(b, "prefixrouter_sim_event_batches_total", e+`,outcome="dropped"`, float64(stats[r].EventBatchesDropped))
	}
	header(b, "prefixrouter_sim_replay_requests_total", "counter", "Replay requests answered.")
	for r := range stats {
		line(b, "prefixrouter_sim_replay_requests_total", `engine="`+strconv.Itoa(r)+`"`, float64(stats[r].ReplayRequestsServed))
	}
	header(b, "prefixrouter_sim_kv_transfer_failures_total", "counter", "Disaggregated decodes whose prefill engine was gone (restarted, closed, or not named): the prompt was recomputed locally.")
	for r := range stats {
		line(b, "prefixrouter_sim_kv_transfer_failures_total", `engine="`+strconv.Itoa(r)+`"`, float64(stats[r].KVTransferFailures))
	}
}

func header(b *bufio.Writer, name, typ, help string) {
	b.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " " + typ + "\n")
}

func line(b *bufio.Writer, name, labels string, v float64) {
	b.WriteString(name)
	if labels != "" {
		b.WriteString("{" + labels + "}")
	}
	b.WriteByte(' ')
	b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
	b.WriteByte('\n')
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }
