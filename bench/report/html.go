package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"strings"
)

// specRow is one pod's line of the speculative table.
type specRow struct{ Pod, TTL, Trust, Rate, Why string }

func specRows(s *Speculative) []specRow {
	if s == nil {
		return nil
	}
	rows := make([]specRow, 0, len(s.Pods))
	for _, p := range s.Pods {
		rate := "n/a"
		if p.BlockRate != nil {
			rate = percent(*p.BlockRate)
		}
		rows = append(rows, specRow{Pod: p.Pod, TTL: Seconds(p.TTLS), Trust: fmt.Sprintf("%.2f", p.Trust), Rate: rate, Why: p.TTLWhy})
	}
	return rows
}

// HTML renders report.html: the table, the notes and the charts, in one
// file that needs nothing else (no script, no network).
func HTML(r *Results) ([]byte, error) {
	charts := []chart{ttftCDF(r), cacheHit(r), throughput(r)}
	if len(r.PodNames()) > 0 {
		charts = append(charts, podShare(r))
	}
	if len(r.Stages) > 1 || r.Workload["name"] == "trace" {
		charts = append(charts, ttftOverTime(r))
	}
	for _, n := range r.Order {
		if p := r.Policies[n]; p != nil && len(p.Pairs) > 0 {
			charts = append(charts, pairsChart(r))
			break
		}
	}
	if c, ok := faultsChart(r); ok {
		charts = append(charts, c)
	}
	charts = append(charts, flowCharts(r)...)
	specPolicy, spec := r.specOf()
	if spec != nil {
		charts = append(charts, specFunnel(specPolicy, spec), specHoldback(specPolicy, spec))
	}
	params, err := json.MarshalIndent(r.Workload, "", "  ")
	if err != nil {
		return nil, err
	}
	fleet, err := json.MarshalIndent(r.Fleet, "", "  ")
	if err != nil {
		return nil, err
	}
	type row struct {
		Name                                        string
		Color                                       string
		Requests, Errors, Shed                      int
		P50, P90, P99, E2E90, Hit, Tput, ErrorKinds string
	}
	var rows []row
	names, colors := r.policies()
	for i, n := range names {
		p := r.Policies[n]
		var kinds []string
		for _, k := range sortedKeys(p.ErrorKinds) {
			kinds = append(kinds, fmt.Sprintf("%s × %d", k, p.ErrorKinds[k]))
		}
		rows = append(rows, row{Name: n, Color: colors[i], Requests: p.Requests, Errors: p.Errors, Shed: p.Shed,
			P50: Seconds(p.TTFT.P50), P90: Seconds(p.TTFT.P90), P99: Seconds(p.TTFT.P99), E2E90: Seconds(p.E2E.P90),
			Hit: percent(p.CacheHitRate), Tput: fmt.Sprintf("%.0f", p.OutputTokensPerS), ErrorKinds: strings.Join(kinds, "; ")})
	}
	type fig struct {
		ID, Title, Caption, Expect string
		SVG                        template.HTML
	}
	var figs []fig
	for _, c := range charts {
		// The SVG is built from escaped parts in svg.go.
		figs = append(figs, fig{ID: c.ID, Title: c.Title, Caption: c.Caption, Expect: strings.Join(c.Series, ","), SVG: template.HTML(c.SVG)})
	}
	flowRows, flowClasses, flowTenants := flowTable(r)
	var buf bytes.Buffer
	err = page.Execute(&buf, map[string]any{
		"R": r, "Rows": rows, "Figs": figs, "Params": string(params), "FleetJSON": string(fleet),
		"Name": r.Workload["name"], "Spec": spec, "Faults": faultRows(r), "SpecPolicy": specPolicy, "SpecRows": specRows(spec),
		"Flow": flowRows, "FlowClasses": flowClasses, "FlowTenants": flowTenants, "FC": r.FlowControl,
	})
	if err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

var page = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>prefixrouter bench: {{.Name}}</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d1d1f; margin: 0; background: #f6f7f9; }
main { max-width: 1080px; margin: 0 auto; padding: 24px 20px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; }
.run { color: #555; margin: 0 0 16px; }
table { border-collapse: collapse; width: 100%; background: #fff; box-shadow: 0 1px 2px rgba(0,0,0,.08); }
th, td { padding: 6px 10px; text-align: right; border-bottom: 1px solid #eee; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: #fafafa; font-weight: 600; }
td .swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(460px, 1fr)); gap: 16px; }
figure.chart { margin: 0; background: #fff; padding: 12px 12px 8px; box-shadow: 0 1px 2px rgba(0,0,0,.08); }
figure.chart svg { width: 100%; height: auto; display: block; }
figcaption { color: #555; font-size: 12.5px; margin-top: 4px; }
figcaption b { color: #1d1d1f; font-size: 14px; display: block; margin-bottom: 2px; }
.notes li { margin: 2px 0; }
.slot { border: 1px dashed #bbb; padding: 12px; color: #666; background: #fff; }
pre { background: #fff; padding: 10px; overflow: auto; font-size: 12px; box-shadow: 0 1px 2px rgba(0,0,0,.08); }
dl.read dt { font-weight: 600; } dl.read dd { margin: 0 0 6px 0; color: #444; }
</style>
</head>
<body>
<main>
<h1>prefixrouter bench: {{.Name}}</h1>
<p class="run">engine <b>{{.R.Engine}}</b> · seed {{.R.Seed}} · time scale {{.R.TimeScale}} (all times are model seconds){{if .R.Date}} · {{.R.Date}}{{end}}{{if .R.Command}}<br><code>{{.R.Command}}</code>{{end}}</p>

<table id="summary">
<thead><tr><th>policy</th><th>requests</th><th>errors</th><th>shed</th><th>TTFT p50</th><th>TTFT p90</th><th>TTFT p99</th><th>E2E p90</th><th>cache hit</th><th>output tok/s</th></tr></thead>
<tbody>
{{range .Rows}}<tr data-policy="{{.Name}}"><td><span class="swatch" style="background: {{.Color}}"></span>{{.Name}}</td><td>{{.Requests}}</td><td{{if .ErrorKinds}} title="{{.ErrorKinds}}"{{end}}>{{.Errors}}</td><td>{{.Shed}}</td><td>{{.P50}}</td><td>{{.P90}}</td><td>{{.P99}}</td><td>{{.E2E90}}</td><td>{{.Hit}}</td><td>{{.Tput}}</td></tr>
{{end}}</tbody>
</table>
{{if .R.Notes}}<h2>Notes</h2><ul class="notes">{{range .R.Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}

<h2>Charts</h2>
<div class="grid">
{{range .Figs}}<figure class="chart" id="{{.ID}}" data-expect="{{.Expect}}">
{{.SVG}}
<figcaption><b>{{.Title}}</b>{{.Caption}}</figcaption>
</figure>
{{end}}</div>

{{if .Flow}}<h2>Flow control: priority classes and tenants</h2>
<table id="flow-control">
<thead><tr><th>row</th><th>flow control</th><th>goodput / s</th>{{range .FlowClasses}}<th>{{.Name}} (objective {{.ObjectiveS}} s)</th>{{end}}</tr></thead>
<tbody>
{{range .Flow}}<tr data-policy="{{.Name}}"><td><span class="swatch" style="background: {{.Color}}"></span>{{.Name}}</td><td>{{.Arm}}</td><td>{{.Goodput}}</td>{{range .Classes}}<td>{{.}}</td>{{end}}</tr>
{{end}}</tbody>
</table>
{{if .FlowTenants}}<h2>Tenants: served of what each asked</h2>
<table id="tenants">
<thead><tr><th>row</th>{{range .FlowTenants}}<th>{{.}}</th>{{end}}</tr></thead>
<tbody>
{{range .Flow}}<tr><td><span class="swatch" style="background: {{.Color}}"></span>{{.Name}}</td>{{range .Tenants}}<td>{{.}}</td>{{end}}</tr>
{{end}}</tbody>
</table>{{end}}
<p>Goodput counts the answers whose time to first token was within their class's objective, per model second of the run. A shed request is the router's 429: flow control found that its objective could not be met, or its line full. Served is the prompt and output tokens of a tenant's answers over the prompt and max tokens of all it sent; a tenant is within its share when it asked no more than its weight's share of every tenant's served tokens. Dispatch budget {{.FC.BudgetS}} s of queued prefill per pod.</p>
{{end}}
{{if .Faults}}<h2>Faults: how every request ended</h2>
<table id="faults">
<thead><tr><th>policy</th><th>responses</th><th>OpenAI errors</th><th>lost silently</th><th>unfinished</th><th style="text-align:left">ended as</th></tr></thead>
<tbody>
{{range .Faults}}<tr><td>{{.Policy}}</td><td>{{.Responses}}</td><td>{{.APIErrors}}</td><td>{{.Lost}}</td><td>{{.Unfinished}}</td><td style="text-align:left; white-space:normal">{{.Kinds}}</td></tr>
{{end}}</tbody>
</table>
<p>A request is lost silently when it ended in neither a complete answer nor an OpenAI-shaped error: a stream cut without <code>[DONE]</code> or an error event, a refused connection, a body that is no OpenAI error.</p>
{{end}}
{{if .Spec}}<h2>Speculative routing: {{.SpecPolicy}}</h2>
<table id="speculative">
<thead><tr><th>pod</th><th>TTL</th><th>trust</th><th>mature block confirmation</th><th>why this TTL (the router's clock: wall time, model time × 1/{{.R.TimeScale}})</th></tr></thead>
<tbody>
{{range .SpecRows}}<tr><td>{{.Pod}}</td><td>{{.TTL}}</td><td>{{.Trust}}</td><td>{{.Rate}}</td><td style="text-align:left; white-space:normal">{{.Why}}</td></tr>
{{end}}</tbody>
</table>
<p>Mature predictions (blocks): {{.Spec.Mature.Inserted}} inserted, {{.Spec.Mature.Confirmed}} confirmed, {{.Spec.Mature.ExpiredEarly}} expired early, {{.Spec.Mature.ExpiredStale}} expired stale, {{.Spec.Mature.Invalidated}} invalidated, {{.Spec.Mature.Withdrawn}} withdrawn, {{.Spec.Mature.Unknown}} unknown{{if not .Spec.Settled}}; {{.Spec.Immature}} not mature when the run ended, left out{{end}}.</p>
{{end}}
<h2>How to read the table</h2>
<dl class="read">
<dt>requests, errors, shed</dt><dd>Requests sent; those without a complete answer (any reason); the part of those the server refused for load (HTTP 429 or 503).</dd>
<dt>TTFT p50 / p90 / p99</dt><dd>Time to the first streamed token, measured by the client, over answered requests; model seconds (wall time × the time scale).</dd>
<dt>E2E p90</dt><dd>Time to the end of the stream.</dd>
<dt>cache hit</dt><dd>Cached prompt tokens over prompt tokens, as the pods report them.</dd>
<dt>output tok/s</dt><dd>Generated tokens of answered requests per model second, first request sent to last answer.</dd>
</dl>

<h2>Workload</h2>
<pre id="workload">{{.Params}}</pre>
<h2>Fleet</h2>
<pre id="fleet">{{.FleetJSON}}</pre>
</main>
</body>
</html>
`))
