package report

import (
	"fmt"
	"math"
	"strings"
)

// A chart is one figure of the report: its SVG and the series it must show.
type chart struct {
	ID, Title, Caption string
	SVG                string
	Series             []string
}

// policies returns the run's policies in order with their colors.
func (r *Results) policies() (names, colors []string) {
	for i, n := range r.Order {
		if r.Policies[n] == nil {
			continue
		}
		names = append(names, n)
		colors = append(colors, r.rowColor(n, i))
	}
	return names, colors
}

// rowColor is row n's color: its routing policy's, lighter for the arm
// without flow control when both arms ran, so that a policy's two rows
// read as one policy in every chart.
func (r *Results) rowColor(n string, i int) string {
	p := r.Policies[n]
	if p == nil || p.Policy == "" {
		return colorOf(n, i)
	}
	c := colorOf(p.Policy, i)
	if p.FlowControl == "off" && r.FlowControl != nil && len(r.FlowControl.Arms) > 1 {
		return lighter(c)
	}
	return c
}

// lighter is color #rrggbb halfway to white.
func lighter(c string) string {
	var rgb [3]int
	if _, err := fmt.Sscanf(c, "#%02x%02x%02x", &rgb[0], &rgb[1], &rgb[2]); err != nil {
		return c
	}
	return fmt.Sprintf("#%02x%02x%02x", (rgb[0]+255)/2, (rgb[1]+255)/2, (rgb[2]+255)/2)
}

// ttftCDF is every policy's TTFT distribution on a log time axis.
func ttftCDF(r *Results) chart {
	names, colors := r.policies()
	lo, hi := math.Inf(1), 0.0
	for _, n := range names {
		for _, pt := range r.Policies[n].TTFTCDF {
			if pt[0] > 0 {
				lo = math.Min(lo, pt[0])
			}
			hi = math.Max(hi, pt[0])
		}
	}
	lo, hi = logRange(lo, hi)
	x := axis{lo: lo, hi: hi, log: true, from: padL, to: chartW - padR}
	y := axis{lo: 0, hi: 1, from: chartH - padB, to: padT}
	d := newSVG("TTFT distribution per policy")
	d.frame(&x, y, "time to first token (model seconds, log scale)", "fraction of requests", Seconds, percent)
	var drawn []string
	for i, n := range names {
		pts := r.Policies[n].TTFTCDF
		if len(pts) == 0 {
			continue
		}
		d.line(n, colors[i], pts, x, y, true, n == "oracle")
		drawn = append(drawn, n)
	}
	d.legend(names, colors)
	return chart{ID: "ttft-cdf", Title: "Time to first token", SVG: d.String(), Series: drawn,
		Caption: "The fraction of answered requests whose first token came within a time: further left is better, and the gap between the curves' tails is what users feel under load."}
}

// cacheHit is each policy's cache-hit rate.
func cacheHit(r *Results) chart {
	names, colors := r.policies()
	vals := make([]float64, len(names))
	for i, n := range names {
		vals[i] = r.Policies[n].CacheHitRate
	}
	return chart{ID: "cache-hit", Title: "Cache-hit rate", Series: names,
		SVG:     barChart("Cache-hit rate per policy", "cached / prompt tokens", names, colors, vals, percent),
		Caption: "Prompt tokens the pods served from their prefix cache, as they report them in usage.prompt_tokens_details.cached_tokens, over all prompt tokens."}
}

// throughput is each policy's output tokens per model second.
func throughput(r *Results) chart {
	names, colors := r.policies()
	vals := make([]float64, len(names))
	for i, n := range names {
		vals[i] = r.Policies[n].OutputTokensPerS
	}
	return chart{ID: "throughput", Title: "Output throughput", Series: names,
		SVG:     barChart("Output throughput per policy", "output tokens / model second", names, colors, vals, func(v float64) string { return fmt.Sprintf("%.0f", v) }),
		Caption: "Generated tokens of answered requests over the span from the first request sent to the last answer."}
}

// podShare is a stacked bar per policy, one segment per pod.
func podShare(r *Results) chart {
	names, _ := r.policies()
	pods := r.PodNames()
	d := newSVG("Request share per pod")
	rowH := math.Min(36, float64(chartH-padT-padB)/float64(max(1, len(names))))
	x := axis{lo: 0, hi: 1, from: 110, to: chartW - padR}
	fmt.Fprintf(&d.b, `<g class="axes" font-size="11" fill="#444">`)
	for _, v := range []float64{0, 0.25, 0.5, 0.75, 1} {
		px := x.at(v)
		fmt.Fprintf(&d.b, `<line x1="%s" x2="%s" y1="%d" y2="%s" stroke="#e4e4e4"/><text x="%s" y="%s" text-anchor="middle">%s</text>`,
			f1(px), f1(px), padT, f1(float64(padT)+rowH*float64(len(names))), f1(px), f1(float64(padT)+rowH*float64(len(names))+16), percent(v))
	}
	d.b.WriteString(`</g>`)
	var drawn []string
	for i, n := range names {
		share := r.Policies[n].PodShare
		if len(share) == 0 {
			continue
		}
		top := float64(padT) + rowH*float64(i)
		fmt.Fprintf(&d.b, `<g data-series="%s"><text x="104" y="%s" font-size="12" text-anchor="end">%s</text>`, esc(n), f1(top+rowH/2+4), esc(n))
		acc := 0.0
		for j, pod := range pods {
			v := share[pod]
			if v <= 0 {
				continue
			}
			x0, x1 := x.at(acc), x.at(acc+v)
			fmt.Fprintf(&d.b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s" stroke="#fff"><title>%s on %s: %s</title></rect>`,
				f1(x0), f1(top+3), f1(math.Max(x1-x0, 0.5)), f1(rowH-6), podColor(j, len(pods)), esc(n), esc(pod), percent(v))
			if x1-x0 > 34 {
				fmt.Fprintf(&d.b, `<text x="%s" y="%s" font-size="11" fill="#fff" text-anchor="middle">%s</text>`, f1((x0+x1)/2), f1(top+rowH/2+4), esc(pod))
			}
			acc += v
		}
		d.b.WriteString(`</g>`)
		drawn = append(drawn, n)
	}
	return chart{ID: "pod-share", Title: "Request share per pod", SVG: d.String(), Series: drawn,
		Caption: "Which pod answered each request. A cache-aware policy need not spread requests evenly: it keeps each prefix where it is held, as long as the load allows."}
}

// podColor shades pods from dark to light blue.
func podColor(i, n int) string {
	t := 0.0
	if n > 1 {
		t = float64(i) / float64(n-1)
	}
	c := func(a, b float64) int { return int(a + (b-a)*t) }
	return fmt.Sprintf("#%02x%02x%02x", c(0x0b, 0x7f), c(0x3c, 0xb3), c(0x7a, 0xe0))
}

// ttftOverTime is the TTFT p90 of the requests sent in each slice of the
// run, with the ladder's stages marked.
func ttftOverTime(r *Results) chart {
	names, colors := r.policies()
	lo, hi, end := math.Inf(1), 0.0, 0.0
	for _, n := range names {
		for _, b := range r.Policies[n].TTFTOverTime {
			if b.P90 > 0 {
				lo = math.Min(lo, b.P90)
			}
			hi = math.Max(hi, b.P90)
			end = math.Max(end, b.Start)
		}
	}
	for _, s := range r.Stages {
		end = math.Max(end, s.End)
	}
	lo, hi = logRange(lo, hi)
	x := axis{lo: 0, hi: math.Max(end, 1e-3), from: padL, to: chartW - padR}
	y := axis{lo: lo, hi: hi, log: true, from: chartH - padB, to: padT}
	d := newSVG("TTFT p90 over the run")
	d.frame(&x, y, "request sent at (model seconds)", "TTFT p90 (log scale)", func(v float64) string { return fmt.Sprintf("%gs", v) }, Seconds)
	for i, s := range r.Stages {
		px := x.at(s.Start)
		fmt.Fprintf(&d.b, `<g class="stage"><line x1="%s" x2="%s" y1="%d" y2="%d" stroke="#bbb" stroke-dasharray="3 3"/><text x="%s" y="%d" font-size="11" fill="#666">%s</text></g>`,
			f1(px), f1(px), padT, chartH-padB, f1(px+3), chartH-padB-4-12*(i%2), esc(fmt.Sprintf("%g/s", s.Rate)))
	}
	var drawn []string
	for i, n := range names {
		bins := r.Policies[n].TTFTOverTime
		if len(bins) == 0 {
			continue
		}
		pts := make([][2]float64, len(bins))
		for j, b := range bins {
			pts[j] = [2]float64{b.Start, math.Max(b.P90, lo)}
		}
		d.line(n, colors[i], pts, x, y, false, n == "oracle")
		drawn = append(drawn, n)
	}
	d.legend(names, colors)
	return chart{ID: "ttft-over-time", Title: "TTFT over the run", SVG: d.String(), Series: drawn,
		Caption: "TTFT p90 of the requests sent in each fortieth of the run; dashed lines mark the rate ladder's steps. A policy that falls behind shows its queue growing here."}
}

func percent(v float64) string {
	s := fmt.Sprintf("%.1f", 100*v)
	return strings.TrimSuffix(s, ".0") + "%"
}
