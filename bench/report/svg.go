package report

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// The charts are SVG drawn here: no script, no font or style sheet from
// elsewhere, so the page renders the same offline and in a headless
// browser. Every series is an element carrying data-series="NAME", which
// the browser test looks for.

const (
	chartW, chartH = 720, 340
	padL, padR     = 64, 20
	padT, padB     = 16, 48
)

// palette gives each policy the same color in every chart.
var palette = map[string]string{
	"round-robin": "#8c8c8c",
	"least-load":  "#e6862e",
	"approximate": "#9467bd",
	"precise":     "#1f6fd1",
	"speculative": "#2ca02c",
	"oracle":      "#222222",
}

var spare = []string{"#d62728", "#17becf", "#bcbd22", "#8c564b", "#e377c2"}

func colorOf(name string, i int) string {
	if c, ok := palette[name]; ok {
		return c
	}
	return spare[i%len(spare)]
}

// axis maps data values to pixels, linearly or on a log10 scale.
type axis struct {
	lo, hi   float64
	log      bool
	from, to float64 // pixels
}

func (a axis) at(v float64) float64 {
	lo, hi := a.lo, a.hi
	if a.log {
		v, lo, hi = math.Log10(math.Max(v, a.lo)), math.Log10(lo), math.Log10(hi)
	}
	if hi == lo {
		return (a.from + a.to) / 2
	}
	return a.from + (v-lo)/(hi-lo)*(a.to-a.from)
}

// ticks are values worth a label: powers of ten and their 2 and 5 multiples
// on a log axis, about five round steps on a linear one.
func (a axis) ticks() []float64 {
	var out []float64
	if a.log {
		for e := math.Floor(math.Log10(a.lo)); e <= math.Ceil(math.Log10(a.hi)); e++ {
			for _, m := range []float64{1, 2, 5} {
				if v := m * math.Pow(10, e); v >= a.lo*0.999 && v <= a.hi*1.001 {
					out = append(out, v)
				}
			}
		}
		if len(out) > 9 { // a wide range: powers of ten only
			out = out[:0]
			for e := math.Ceil(math.Log10(a.lo)); e <= math.Floor(math.Log10(a.hi)); e++ {
				out = append(out, math.Pow(10, e))
			}
		}
		return out
	}
	step := niceStep((a.hi - a.lo) / 5)
	for v := math.Ceil(a.lo/step) * step; v <= a.hi+step*1e-9; v += step {
		out = append(out, v)
	}
	return out
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// logRange is a log axis range around positive values, padded to whole
// decades' 1-2-5 marks.
func logRange(lo, hi float64) (float64, float64) {
	if !(lo > 0) {
		lo = 1e-3
	}
	if hi <= lo {
		hi = lo * 10
	}
	down := func(v float64) float64 {
		p := math.Pow(10, math.Floor(math.Log10(v)))
		for _, m := range []float64{5, 2, 1} {
			if m*p <= v {
				return m * p
			}
		}
		return p
	}
	up := func(v float64) float64 {
		p := math.Pow(10, math.Floor(math.Log10(v)))
		for _, m := range []float64{1, 2, 5, 10} {
			if m*p >= v {
				return m * p
			}
		}
		return 10 * p
	}
	return down(lo), up(hi)
}

// svgDoc collects one chart's elements.
type svgDoc struct {
	b     strings.Builder
	title string
}

func newSVG(title string) *svgDoc {
	d := &svgDoc{title: title}
	fmt.Fprintf(&d.b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		chartW, chartH, esc(title))
	return d
}

func (d *svgDoc) String() string { return d.b.String() + "</svg>" }

func esc(s string) string { return html.EscapeString(s) }

func f1(v float64) string { return fmt.Sprintf("%.1f", v) }

// frame draws the axes with their ticks and labels; a nil x has no ticks
// (a bar chart names its bars itself).
func (d *svgDoc) frame(x *axis, y axis, xLabel, yLabel string, xFmt, yFmt func(float64) string) {
	fmt.Fprintf(&d.b, `<g class="axes" font-size="11" fill="#444">`)
	for _, v := range y.ticks() {
		py := y.at(v)
		fmt.Fprintf(&d.b, `<line x1="%d" x2="%d" y1="%s" y2="%s" stroke="#e4e4e4"/>`, padL, chartW-padR, f1(py), f1(py))
		fmt.Fprintf(&d.b, `<text x="%d" y="%s" text-anchor="end">%s</text>`, padL-6, f1(py+4), esc(yFmt(v)))
	}
	if x != nil {
		for _, v := range x.ticks() {
			px := x.at(v)
			fmt.Fprintf(&d.b, `<line x1="%s" x2="%s" y1="%d" y2="%d" stroke="#e4e4e4"/>`, f1(px), f1(px), padT, chartH-padB)
			fmt.Fprintf(&d.b, `<text x="%s" y="%d" text-anchor="middle">%s</text>`, f1(px), chartH-padB+16, esc(xFmt(v)))
		}
	}
	fmt.Fprintf(&d.b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#888"/>`, padL, chartW-padR, chartH-padB, chartH-padB)
	fmt.Fprintf(&d.b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#888"/>`, padL, padL, padT, chartH-padB)
	fmt.Fprintf(&d.b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`, (padL+chartW-padR)/2, chartH-10, esc(xLabel))
	fmt.Fprintf(&d.b, `<text transform="translate(14 %d) rotate(-90)" text-anchor="middle">%s</text>`, (padT+chartH-padB)/2, esc(yLabel))
	d.b.WriteString(`</g>`)
}

// line draws one series as a polyline with a dot per point.
func (d *svgDoc) line(name, color string, pts [][2]float64, x, y axis, step bool, dashed bool) {
	if len(pts) == 0 {
		return
	}
	var p strings.Builder
	prevY := 0.0
	for i, pt := range pts {
		px, py := x.at(pt[0]), y.at(pt[1])
		if step && i > 0 {
			fmt.Fprintf(&p, "%s,%s ", f1(px), f1(prevY))
		}
		fmt.Fprintf(&p, "%s,%s ", f1(px), f1(py))
		prevY = py
	}
	dash := ""
	if dashed {
		dash = ` stroke-dasharray="6 4"`
	}
	fmt.Fprintf(&d.b, `<g data-series="%s"><title>%s</title><polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`,
		esc(name), esc(name), color, dash, strings.TrimSpace(p.String()))
	if !step {
		for _, pt := range pts {
			fmt.Fprintf(&d.b, `<circle cx="%s" cy="%s" r="2.5" fill="%s"/>`, f1(x.at(pt[0])), f1(y.at(pt[1])), color)
		}
	}
	d.b.WriteString(`</g>`)
}

// legend lists the series in the top-left corner of the plot.
func (d *svgDoc) legend(names []string, colors []string) {
	fmt.Fprintf(&d.b, `<g class="legend" font-size="12">`)
	for i, n := range names {
		y := padT + 10 + 16*i
		fmt.Fprintf(&d.b, `<rect x="%d" y="%d" width="12" height="4" fill="%s"/><text x="%d" y="%d">%s</text>`,
			padL+12, y-4, colors[i], padL+30, y+1, esc(n))
	}
	d.b.WriteString(`</g>`)
}

// barChart draws one bar per series on a linear value axis from zero, with
// the value written above each bar.
func barChart(title, yLabel string, names, colors []string, values []float64, format func(float64) string) string {
	d := newSVG(title)
	hi := 0.0
	for _, v := range values {
		hi = math.Max(hi, v)
	}
	if hi == 0 {
		hi = 1
	}
	y := axis{lo: 0, hi: hi * 1.15, from: chartH - padB, to: padT}
	d.frame(nil, y, "", yLabel, nil, format)
	slot := float64(chartW-padL-padR) / float64(max(1, len(names)))
	w := math.Min(80, slot*0.6)
	for i, n := range names {
		cx := float64(padL) + slot*(float64(i)+0.5)
		top := y.at(values[i])
		fmt.Fprintf(&d.b, `<g data-series="%s"><title>%s: %s</title><rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`,
			esc(n), esc(n), esc(format(values[i])), f1(cx-w/2), f1(top), f1(w), f1(float64(chartH-padB)-top), colors[i])
		fmt.Fprintf(&d.b, `<text x="%s" y="%s" font-size="12" text-anchor="middle">%s</text>`, f1(cx), f1(top-5), esc(format(values[i])))
		fmt.Fprintf(&d.b, `<text x="%s" y="%d" font-size="12" text-anchor="middle">%s</text></g>`, f1(cx), chartH-padB+16, esc(n))
	}
	return d.String()
}
