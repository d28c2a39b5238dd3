// Command prefixrouter is the binary: an OpenAI-compatible front door for a
// fleet of vLLM pods, plus the tools an operator needs to wire and check it.
// This package parses flags and calls into the library packages; it holds no
// routing, hashing or decoding logic of its own.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v3"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// Exit codes: 2 means the input or flags were wrong, 1 means the command
// failed while doing its job.
const (
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the CLI and returns the process exit code; tests call it
// directly with their own streams.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	app := newApp(stdin, stdout, stderr)
	err := app.Run(ctx, args)
	if err == nil {
		return 0
	}
	var coder cli.ExitCoder
	code := exitFailure
	if errors.As(err, &coder) {
		code = coder.ExitCode()
	}
	msg := strings.TrimSpace(strings.ReplaceAll(err.Error(), "\n", " "))
	if arg, ok := helpTopic(msg); ok {
		// A command's -h with an argument: the parser takes the argument
		// for a help topic and exits 3; it is an argument like any other.
		code, msg = exitUsage, fmt.Sprintf("unexpected argument %q (give every value with its flag, e.g. --NAME VALUE)", arg)
	}
	if msg != "" {
		fmt.Fprintf(stderr, "prefixrouter: %s\n", msg)
	}
	return code
}

// helpTopic reads urfave/cli v3's "No help topic for 'ARG'";
// TestUnknownFlagsAndCommandsNameWhatWasMeant fails if a new version words it otherwise.
func helpTopic(msg string) (string, bool) {
	rest, ok := strings.CutPrefix(msg, "No help topic for '")
	if !ok || !strings.HasSuffix(rest, "'") {
		return "", false
	}
	return strings.TrimSuffix(rest, "'"), true
}

func newApp(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:    "prefixrouter",
		Usage:   "prefix-cache-aware router for vLLM fleets",
		Version: version,
		Reader:  stdin,
		Writer:  stdout,
		// Errors are printed once, by run, as a single line.
		ErrWriter:      io.Discard,
		ExitErrHandler: func(context.Context, *cli.Command, error) {},
		OnUsageError:   newFlagTable("").onUsageError,
		ArgValidator:   unknownCommand,
		Before:         warnUnreadEnv(stderr),
		Commands: []*cli.Command{
			hashCommand(stderr),
			serveCommand(),
			demoCommand(stderr),
			benchCommand(stderr),
			simCommand(),
			eventsCommand(),
			tokenizeCommand(stderr),
			ttlAdviseCommand(stderr),
			peerKeygenCommand(),
			versionCommand(),
			helpCommand(),
		},
	}
}

func versionCommand() *cli.Command {
	return newFlagTable("version").command(&cli.Command{
		Name:  "version",
		Usage: "print the version",
		Action: func(_ context.Context, cmd *cli.Command) error {
			_, err := fmt.Fprintln(cmd.Root().Writer, version)
			return err
		},
	})
}
