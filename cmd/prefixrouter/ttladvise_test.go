package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeLatencies writes a latencies file and returns its path.
func writeLatencies(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "latencies.txt")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// designLatencies are 1,000 latencies whose p99 is 1.15 s (900 at 0.4 s,
// 89 at 0.9 s, 11 at 1.15 s), in a scrambled order.
func designLatencies() string {
	values := make([]string, 0, 1000)
	for _, g := range []struct {
		v string
		n int
	}{{"0.4", 900}, {"0.9", 89}, {"1.15", 11}} {
		for range g.n {
			values = append(values, g.v)
		}
	}
	var b strings.Builder
	for i := range values {
		b.WriteString(values[i*7919%len(values)] + "\n") // 7919 is prime to 1,000: a permutation
	}
	return b.String()
}

func TestTTLAdviseWorkedExample(t *testing.T) {
	clearEnv(t)
	// p99 1.15 s + backlog 0.25 s + slack 0.10 s gives 1.50 s; 120 req/s ×
	// 0.4% × 1.5 s gives 0.72 live failed predictions.
	path := writeLatencies(t, designLatencies())
	out, errOut, code := runCLI(t, "", "ttl-advise", "--latencies", path, "--backlog", "250ms", "--timing-slack", "100ms",
		"--rate", "120", "--failure-rate", "0.004")
	want := "samples: 1000\np50: 0.4\np95: 0.9\np99: 1.15\nttl: 1.5\nstale_exposure: 0.72\n"
	if code != 0 || out != want || errOut != "" {
		t.Fatalf("exit %d\nstdout %q\nstderr %q\nwant %q", code, out, errOut, want)
	}
	// Capped at the 5 s max-stale, the same rate and failure rate leave
	// 2.4 failed predictions live.
	out, _, code = runCLI(t, "", "ttl-advise", "--latencies", path, "--backlog", "4s", "--rate", "120", "--failure-rate", "0.004")
	if code != 0 || !strings.HasSuffix(out, "ttl: 5\nstale_exposure: 2.4\n") {
		t.Fatalf("capped at 5 s: exit %d, %q", code, out)
	}
}

func TestTTLAdvise(t *testing.T) {
	clearEnv(t)
	few := writeLatencies(t, "0.2\n0.3\n\n 0.5 \n")
	empty := writeLatencies(t, "")
	tests := []struct {
		name   string
		stdin  string
		args   []string
		env    map[string]string
		code   int
		stdout string
		stderr string // the whole of stderr, without the "prefixrouter: " prefix and newline; "" for none
	}{
		{"defaults, and a note on few samples", "", []string{"--latencies", few}, nil, 0,
			"samples: 3\np50: 0.3\np95: 0.5\np99: 0.5\nttl: 0.51\n",
			"note: 3 latencies are fewer than the 200 serve's controller waits for at this percentile (it keeps 2s until then)"},
		{"stdin", "1\n2\n", []string{"--latencies", "-", "--percentile", "0.5", "--timing-slack", "0s"}, nil, 0,
			"samples: 2\np50: 1\np95: 2\np99: 2\nttl: 1\n", "note: 2 latencies are fewer than the 32 serve's controller waits for at this percentile (it keeps 2s until then)"},
		{"capped by max-stale", "3\n", []string{"--latencies", "-", "--max-stale", "1s"}, nil, 0,
			"samples: 1\np50: 3\np95: 3\np99: 3\nttl: 1\n", "note: 1 latencies are fewer than the 200 serve's controller waits for at this percentile (it keeps 1s until then)"},
		{"from the environment", "0.5\n", []string{"--latencies", "-"}, map[string]string{"PREFIXROUTER_TTL_ADVISE_BACKLOG": "1s"}, 0,
			"samples: 1\np50: 0.5\np95: 0.5\np99: 0.5\nttl: 1.51\n", "note: 1 latencies are fewer than the 200 serve's controller waits for at this percentile (it keeps 2s until then)"},

		{"empty file", "", []string{"--latencies", empty}, nil, 2, "",
			"--latencies " + empty + ": no latencies: want one number of seconds per line"},
		{"bad line", "0.5\nsoon\n", []string{"--latencies", "-"}, nil, 2, "",
			`--latencies -: line 2: "soon" is not a latency in seconds (a number from 0 to 86400)`},
		{"percentile 1", "", []string{"--latencies", few, "--percentile", "1"}, nil, 2, "",
			"--percentile: 1 is not a fraction strictly between 0 and 1 (0.99 covers 99% of confirmations)"},
		{"percentile 0", "", []string{"--latencies", few, "--percentile", "0"}, nil, 2, "",
			"--percentile: 0 is not a fraction strictly between 0 and 1 (0.99 covers 99% of confirmations)"},
		{"percentile in the environment", "", []string{"--latencies", few}, map[string]string{"PREFIXROUTER_TTL_ADVISE_PERCENTILE": "99"}, 2, "",
			"PREFIXROUTER_TTL_ADVISE_PERCENTILE (--percentile): 99 is not a fraction strictly between 0 and 1 (0.99 covers 99% of confirmations)"},
		{"percentile not a number", "", []string{"--latencies", few, "--percentile", "p99"}, nil, 2, "",
			`--percentile: "p99" is not a number`},
		{"no latencies flag", "", nil, nil, 2, "",
			"--latencies is required: a file of route-to-confirmation latencies in seconds, one a line"},
		{"missing file", "", []string{"--latencies", "/nonexistent/latencies.txt"}, nil, 2, "",
			"--latencies: open /nonexistent/latencies.txt: no such file or directory"},
		{"rate alone", "", []string{"--latencies", few, "--rate", "10"}, nil, 2, "",
			"give --rate and --failure-rate together (stale_exposure is their product with the ttl)"},
		{"failure rate above 1", "", []string{"--latencies", few, "--rate", "10", "--failure-rate", "4"}, nil, 2, "",
			"--failure-rate: 4 is not a probability from 0 to 1"},
		{"negative backlog", "", []string{"--latencies", few, "--backlog", "-1s"}, nil, 2, "",
			"--backlog: must not be negative, got -1s"},
		{"zero max-stale", "", []string{"--latencies", few, "--max-stale", "0s"}, nil, 2, "",
			"--max-stale: must be positive, got 0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			out, errOut, code := runCLI(t, tt.stdin, append([]string{"ttl-advise"}, tt.args...)...)
			if code != tt.code || out != tt.stdout {
				t.Fatalf("exit %d, stdout %q, stderr %q\nwant exit %d, stdout %q", code, out, errOut, tt.code, tt.stdout)
			}
			if want := tt.stderr; want == "" && errOut != "" || want != "" && errOut != "prefixrouter: "+want+"\n" {
				t.Fatalf("stderr %q\nwant   %q", errOut, "prefixrouter: "+want+"\n")
			}
		})
	}
}

// FuzzTTLAdviseCommandLine: any latencies on stdin and any two arguments
// end with status 0 and output (the advice, or help), or status 2 and
// none; at most one line on stderr.
func FuzzTTLAdviseCommandLine(f *testing.F) {
	f.Add("0.5\n1.15\n", "--percentile", "0.5")
	f.Add("", "--rate", "3")
	f.Add("1e9\n", "--max-stale", "-1s")
	f.Add("0.1\r\n\n0.2", "--failure-rate=0.5", "--rate=NaN")
	f.Add("0.3", "--help", "")
	f.Fuzz(func(t *testing.T, stdin, a, b string) {
		args := []string{"ttl-advise", "--latencies", "-", a, b}
		out, errOut, code := runCLI(t, stdin, args...)
		if code != 0 && code != exitUsage {
			t.Fatalf("%q: exit %d", args, code)
		}
		if n := strings.Count(errOut, "\n"); n > 1 {
			t.Fatalf("%q: %d lines on stderr: %q", args, n, errOut)
		}
		if (code == 0) != (out != "") {
			t.Fatalf("%q: exit %d with stdout %q", args, code, out)
		}
	})
}
