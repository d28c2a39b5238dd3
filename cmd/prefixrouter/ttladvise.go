package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/speculative"
)

// ttlAdviseSettings is what the ttl-advise command's flags set.
type ttlAdviseSettings struct {
	Latencies string
	In        speculative.AdviceInput
}

func ttlAdviseCommand(stderr io.Writer) *cli.Command {
	s := ttlAdviseSettings{In: speculative.AdviceInput{
		Percentile:  speculative.DefaultConfig().TTLPercentile,
		TimingSlack: speculative.TimerResolution,
		MaxStale:    speculative.DefaultConfig().MaxStale,
	}}
	t := newFlagTable("ttl-advise")
	b := t.group("")
	return t.command(&cli.Command{
		Name:  "ttl-advise",
		Usage: "recommend a speculative-placement TTL from measured route-to-confirmation latencies",
		Description: "Reads one route-to-confirmation latency in seconds per line (--latencies, - for stdin) and prints\n" +
			"key: value lines: samples, p50, p95 and p99 (seconds), ttl (the --percentile quantile plus --backlog\n" +
			"plus --timing-slack, rounded up to 10ms once, capped by --max-stale: the arithmetic serve's automatic\n" +
			"TTL uses), and with --rate and --failure-rate, stale_exposure (the product of rate, failure rate and\n" +
			"ttl: the live predictions expected to have failed).",
		Flags: []cli.Flag{
			defaultText(b.str("latencies", "file of latencies in seconds, one a line; - reads stdin", &s.Latencies), "none, required"),
			bind(b, &cli.FloatFlag{Name: "percentile", Usage: "quantile of the latencies the TTL covers, in (0, 1)", Destination: &s.In.Percentile},
				speculative.CheckPercentile),
			bind(b, &cli.DurationFlag{Name: "backlog", Usage: "event backlog to add: how late the router applies events", Destination: &s.In.Backlog}, notNegative),
			bind(b, &cli.DurationFlag{Name: "timing-slack", Usage: "timer resolution to add", Destination: &s.In.TimingSlack}, notNegative),
			bind(b, &cli.DurationFlag{Name: "max-stale", Usage: "cap on the TTL (serve's --speculative-max-stale)", Destination: &s.In.MaxStale}, positiveDuration),
			defaultText(bind(b, &cli.FloatFlag{Name: "rate", Usage: "requests predicting per second, for stale_exposure", Destination: &s.In.Rate}, notNegativeFloat), "none"),
			defaultText(bind(b, &cli.FloatFlag{Name: "failure-rate", Usage: "probability that a prediction fails, for stale_exposure", Destination: &s.In.FailureRate}, probability), "none"),
		},
		Action: func(_ context.Context, cmd *cli.Command) error {
			rate, failure := cmd.IsSet("rate"), cmd.IsSet("failure-rate")
			if rate != failure {
				return usageError("give --rate and --failure-rate together (stale_exposure is their product with the ttl)")
			}
			s.In.HasExposure = rate
			return runTTLAdvise(cmd.Root().Reader, cmd.Root().Writer, stderr, &s)
		},
	})
}

func runTTLAdvise(stdin io.Reader, stdout, stderr io.Writer, s *ttlAdviseSettings) error {
	if s.Latencies == "" {
		return usageError("--latencies is required: a file of route-to-confirmation latencies in seconds, one a line")
	}
	r := stdin
	if s.Latencies != "-" {
		f, err := os.Open(s.Latencies)
		if err != nil {
			return usageError("--latencies: %v", err)
		}
		defer f.Close()
		r = f
	}
	lat, err := speculative.ReadLatencies(r)
	if err != nil {
		return usageError("--latencies %s: %v", s.Latencies, err)
	}
	a, err := speculative.Advise(lat, s.In)
	if err != nil {
		return usageError("%v", err)
	}
	if !a.Enough {
		fmt.Fprintf(stderr, "prefixrouter: note: %d latencies are fewer than the %d serve's controller waits for at this percentile (it keeps %s until then)\n",
			a.Samples, speculative.MinSamples(s.In.Percentile), min(speculative.InitialTTL, s.In.MaxStale))
	}
	return a.Write(stdout, s.In.HasExposure)
}

// positiveDuration refuses a duration that is not positive.
func positiveDuration(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("must be positive, got %v", d)
	}
	return nil
}

// notNegativeFloat refuses a negative number.
func notNegativeFloat(v float64) error {
	if !(v >= 0) {
		return fmt.Errorf("must not be negative, got %v", v)
	}
	return nil
}

// probability refuses a number outside [0, 1].
func probability(v float64) error {
	if !(v >= 0 && v <= 1) {
		return fmt.Errorf("%v is not a probability from 0 to 1", v)
	}
	return nil
}
