package report

import (
	"bytes"
	"strings"
	"testing"
)

func TestFaultsTableAndChart(t *testing.T) {
	res := sampleResults()
	res.Workload["name"] = "faults"
	fast, slow := 0.5, 4.0
	injected := func(measured bool) []Fault {
		if !measured {
			return []Fault{{Kind: "dead", Pod: "pod-0", StartS: 2, EndS: 6}, {Kind: "drop events", Pod: "pod-1", StartS: 4, EndS: 16}}
		}
		return []Fault{
			{Kind: "dead", Pod: "pod-0", StartS: 2, EndS: 6, Probes: 12, RouterSaw: []string{"fresh", "circuit_open"},
				RoutableAfterS: &slow, FreshAfterS: &fast, ConvergedAfterS: &slow},
			{Kind: "drop events", Pod: "pod-1", StartS: 4, EndS: 16, Probes: 12, Mismatch: "probe 3 rank 0: router 0 blocks, pod 250"},
		}
	}
	res.Policies["round-robin"].Faults = &Faults{Responses: 37, APIErrors: map[string]int{"HTTP 503 service_unavailable": 2},
		Lost: map[string]int{"stream cut": 1}, Injected: injected(true)}
	res.Policies["precise"].Faults = &Faults{Responses: 40, Injected: injected(true)}
	res.Policies["oracle"].Faults = &Faults{Responses: 39, Unfinished: 1, Injected: injected(false)}
	var b bytes.Buffer
	if err := FaultsTable(&b, res); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for l := range strings.Lines(b.String()) {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	want := []string{
		"policy responses openai errors lost silently unfinished ended as",
		"round-robin 37 2 1 0 HTTP 503 service_unavailable × 2; LOST stream cut × 1",
		"precise 40 0 0 0 -",
		"oracle 39 0 0 1 -",
		"",
		"fault pod from to policy router saw routable after fresh after converged after",
		"dead pod-0 2.0s 6.0s round-robin fresh, circuit_open 4.00s 500ms 4.00s",
		"drop events pod-1 4.0s 16.0s round-robin - never never never",
		"dead pod-0 2.0s 6.0s precise fresh, circuit_open 4.00s 500ms 4.00s",
		"drop events pod-1 4.0s 16.0s precise - never never never",
		"dead pod-0 2.0s 6.0s oracle - - - -",
		"drop events pod-1 4.0s 16.0s oracle - - - -",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("table:\n%s", b.String())
	}
	page, err := HTML(res)
	if err != nil {
		t.Fatal(err)
	}
	// The oracle has no router to converge: the chart draws the others.
	if !strings.Contains(string(page), `id="faults" data-expect="round-robin,precise"`) || !strings.Contains(string(page), `<table id="faults">`) {
		t.Fatal("the page lacks the faults chart or table")
	}
}

func TestNoFaultsNoFaultsTable(t *testing.T) {
	var b bytes.Buffer
	if err := FaultsTable(&b, sampleResults()); err != nil || b.Len() != 0 {
		t.Fatalf("%q, %v", b.String(), err)
	}
}
