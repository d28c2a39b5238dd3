package report

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// What the router's decision for a pair's second request counted on the
// target it chose.
const (
	BasisPrediction = "prediction" // predicted blocks beyond the confirmed run counted
	BasisConfirmed  = "confirmed"  // a confirmed run, no prediction
	BasisNone       = "none"       // nothing cached anywhere it knew of
	BasisUnknown    = "-"          // no decision to read (the oracle)
)

// Pair is one paired-gap cell's outcome: the second request sent Gap
// after the first, under Condition.
type Pair struct {
	Condition string `json:"condition"`
	Gap       string `json:"gap"`
	// GapS is the gap as sent (model seconds): the cell's gap, or later
	// when the condition had to finish first (a failed prefill, a
	// restart).
	GapS float64 `json:"gap_s"`
	// FirstPod served (or last tried) the first request; FirstErr is why
	// it did not complete ("" when it did).
	FirstPod string `json:"first_pod"`
	FirstErr string `json:"first_error,omitempty"`
	// Basis is what the second request was routed on; SamePod whether it
	// went where the first did.
	Basis   string `json:"basis"`
	Pod     string `json:"pod"`
	SamePod bool   `json:"same_pod"`
	// ConfirmedBlocks and PredictedTokens are the router's decision (its
	// debug headers); CachedTokens is what the pod reported.
	ConfirmedBlocks int     `json:"confirmed_blocks"`
	PredictedTokens int     `json:"predicted_cached_tokens"`
	CachedTokens    int     `json:"cached_tokens"`
	TTFTS           float64 `json:"ttft_s"`
	Err             string  `json:"error,omitempty"`
	// Spec is the speculative policy's predictions during the cell
	// (changes of its view over the cell; nil for other policies).
	Spec *PairSpec `json:"speculative,omitempty"`
}

// PairSpec is what the router's predicted placements did during one cell:
// requests routed on predictions, false-warm routes, predictions (blocks)
// that ended unconfirmed (expired, withdrawn, invalidated) and
// confirmations that came after the deadline.
type PairSpec struct {
	FollowerRoutes   uint64 `json:"follower_routes"`
	FalseWarmRoutes  uint64 `json:"false_warm_routes"`
	Inserted         uint64 `json:"inserted"`
	EndedUnconfirmed int64  `json:"ended_unconfirmed"`
	ConfirmedLate    uint64 `json:"confirmed_late"`
}

// PairsTable writes the paired-gap matrix: one line per cell, a column
// group per policy (what the second request was routed on, whether it
// reached the first's pod, its cached tokens).
func PairsTable(w io.Writer, r *Results) error {
	names, _ := r.policies()
	var with []string
	for _, n := range names {
		if len(r.Policies[n].Pairs) > 0 {
			with = append(with, n)
		}
	}
	if len(with) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	head := []string{"condition", "gap"}
	for _, n := range with {
		head = append(head, n+": first", "second routed on", "same pod", "cached")
		if r.Policies[n].Pairs[0].Spec != nil {
			head = append(head, "unconfirmed", "late")
		}
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for i, c := range r.Policies[with[0]].Pairs {
		row := []string{c.Condition, fmt.Sprintf("%s (%s)", c.Gap, Seconds(c.GapS))}
		for _, n := range with {
			ps := r.Policies[n].Pairs
			if i >= len(ps) {
				row = append(row, "-", "-", "-", "-")
				continue
			}
			p := ps[i]
			basis := p.Basis
			if p.Err != "" {
				basis += " (" + p.Err + ")"
			}
			firstOK := "ok"
			if p.FirstErr != "" {
				firstOK = p.FirstErr
			}
			row = append(row, firstOK, basis, yesNo(p.SamePod), fmt.Sprint(p.CachedTokens))
			if s := p.Spec; s != nil {
				row = append(row, fmt.Sprint(s.EndedUnconfirmed), fmt.Sprint(s.ConfirmedLate))
			}
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// basisColor colors a cell by what its second request was routed on.
var basisColor = map[string]string{BasisPrediction: "#2ca02c", BasisConfirmed: "#1f6fd1", BasisNone: "#d9d9d9", BasisUnknown: "#f2f2f2"}

// pairsChart is the matrix as a grid per policy: rows conditions, columns
// gaps, each cell colored by what the second request was routed on and
// labelled with its cached tokens.
func pairsChart(r *Results) chart {
	names, _ := r.policies()
	var with []string
	for _, n := range names {
		if len(r.Policies[n].Pairs) > 0 {
			with = append(with, n)
		}
	}
	var conds, gaps []string
	seen := map[string]bool{}
	for _, p := range r.Policies[with[0]].Pairs {
		if !seen["c"+p.Condition] {
			seen["c"+p.Condition] = true
			conds = append(conds, p.Condition)
		}
		if !seen["g"+p.Gap] {
			seen["g"+p.Gap] = true
			gaps = append(gaps, p.Gap)
		}
	}
	d := newSVG("Paired-gap: what the second request was routed on")
	const left, top, legendH = 104, 34, 22
	panelW := float64(chartW-left-padR) / float64(len(with))
	cellW := panelW / float64(max(1, len(gaps)))
	cellH := math.Min(44, float64(chartH-top-legendH-padB/2)/float64(max(1, len(conds))))
	for j, c := range conds {
		fmt.Fprintf(&d.b, `<text x="%d" y="%s" font-size="11" text-anchor="end">%s</text>`, left-6, f1(top+cellH*(float64(j)+0.5)+4), esc(c))
	}
	for i, n := range with {
		x0 := float64(left) + panelW*float64(i)
		fmt.Fprintf(&d.b, `<g data-series="%s"><text x="%s" y="12" font-size="12" font-weight="600" text-anchor="middle">%s</text>`,
			esc(n), f1(x0+panelW/2), esc(n))
		for k, g := range gaps {
			fmt.Fprintf(&d.b, `<text x="%s" y="28" font-size="10" fill="#555" text-anchor="middle">%s</text>`, f1(x0+cellW*(float64(k)+0.5)), esc(g))
		}
		for _, p := range r.Policies[n].Pairs {
			j, k := indexOf(conds, p.Condition), indexOf(gaps, p.Gap)
			x, y := x0+cellW*float64(k), float64(top)+cellH*float64(j)
			fill := basisColor[p.Basis]
			if fill == "" {
				fill = basisColor[BasisUnknown]
			}
			ink := "#fff"
			if p.Basis == BasisNone || p.Basis == BasisUnknown {
				ink = "#333"
			}
			label := fmt.Sprint(p.CachedTokens)
			if p.Err != "" {
				label = "error"
			}
			fmt.Fprintf(&d.b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s" stroke="#fff" stroke-width="2"><title>%s, %s (%s): routed on %s, pod %s (first on %s), %d cached tokens</title></rect>`,
				f1(x), f1(y), f1(cellW), f1(cellH), fill, esc(p.Condition), esc(p.Gap), esc(Seconds(p.GapS)), esc(p.Basis), esc(p.Pod), esc(p.FirstPod), p.CachedTokens)
			fmt.Fprintf(&d.b, `<text x="%s" y="%s" font-size="11" fill="%s" text-anchor="middle">%s%s</text>`,
				f1(x+cellW/2), f1(y+cellH/2+4), ink, esc(label), map[bool]string{true: "", false: " ↗"}[p.SamePod])
		}
		d.b.WriteString(`</g>`)
	}
	ly := float64(chartH - padB/2)
	for i, b := range []string{BasisPrediction, BasisConfirmed, BasisNone} {
		x := float64(left) + 150*float64(i)
		fmt.Fprintf(&d.b, `<rect x="%s" y="%s" width="12" height="12" fill="%s"/><text x="%s" y="%s" font-size="11">routed on %s</text>`,
			f1(x), f1(ly-10), basisColor[b], f1(x+16), f1(ly), esc(b))
	}
	return chart{ID: "paired-gap", Title: "Paired-gap matrix", SVG: d.String(), Series: with,
		Caption: "Each cell is a pair sharing a prefix: the second request sent the gap after the first, under a condition. " +
			"Its color is what the router's decision counted on the pod it chose; its number the cached tokens the pod reported; " +
			"↗ marks a second request that went to another pod than the first."}
}

func indexOf(xs []string, x string) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return 0
}
