package report

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// Faults is the faults workload's account of one policy's run: how every
// request ended and how fast the router's view of each faulted pod came
// back.
type Faults struct {
	// Responses counts the requests that ended in a complete answer.
	Responses int `json:"responses"`
	// APIErrors counts the requests that ended in an OpenAI-shaped error,
	// by "HTTP <status> <type>" (an error body) or "stream <type>" (an
	// error chunk in a stream).
	APIErrors map[string]int `json:"openai_errors,omitempty"`
	// Lost counts the requests that ended in neither, by the client's
	// error kind (a stream cut without [DONE], a refused connection, a
	// body that is no OpenAI error): lost silently.
	Lost map[string]int `json:"lost_silently,omitempty"`
	// Unfinished counts the requests the client itself gave up on at the
	// drain bound.
	Unfinished int `json:"unfinished"`
	// Injected is the schedule as it ran.
	Injected []Fault `json:"injected"`
}

// LostCount is the requests lost silently.
func (f *Faults) LostCount() int { return sum(f.Lost) }

// APIErrorCount is the requests that ended in an OpenAI-shaped error.
func (f *Faults) APIErrorCount() int { return sum(f.APIErrors) }

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// Fault is one injected fault and how the router's view of its pod
// converged back after it ended.
type Fault struct {
	Kind string `json:"kind"`
	Pod  string `json:"pod"`
	// StartS and EndS are when it was applied and lifted (model seconds
	// from the run's start; equal for an instant fault such as a restart,
	// whose end is when the pod answers again).
	StartS float64 `json:"start_s"`
	EndS   float64 `json:"end_s"`
	// RoutableAfterS is the model time from the end until health let the
	// router send every rank of the pod work again; FreshAfterS until the
	// router judged every rank's event stream fresh; ConvergedAfterS
	// until both held and, in addition, every probe prompt's confirmed
	// run on the pod equalled the pod's true cached run. Nil: not within
	// the bound, or no router (the oracle).
	RoutableAfterS  *float64 `json:"routable_after_s"`
	FreshAfterS     *float64 `json:"fresh_after_s"`
	ConvergedAfterS *float64 `json:"converged_after_s"`
	// Probes is the prompts compared (one per sharing group); Mismatch the
	// last difference seen when it did not converge.
	Probes   int    `json:"probes"`
	Mismatch string `json:"last_mismatch,omitempty"`
	// RouterSaw is what the router made of the pod from the fault's start
	// until it converged: its event-stream verdicts and "not routable"
	// while health took it out, in the order first seen.
	RouterSaw []string `json:"router_saw,omitempty"`
}

// FaultsTable writes the faults workload's two tables: how the requests
// ended per policy, then per injected fault how fast each policy's router
// converged back. Nothing when no policy ran the faults workload.
func FaultsTable(w io.Writer, r *Results) error {
	rows := faultRows(r)
	if len(rows) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\tresponses\topenai errors\tlost silently\tunfinished\tended as")
	for _, row := range rows {
		ended := row.Kinds
		if ended == "" {
			ended = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", row.Policy, row.Responses, row.APIErrors, row.Lost, row.Unfinished, ended)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "fault\tpod\tfrom\tto\tpolicy\trouter saw\troutable after\tfresh after\tconverged after")
	for _, row := range rows {
		n := row.Policy
		for _, f := range r.Policies[n].Faults.Injected {
			saw := strings.Join(f.RouterSaw, ", ")
			if saw == "" {
				saw = "-"
			}
			measured := f.Probes > 0
			fmt.Fprintf(tw, "%s\t%s\t%.1fs\t%.1fs\t%s\t%s\t%s\t%s\t%s\n", f.Kind, f.Pod, f.StartS, f.EndS, n, saw,
				after(f.RoutableAfterS, measured), after(f.FreshAfterS, measured), after(f.ConvergedAfterS, measured))
		}
	}
	return tw.Flush()
}

// after formats a convergence time: "never" when it was measured and did
// not come within the bound, "-" when there was nothing to measure.
func after(s *float64, never bool) string {
	switch {
	case s != nil && *s == 0:
		return "0s"
	case s != nil:
		return Seconds(*s)
	case never:
		return "never"
	}
	return "-"
}

// faultsChart draws, per injected fault, how long each policy's router
// took to converge back: one bar per policy with a router, a pale bar to
// the bound for "never".
func faultsChart(r *Results) (chart, bool) {
	names, colors := r.policies()
	var with, cols []string
	var faults []Fault
	bound := 0.0
	for i, n := range names {
		f := r.Policies[n].Faults
		if f == nil || len(f.Injected) == 0 || f.Injected[0].Probes == 0 {
			continue
		}
		with, cols = append(with, n), append(cols, colors[i])
		if faults == nil {
			faults = f.Injected
		}
		for _, x := range f.Injected {
			if x.ConvergedAfterS != nil {
				bound = math.Max(bound, *x.ConvergedAfterS)
			}
		}
	}
	if len(with) == 0 {
		return chart{}, false
	}
	if bound == 0 {
		bound = 1
	}
	d := newSVG("Time until the router's view converged after each fault")
	y := axis{lo: 0, hi: bound * 1.2, from: chartH - padB, to: padT}
	d.frame(nil, y, "", "model seconds after the fault ended", nil, func(v float64) string { return after(&v, false) })
	group := float64(chartW-padL-padR) / float64(len(faults))
	w := math.Min(28, group*0.8/float64(len(with)))
	for k, f := range faults {
		cx := float64(padL) + group*(float64(k)+0.5)
		fmt.Fprintf(&d.b, `<text x="%s" y="%d" font-size="12" text-anchor="middle">%s (%s)</text>`, f1(cx), chartH-padB+16, esc(f.Kind), esc(f.Pod))
	}
	for i, n := range with {
		fmt.Fprintf(&d.b, `<g data-series="%s">`, esc(n))
		for k, f := range r.Policies[n].Faults.Injected {
			if k >= len(faults) {
				break
			}
			x := float64(padL) + group*(float64(k)+0.5) + w*(float64(i)-float64(len(with))/2)
			v, fill, label := y.hi, cols[i], "never"
			if f.ConvergedAfterS != nil {
				v, label = *f.ConvergedAfterS, after(f.ConvergedAfterS, true)
			} else {
				fill = "#e6e6e6"
			}
			top := y.at(v)
			fmt.Fprintf(&d.b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s" stroke="#fff"><title>%s, %s on %s: converged after %s</title></rect>`,
				f1(x), f1(top), f1(w), f1(math.Max(float64(chartH-padB)-top, 1)), fill, esc(n), esc(f.Kind), esc(f.Pod), esc(label))
		}
		d.b.WriteString(`</g>`)
	}
	d.legend(with, cols)
	return chart{ID: "faults", Title: "Convergence after faults", SVG: d.String(), Series: with,
		Caption: "For each injected fault, the model time from its end until the router routed every rank of the pod again with a fresh event stream " +
			"and its index held exactly the blocks the pod caches for every group's prompt. A pale bar to the top: not within the bound."}, true
}

// faultRow is one policy's line of the report's faults table.
type faultRow struct {
	Policy                                 string
	Responses, APIErrors, Lost, Unfinished int
	Kinds                                  string
}

func faultRows(r *Results) []faultRow {
	var rows []faultRow
	for _, n := range r.Order {
		p := r.Policies[n]
		if p == nil || p.Faults == nil {
			continue
		}
		f := p.Faults
		var kinds []string
		for _, k := range sortedKeys(f.APIErrors) {
			kinds = append(kinds, fmt.Sprintf("%s × %d", k, f.APIErrors[k]))
		}
		for _, k := range sortedKeys(f.Lost) {
			kinds = append(kinds, fmt.Sprintf("LOST %s × %d", k, f.Lost[k]))
		}
		rows = append(rows, faultRow{Policy: n, Responses: f.Responses, APIErrors: f.APIErrorCount(), Lost: f.LostCount(),
			Unfinished: f.Unfinished, Kinds: strings.Join(kinds, "; ")})
	}
	return rows
}
