package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Table writes the results as the terminal table: one line per policy.
func Table(w io.Writer, r *Results) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\trequests\terrors\tshed\tTTFT p50\tTTFT p90\tTTFT p99\tE2E p90\tcache hit\toutput tok/s\trequests per pod")
	pods := r.PodNames()
	for _, name := range r.Order {
		p := r.Policies[name]
		if p == nil {
			continue
		}
		share := make([]string, 0, len(pods))
		for _, pod := range pods {
			share = append(share, fmt.Sprintf("%.0f%%", 100*p.PodShare[pod]))
		}
		perPod := strings.Join(share, " ")
		if len(p.PodShare) == 0 {
			perPod = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%.1f%%\t%.0f\t%s\n", name, p.Requests, p.Errors, p.Shed,
			Seconds(p.TTFT.P50), Seconds(p.TTFT.P90), Seconds(p.TTFT.P99), Seconds(p.E2E.P90),
			100*p.CacheHitRate, p.OutputTokensPerS, perPod)
	}
	return tw.Flush()
}

// Seconds formats model seconds for people: 12ms, 0.54s, 92.6s.
func Seconds(s float64) string {
	switch {
	case s == 0:
		return "-"
	case s < 0.01:
		return fmt.Sprintf("%.1fms", s*1000)
	case s < 1:
		return fmt.Sprintf("%.0fms", s*1000)
	case s < 100:
		return fmt.Sprintf("%.2fs", s)
	}
	return fmt.Sprintf("%.0fs", s)
}
