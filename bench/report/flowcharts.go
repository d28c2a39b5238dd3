package report

import (
	"fmt"
	"math"
	"strings"
)

// flowRows are the rows with flow control's figures by ladder step, in
// order, with their colors (by routing policy, so that a policy's two
// arms share one) and whether each is the arm without flow control.
func (r *Results) flowRows() (names, colors []string, off []bool) {
	for i, n := range r.Order {
		p := r.Policies[n]
		if p == nil || len(p.FlowByStage) == 0 {
			continue
		}
		names = append(names, n)
		colors = append(colors, r.rowColor(n, i))
		off = append(off, p.FlowControl != "on")
	}
	return names, colors, off
}

// flowCharts are flow control's charts over the ladder's steps: goodput,
// then each class's TTFT p90 against its objective; none without a
// ladder or flow control's figures.
func flowCharts(r *Results) []chart {
	names, colors, off := r.flowRows()
	if len(names) == 0 || len(r.Stages) == 0 || r.FlowControl == nil {
		return nil
	}
	hiRate := 0.0
	for _, s := range r.Stages {
		hiRate = math.Max(hiRate, s.Rate)
	}
	x := axis{lo: 0, hi: hiRate * 1.05, from: padL, to: chartW - padR}
	rateFmt := func(v float64) string { return fmt.Sprintf("%g/s", math.Round(v*10)/10) }
	legend := func(d *svgDoc) { d.legendDashed(names, colors, off) }

	// Goodput per step.
	hi := 0.0
	for _, n := range names {
		for _, s := range r.Policies[n].FlowByStage {
			hi = math.Max(hi, s.GoodputPerS)
		}
	}
	y := axis{lo: 0, hi: math.Max(hi*1.15, 1), from: chartH - padB, to: padT}
	d := newSVG("Goodput over the ladder's steps")
	d.frame(&x, y, "arrival rate of the step (requests per model second)", "answers within objective / s", rateFmt,
		func(v float64) string { return fmt.Sprintf("%.0f", v) })
	var drawn []string
	for i, n := range names {
		pts := stagePoints(r, r.Policies[n].FlowByStage, func(s StageFlow) (float64, bool) { return s.GoodputPerS, true })
		if len(pts) == 0 {
			continue
		}
		d.line(n, colors[i], pts, x, y, false, off[i])
		drawn = append(drawn, n)
	}
	legend(d)
	charts := []chart{{ID: "goodput-by-stage", Title: "Goodput over the ladder", SVG: d.String(), Series: drawn,
		Caption: "Answers whose time to first token was within their class's objective, per model second of each ladder step, by the step the requests arrived in; dashed: without flow control. Past the fleet's capacity a fleet without flow control keeps every request and answers each later, until none meets its objective; with it the router sheds what cannot be served in time and answers the rest within it."}}

	// Each class's TTFT p90 per step, its objective marked.
	for _, cl := range r.FlowControl.Classes {
		lo, hi := math.Inf(1), 0.0
		for _, n := range names {
			for _, s := range r.Policies[n].FlowByStage {
				if v, ok := s.TTFTP90[cl.Name]; ok && v > 0 {
					lo, hi = math.Min(lo, v), math.Max(hi, v)
				}
			}
		}
		if math.IsInf(lo, 1) {
			continue // no request of the class was answered
		}
		if cl.ObjectiveS > 0 {
			lo, hi = math.Min(lo, cl.ObjectiveS), math.Max(hi, cl.ObjectiveS)
		}
		lo, hi = logRange(lo, hi)
		y := axis{lo: lo, hi: hi, log: true, from: chartH - padB, to: padT}
		d := newSVG("TTFT p90 of " + cl.Name + " over the ladder's steps")
		d.frame(&x, y, "arrival rate of the step (requests per model second)", "TTFT p90 (log scale)", rateFmt, Seconds)
		if cl.ObjectiveS > 0 {
			py := y.at(cl.ObjectiveS)
			fmt.Fprintf(&d.b, `<g class="objective"><line x1="%d" x2="%d" y1="%s" y2="%s" stroke="#d62728" stroke-dasharray="2 3"/><text x="%d" y="%s" font-size="11" fill="#d62728" text-anchor="end">objective %s</text></g>`,
				padL, chartW-padR, f1(py), f1(py), chartW-padR-4, f1(py-4), esc(Seconds(cl.ObjectiveS)))
		}
		var drawn []string
		for i, n := range names {
			pts := stagePoints(r, r.Policies[n].FlowByStage, func(s StageFlow) (float64, bool) {
				v, ok := s.TTFTP90[cl.Name]
				return math.Max(v, lo), ok
			})
			if len(pts) == 0 {
				continue
			}
			d.line(n, colors[i], pts, x, y, false, off[i])
			drawn = append(drawn, n)
		}
		legend(d)
		charts = append(charts, chart{ID: "ttft-p90-" + cssID(cl.Name), Title: "TTFT p90 of " + cl.Name, SVG: d.String(), Series: drawn,
			Caption: fmt.Sprintf("The 90th percentile time to first token of the %s requests answered, by the ladder step they arrived in; the dotted line is the class's objective (%s). Dashed: without flow control.",
				cl.Name, objectiveText(cl.ObjectiveS))})
	}
	return charts
}

func objectiveText(s float64) string {
	if s <= 0 {
		return "none"
	}
	return Seconds(s)
}

// stagePoints are a row's (step rate, value) points, the steps with a
// value only.
func stagePoints(r *Results, st []StageFlow, value func(StageFlow) (float64, bool)) [][2]float64 {
	var pts [][2]float64
	for _, s := range st {
		if s.Stage >= len(r.Stages) {
			continue
		}
		if v, ok := value(s); ok {
			pts = append(pts, [2]float64{r.Stages[s.Stage].Rate, v})
		}
	}
	return pts
}

// cssID keeps the letters, digits and dashes of s, for an element id.
func cssID(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, s)
}

// legendDashed lists the series in the top-left corner of the plot, a
// short line each, dashed where the series is.
func (d *svgDoc) legendDashed(names, colors []string, dashed []bool) {
	fmt.Fprintf(&d.b, `<g class="legend" font-size="12">`)
	for i, n := range names {
		y := padT + 10 + 16*i
		dash := ""
		if dashed[i] {
			dash = ` stroke-dasharray="4 3"`
		}
		fmt.Fprintf(&d.b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/><text x="%d" y="%d">%s</text>`,
			padL+10, padL+28, y-2, y-2, colors[i], dash, padL+34, y+2, esc(n))
	}
	d.b.WriteString(`</g>`)
}

// flowRow is one row of the report's flow-control tables.
type flowRow struct {
	Name, Color, Arm, Goodput string
	// Classes are each class's TTFT p90, answers within its objective
	// and sheds; Tenants what each tenant was served of what it asked.
	Classes, Tenants []string
}

// flowTable is the report's flow-control table: each row's goodput, each
// class's TTFT p90, answers within the objective and sheds, and what each
// tenant was served of what it asked.
func flowTable(r *Results) (rows []flowRow, classes []FlowClass, tenants []string) {
	if r.FlowControl == nil {
		return nil, nil, nil
	}
	classes = r.FlowControl.Classes
	seen := map[string]bool{}
	for _, p := range r.Policies {
		for t := range p.ByTenant {
			seen[t] = true
		}
	}
	tenants = sortedKeys(seen)
	for i, n := range r.Order {
		p := r.Policies[n]
		if p == nil || p.GoodputPerS == nil {
			continue
		}
		arm := p.FlowControl
		if arm == "" {
			arm = "none (no router)"
		}
		row := flowRow{Name: n, Color: r.rowColor(n, i), Arm: arm, Goodput: fmt.Sprintf("%.1f", *p.GoodputPerS)}
		for _, cl := range classes {
			c := p.ByPriority[cl.Name]
			if c == nil {
				row.Classes = append(row.Classes, "–")
				continue
			}
			row.Classes = append(row.Classes, fmt.Sprintf("p90 %s · %d of %d within · %d shed", Seconds(c.TTFT.P90), c.WithinSLO, c.Requests, c.Shed))
		}
		for _, t := range tenants {
			v := p.ByTenant[t]
			switch {
			case v == nil:
				row.Tenants = append(row.Tenants, "–")
			case v.WithinFairShare:
				row.Tenants = append(row.Tenants, percent(v.ServedFraction)+" (within its share)")
			default:
				row.Tenants = append(row.Tenants, percent(v.ServedFraction))
			}
		}
		rows = append(rows, row)
	}
	return rows, classes, tenants
}
