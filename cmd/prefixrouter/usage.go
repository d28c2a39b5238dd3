package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/urfave/cli/v3"
)

// usageError reports bad input: one line, exit code 2.
func usageError(format string, args ...any) error {
	return cli.Exit(fmt.Sprintf(format, args...), exitUsage)
}

// onUsageError turns a flag-parsing failure into one line with exit code 2:
// an unknown flag gets the flag it was probably meant to be, a malformed
// value the reason its type refuses it.
func (t *flagTable) onUsageError(_ context.Context, cmd *cli.Command, err error, _ bool) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return usageError("%s", unknownFlag(name, t.renamed))
	}
	if raw, name, ok := invalidValue(msg); ok {
		if check := t.checks[name]; check != nil {
			if cerr := check(raw); cerr != nil {
				return usageError("--%s: %v", name, cerr)
			}
		}
	}
	if arg, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		return usageError("%s needs a value", arg)
	}
	return usageError("%s", msg)
}

// invalidValue reads the parser's `invalid value "RAW" for flag -NAME: ...`.
func invalidValue(msg string) (raw, name string, ok bool) {
	rest, ok := strings.CutPrefix(msg, "invalid value ")
	if !ok {
		return "", "", false
	}
	quoted, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", "", false
	}
	raw, _ = strconv.Unquote(quoted)
	rest, ok = strings.CutPrefix(rest[len(quoted):], " for flag -")
	if !ok {
		return "", "", false
	}
	name, _, ok = strings.Cut(rest, ":")
	return raw, name, ok
}

// unknownFlag names an unknown flag and, where it was renamed, its new name.
func unknownFlag(name string, renamed map[string]string) string {
	msg := "unknown flag " + dashed(name)
	if now, ok := renamed[name]; ok {
		return fmt.Sprintf("%s (renamed %s)", msg, dashed(now))
	}
	return msg
}

// dashed writes a flag name as it is typed.
func dashed(name string) string {
	if len([]rune(name)) == 1 {
		return "-" + name
	}
	return "--" + name
}
