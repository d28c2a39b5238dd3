// Package report owns a benchmark's results: what each request measured
// (Record), the summary per policy that results.json holds (Results), the
// table printed on a terminal, and report.html, a self-contained page of
// SVG charts drawn here without scripts or network.
//
// Everything is a pure function of the records and the run's description,
// so a report can be redrawn from results.json alone.
package report
