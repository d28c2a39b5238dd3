package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
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
// value the reason its type refuses it. It reads the parser's messages as
// urfave/cli v3 words them; TestUnknownFlagsAndCommandsNameWhatWasMeant and
// TestNumbersAreTyped fail if a new version words them otherwise.
func (t *flagTable) onUsageError(_ context.Context, cmd *cli.Command, err error, _ bool) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return usageError("%s", unknownFlag(cmd, name, t.renamed))
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

// unknownFlag names an unknown flag and, where one is near enough to be
// meant, the flag to use instead: its new name, a close spelling, or the
// commands that have it.
func unknownFlag(cmd *cli.Command, name string, renamed map[string]string) string {
	msg := "unknown flag " + dashed(name)
	if now, ok := renamed[name]; ok {
		return fmt.Sprintf("%s (renamed %s)", msg, dashed(now))
	}
	var names []string
	for _, f := range cmd.VisibleFlags() {
		names = append(names, f.Names()...)
	}
	if s := closest(strings.ReplaceAll(name, "_", "-"), names); s != "" {
		return fmt.Sprintf("%s (did you mean %s?)", msg, dashed(s))
	}
	var owners []string
	for _, c := range cmd.Root().Commands {
		if c != cmd && slices.ContainsFunc(c.Flags, func(f cli.Flag) bool { return slices.Contains(f.Names(), name) }) {
			owners = append(owners, c.Name)
		}
	}
	if len(owners) > 0 {
		return fmt.Sprintf("%s (a flag of %s)", msg, orList(owners))
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

// rejectArguments refuses positional arguments: no command takes any, and
// one left over is a flag's value typed without its flag.
func rejectArguments(_ context.Context, cmd *cli.Command) error {
	if !cmd.Args().Present() {
		return nil
	}
	return usageError("unexpected argument %q (give every value with its flag, e.g. --NAME VALUE)", cmd.Args().First())
}

// unknownCommand is the root's argument check: the first argument named no
// command.
func unknownCommand(_ context.Context, cmd *cli.Command) error {
	if cmd != cmd.Root() || !cmd.Args().Present() {
		return nil // a command's own arguments, or no command at all
	}
	return notACommand(cmd, cmd.Args().First())
}

// notACommand says that name is no command of root, and which it probably
// was meant to be.
func notACommand(root *cli.Command, name string) error {
	var names []string
	for _, c := range root.Commands {
		if !c.Hidden {
			names = append(names, c.Names()...)
		}
	}
	msg := "unknown command " + name
	if s := closest(name, names); s != "" {
		return usageError("%s (did you mean %s?)", msg, s)
	}
	return usageError("%s (commands: %s)", msg, strings.Join(names, ", "))
}

// helpCommand replaces the parser's own, which answers an unknown topic
// with exit status 3 and another message than an unknown command's.
func helpCommand() *cli.Command {
	return &cli.Command{
		Name:         "help",
		Aliases:      []string{"h"},
		Usage:        "list the commands, or one command's flags",
		ArgsUsage:    "[COMMAND]",
		OnUsageError: newFlagTable("help").onUsageError,
		Action: func(ctx context.Context, cmd *cli.Command) error {
			root, args := cmd.Root(), cmd.Args()
			switch {
			case !args.Present():
				return cli.ShowRootCommandHelp(root)
			case args.Len() > 1:
				return usageError("unexpected argument %q (help takes one command)", args.Get(1))
			case root.Command(args.First()) == nil:
				return notACommand(root, args.First())
			}
			return cli.ShowCommandHelp(ctx, root, args.First())
		},
	}
}

// warnUnreadEnv warns, one line on stderr per variable, of PREFIXROUTER_
// variables that no command reads: a misspelt or outdated name would
// otherwise be ignored without a word. It does not refuse them: Kubernetes
// gives every pod variables named after each Service in its namespace
// (PREFIXROUTER_SERVICE_HOST, PREFIXROUTER_PORT_8000_TCP... for a Service
// named prefixrouter), and those are skipped.
func warnUnreadEnv(stderr io.Writer) cli.BeforeFunc {
	return func(ctx context.Context, root *cli.Command) (context.Context, error) {
		for _, p := range unreadEnv(root) {
			fmt.Fprintf(stderr, "prefixrouter: warning: %s\n", p)
		}
		return ctx, nil
	}
}

// kubernetesServiceVar matches the variables Kubernetes sets for a Service
// named prefixrouter (prefix already removed).
var kubernetesServiceVar = regexp.MustCompile(`^(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?)$`)

// unreadEnv names the PREFIXROUTER_ variables no command reads, each with
// the one probably meant.
func unreadEnv(root *cli.Command) []string {
	const prefix = "PREFIXROUTER_"
	var known []string // without the prefix
	for _, c := range root.Commands {
		for _, f := range c.Flags {
			if df, ok := f.(cli.DocGenerationFlag); ok {
				for _, v := range df.GetEnvVars() {
					known = append(known, strings.TrimPrefix(v, prefix))
				}
			}
		}
	}
	var problems []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		name, ok := strings.CutPrefix(k, prefix)
		if !ok || slices.Contains(known, name) || kubernetesServiceVar.MatchString(name) {
			continue
		}
		// A variable of one command's flag read by another before each
		// command had its own (PREFIXROUTER_TIME_SCALE for sim's).
		var meant []string
		for _, n := range known {
			if strings.HasSuffix(n, "_"+name) {
				meant = append(meant, prefix+n)
			}
		}
		if len(meant) == 0 {
			if s := closest(name, known); s != "" {
				meant = append(meant, prefix+s)
			}
		}
		p := k + " is read by no command"
		if len(meant) > 0 {
			p += " (did you mean " + strings.ReplaceAll(orList(meant), ", ", " or ") + "?)"
		}
		problems = append(problems, p)
	}
	slices.Sort(problems)
	return problems
}

// closest is the name s was probably meant to be: the nearest by edit
// distance (a typo: at most one edit per four characters, at least one),
// else the one name that begins with s, else the one whose last
// dash-separated word is a typo of s ("sed" for hash-seed); "" when
// nothing is near.
func closest(s string, names []string) string {
	if best := nearest(s, names); best != "" || len(s) < 3 {
		return best
	}
	var prefixed, byWord []string
	for _, n := range names {
		if strings.HasPrefix(n, s) && !slices.Contains(prefixed, n) {
			prefixed = append(prefixed, n)
		}
		if i := strings.LastIndexAny(n, "-_"); i >= 0 {
			if nearest(s, []string{n[i+1:]}) != "" && !slices.Contains(byWord, n) {
				byWord = append(byWord, n)
			}
		}
	}
	if len(prefixed) == 1 {
		return prefixed[0]
	}
	if len(prefixed) == 0 && len(byWord) == 1 {
		return byWord[0]
	}
	return ""
}

// nearest is the name closest to s within the typo distance, or "".
func nearest(s string, names []string) string {
	best, bestD := "", max(1, len(s)/4)+1
	for _, n := range names {
		if d := editDistance(s, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance counts the insertions, deletions, substitutions and swaps of
// neighbours that turn a into b (optimal string alignment).
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
