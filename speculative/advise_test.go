package speculative

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestReadLatencies(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []time.Duration
		err  string
	}{
		{"one a line", "0.5\n1.15\n0\n", []time.Duration{500 * time.Millisecond, 1150 * time.Millisecond, 0}, ""},
		{"spaces, CRLF, blank lines, no final newline", " 0.25 \r\n\n\t2e-3", []time.Duration{250 * time.Millisecond, 2 * time.Millisecond}, ""},
		{"empty", "", nil, "no latencies"},
		{"blank lines only", "\n \n", nil, "no latencies"},
		{"a word", "0.5\nfast\n", nil, `line 2: "fast" is not a latency`},
		{"negative", "-0.1", nil, "line 1"},
		{"NaN", "NaN", nil, "line 1"},
		{"infinite", "+Inf", nil, "line 1"},
		{"beyond a day", "86401", nil, "line 1"},
		{"two on a line", "0.1 0.2", nil, "line 1"},
		{"a unit", "150ms", nil, "line 1"},
		{"a long bad line is clipped", strings.Repeat("x", 100), nil, "…\" is not"},
		{"a line over 1 MiB", strings.Repeat("1", 1<<20+1), nil, "line 1: longer than 1 MiB"},
	}
	for _, tt := range tests {
		got, err := ReadLatencies(strings.NewReader(tt.in))
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: error %v, want %q", tt.name, err, tt.err)
			}
			continue
		}
		if err != nil || len(got) != len(tt.want) {
			t.Errorf("%s: %v, %v; want %v", tt.name, got, err, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%s: latency %d = %s, want %s", tt.name, i, got[i], tt.want[i])
			}
		}
	}
}

// FuzzReadLatencies: any input is read or refused with one line, never a
// panic, and what is read is a latency the arithmetic takes.
func FuzzReadLatencies(f *testing.F) {
	for _, s := range []string{"0.5\n1.15\n", "", "x", "1e308", "-0", " 0.1\r\n", "86400", "0x1p-2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		lat, err := ReadLatencies(strings.NewReader(in))
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error of more than one line: %q", err)
			}
			return
		}
		if len(lat) == 0 {
			t.Fatal("no latencies and no error")
		}
		for _, d := range lat {
			if d < 0 || d > maxLatency {
				t.Fatalf("latency %s out of range", d)
			}
		}
		a, err := Advise(lat, AdviceInput{Percentile: 0.99, MaxStale: 5 * time.Second})
		if err != nil || a.TTL <= 0 && a.P99 > 0 || a.TTL > 5*time.Second || a.Samples != len(lat) {
			t.Fatalf("advice %+v, %v", a, err)
		}
	})
}

func TestAdvise(t *testing.T) {
	// 1,000 latencies whose p99 is 1.15 s (the 990th: 900 at 0.4 s, 89 at
	// 0.9 s, 11 at 1.15 s).
	var lat []time.Duration
	lat = append(lat, repeat(400*time.Millisecond, 900)...)
	lat = append(lat, repeat(900*time.Millisecond, 89)...)
	lat = append(lat, repeat(1150*time.Millisecond, 11)...)
	in := AdviceInput{Percentile: 0.99, Backlog: 250 * time.Millisecond, TimingSlack: 100 * time.Millisecond,
		MaxStale: 5 * time.Second, Rate: 120, FailureRate: 0.004, HasExposure: true}
	a, err := Advise(lat, in)
	if err != nil {
		t.Fatal(err)
	}
	if a.Samples != 1000 || a.P50 != 400*time.Millisecond || a.P95 != 900*time.Millisecond || a.P99 != 1150*time.Millisecond ||
		a.TTL != 1500*time.Millisecond || !near(a.StaleExposure, 0.72) || !a.Enough {
		t.Fatalf("advice %+v", a)
	}
	var out bytes.Buffer
	if err := a.Write(&out, true); err != nil {
		t.Fatal(err)
	}
	want := "samples: 1000\np50: 0.4\np95: 0.9\np99: 1.15\nttl: 1.5\nstale_exposure: 0.72\n"
	if out.String() != want {
		t.Fatalf("output\n%s\nwant\n%s", out.String(), want)
	}

	bad := []struct {
		mod func(in *AdviceInput)
		err string
	}{
		{func(in *AdviceInput) { in.Percentile = 1 }, "--percentile: 1 is not a fraction"},
		{func(in *AdviceInput) { in.Percentile = 0 }, "--percentile"},
		{func(in *AdviceInput) { in.Backlog = -time.Second }, "--backlog"},
		{func(in *AdviceInput) { in.TimingSlack = -time.Second }, "--timing-slack"},
		{func(in *AdviceInput) { in.MaxStale = 0 }, "--max-stale"},
		{func(in *AdviceInput) { in.Rate = -1 }, "--rate"},
		{func(in *AdviceInput) { in.FailureRate = 1.5 }, "--failure-rate"},
	}
	for _, b := range bad {
		c := in
		b.mod(&c)
		if _, err := Advise(lat, c); err == nil || !strings.Contains(err.Error(), b.err) {
			t.Errorf("Advise(%+v): %v, want %q", c, err, b.err)
		}
	}
	if _, err := Advise(nil, in); err == nil {
		t.Error("advice from no latencies")
	}
	few, _ := Advise(lat[:10], in)
	if few.Enough {
		t.Error("10 samples are enough for p99")
	}
}
