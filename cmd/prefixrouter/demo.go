package main

import (
	"context"
	"io"

	"github.com/urfave/cli/v3"
)

// The demo is the README's first command: `bench --quick` on the
// shared-prefix workload with every policy available, its report written
// to bench-out/. It takes bench's flags (PREFIXROUTER_DEMO_<FLAG>) with
// those two defaults.
func demoCommand(stderr io.Writer) *cli.Command {
	s := defaultBenchSettings()
	s.Quick, s.Out = true, "bench-out"
	t := newFlagTable("demo")
	return t.command(&cli.Command{
		Name:  "demo",
		Usage: "the quick shared-prefix comparison of every policy on simulated pods: a table and a report (bench --quick --out bench-out)",
		Description: "Starts simulated vLLM pods on loopback and the router in front of them, runs the quick\n" +
			"shared-prefix workload under each policy on a fresh fleet, prints the table and writes\n" +
			"bench-out/results.json and bench-out/report.html. It takes every flag of `prefixrouter bench`.",
		Flags: s.flags(t),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			return runBench(ctx, cmd.Root().Writer, stderr, &s, cmd.IsSet("policies"), commandLine(cmd))
		},
	})
}
