package speculative

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxLatency bounds one latency read by ReadLatencies: a day is no
// route-to-confirmation latency, and beyond it a duration's nanoseconds
// would soon overflow.
const maxLatency = 24 * time.Hour

// ReadLatencies reads route-to-confirmation latencies, one number of
// seconds per line (surrounding spaces and a final newline allowed, blank
// lines skipped). A line that is not a finite, non-negative number of at
// most a day is an error naming the line; so is a file without any.
func ReadLatencies(r io.Reader) ([]time.Duration, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	var out []time.Duration
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		v, err := strconv.ParseFloat(text, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > maxLatency.Seconds() {
			return nil, fmt.Errorf("line %d: %q is not a latency in seconds (a number from 0 to %g)", line, clip(text), maxLatency.Seconds())
		}
		out = append(out, time.Duration(math.Round(v*float64(time.Second))))
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("line %d: longer than 1 MiB", line+1)
		}
		return nil, fmt.Errorf("read latencies: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("no latencies: want one number of seconds per line")
	}
	return out, nil
}

// clip shortens a bad line for an error message.
func clip(s string) string {
	if r := []rune(s); len(r) > 40 {
		return string(r[:40]) + "…"
	}
	return s
}

// AdviceInput is what a TTL is advised from besides the latencies.
type AdviceInput struct {
	Percentile  float64
	Backlog     time.Duration
	TimingSlack time.Duration
	MaxStale    time.Duration
	// Rate and FailureRate, when HasExposure, give the stale exposure.
	Rate, FailureRate float64
	HasExposure       bool
}

// Advice is a TTL advised offline, by the arithmetic the controller uses.
type Advice struct {
	Samples       int
	P50, P95, P99 time.Duration
	Quantile      time.Duration // at AdviceInput.Percentile
	TTL           time.Duration
	// Enough says whether the controller would follow this many samples
	// (MinSamples) rather than keep InitialTTL.
	Enough bool
	// StaleExposure is Rate × FailureRate × TTL (HasExposure only).
	StaleExposure float64
}

// Advise computes the TTL the controller would move to for these
// latencies (sorted in place), checking the input as the ttl-advise
// command's flags must be.
func Advise(lat []time.Duration, in AdviceInput) (Advice, error) {
	if err := CheckPercentile(in.Percentile); err != nil {
		return Advice{}, fmt.Errorf("--percentile: %w", err)
	}
	switch {
	case in.Backlog < 0:
		return Advice{}, fmt.Errorf("--backlog %s: must not be negative", in.Backlog)
	case in.TimingSlack < 0:
		return Advice{}, fmt.Errorf("--timing-slack %s: must not be negative", in.TimingSlack)
	case in.MaxStale <= 0:
		return Advice{}, fmt.Errorf("--max-stale %s: must be positive", in.MaxStale)
	case in.HasExposure && (math.IsNaN(in.Rate) || math.IsInf(in.Rate, 0) || in.Rate < 0):
		return Advice{}, fmt.Errorf("--rate %v: want requests per second, 0 or more", in.Rate)
	case in.HasExposure && (math.IsNaN(in.FailureRate) || in.FailureRate < 0 || in.FailureRate > 1):
		return Advice{}, fmt.Errorf("--failure-rate %v: want a probability from 0 to 1", in.FailureRate)
	case len(lat) == 0:
		return Advice{}, errors.New("no latencies")
	}
	slices.Sort(lat)
	a := Advice{Samples: len(lat), P50: Quantile(lat, 0.5), P95: Quantile(lat, 0.95), P99: Quantile(lat, 0.99),
		Quantile: Quantile(lat, in.Percentile), Enough: len(lat) >= MinSamples(in.Percentile)}
	a.TTL = TTLFor(a.Quantile, in.Backlog, in.TimingSlack, in.MaxStale)
	if in.HasExposure {
		a.StaleExposure = Exposure(in.Rate, in.FailureRate, a.TTL)
	}
	return a, nil
}

// Write prints the advice as `key: value` lines, durations in seconds.
func (a Advice) Write(w io.Writer, hasExposure bool) error {
	sec := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) }
	b := &strings.Builder{}
	fmt.Fprintf(b, "samples: %d\np50: %s\np95: %s\np99: %s\nttl: %s\n", a.Samples, sec(a.P50), sec(a.P95), sec(a.P99), sec(a.TTL))
	if hasExposure {
		fmt.Fprintf(b, "stale_exposure: %s\n", strconv.FormatFloat(roundTo(a.StaleExposure, 9), 'f', -1, 64))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// roundTo rounds to n decimals, so that 120 × 0.004 × 1.5 prints 0.72
// rather than its binary neighbour.
func roundTo(v float64, n int) float64 {
	p := math.Pow10(n)
	return math.Round(v*p) / p
}
