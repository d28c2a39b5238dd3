package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
)

// flagTable is one command's flags: every flag is bound to the field it sets
// (its default is the field's value when the flag is made), reads one
// environment variable (envName), and has one check that parses a raw value
// exactly as the command line does, so that the command line and the
// environment fail the same way, both with exit code 2.
type flagTable struct {
	name    string // the command's
	checks  map[string]func(raw string) error
	renamed map[string]string // a former flag name → its name now
	envErrs []string          // malformed environment variables met while parsing
}

func newFlagTable(command string) *flagTable {
	return &flagTable{name: command, checks: map[string]func(string) error{}, renamed: map[string]string{}}
}

// envName is the environment variable of a command's flag. serve's flags
// read PREFIXROUTER_<FLAG>, every other command's PREFIXROUTER_<COMMAND>_<FLAG>
// (dashes as underscores), so that a variable set for the router is never
// read by a tool; TestEnvironmentVariablesAreUnique checks that no two
// flags share one.
func envName(command, flag string) string {
	up := func(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "-", "_")) }
	if command == "serve" {
		return "PREFIXROUTER_" + up(flag)
	}
	return "PREFIXROUTER_" + up(command) + "_" + up(flag)
}

// command completes a command that uses the table: malformed environment
// variables, flag errors and stray arguments are usage errors with one line.
func (t *flagTable) command(cmd *cli.Command) *cli.Command {
	cmd.Before = t.reportEnv
	cmd.OnUsageError = t.onUsageError
	cmd.ArgValidator = rejectArguments
	return cmd
}

// rename records that a flag was called old before, so that the old name
// gets a pointer to the new one rather than a guess.
func (t *flagTable) rename(old, now string) { t.renamed[old] = now }

// reportEnv fails the command when an environment variable it reads did
// not parse; the sources skipped it, so nothing half-set runs.
func (t *flagTable) reportEnv(ctx context.Context, _ *cli.Command) (context.Context, error) {
	if len(t.envErrs) == 0 {
		return ctx, nil
	}
	slices.Sort(t.envErrs)
	msg := strings.Join(t.envErrs, "; ")
	t.envErrs = nil
	return ctx, usageError("%s", msg)
}

// binder makes the flags of one help category of a table.
type binder struct {
	t        *flagTable
	category string
}

func (t *flagTable) group(category string) binder { return binder{t, category} }

// bind completes a flag: category, default from its destination, the
// environment variable and the check. valid, if not nil, refuses parsed
// values the type alone accepts.
func bind[T any, C any, VC cli.ValueCreator[T, C]](b binder, f *cli.FlagBase[T, C, VC], valid func(T) error) *cli.FlagBase[T, C, VC] {
	f.Category = b.category
	if f.Destination != nil {
		f.Value = *f.Destination
	}
	f.Validator = valid
	check := func(raw string) error {
		var vc VC
		v := vc.Create(f.Value, new(T), f.Config)
		if err := v.Set(raw); err != nil {
			return badValue(f.TypeName(), raw, err)
		}
		if valid != nil {
			return valid(v.Get().(T))
		}
		return nil
	}
	b.t.checks[f.Name] = check
	f.Sources = cli.NewValueSourceChain(envSource{
		key: envName(b.t.name, f.Name), flag: f.Name, check: check, t: b.t, kind: reflect.TypeFor[T]().Kind(),
	})
	return f
}

// badValue says why a raw value is not of a flag's type.
func badValue(typeName, raw string, err error) error {
	if errors.Is(err, strconv.ErrRange) {
		return fmt.Errorf("%q is out of range", raw)
	}
	switch typeName {
	case "int":
		return fmt.Errorf("%q is not an integer", raw)
	case "uint":
		return fmt.Errorf("%q is not a non-negative integer", raw)
	case "float":
		return fmt.Errorf("%q is not a number", raw)
	case "duration":
		return fmt.Errorf("%q is not a duration (like 500ms, 30s or 2m)", raw)
	case "bool":
		return fmt.Errorf("%q is not true or false", raw)
	}
	return fmt.Errorf("%q: %v", raw, err)
}

// envSource is a flag's environment variable. A value its check refuses
// is recorded for reportEnv instead of reaching the flag, whose parser
// would fail the command with a plain error (exit 1) naming only the flag.
type envSource struct {
	key, flag string
	check     func(string) error
	t         *flagTable
	kind      reflect.Kind // of the flag's value
}

func (s envSource) Lookup() (string, bool) {
	v, ok := os.LookupEnv(s.key)
	switch {
	case !ok:
		return "", false
	case v == "" && s.kind == reflect.Bool:
		return v, true // false, as the parser reads it
	case v == "" && s.kind != reflect.String:
		return "", false // an empty number, duration or list is unset
	}
	if err := s.check(v); err != nil {
		s.t.envErrs = append(s.t.envErrs, fmt.Sprintf("%s (--%s): %v", s.key, s.flag, err))
		return "", false
	}
	return v, true
}

func (s envSource) String() string   { return fmt.Sprintf("environment variable %q", s.key) }
func (s envSource) GoString() string { return fmt.Sprintf("envSource{key:%q}", s.key) }
func (s envSource) IsFromEnv() bool  { return true }
func (s envSource) Key() string      { return s.key }

func (b binder) str(name, usage string, p *string) *cli.StringFlag {
	return bind(b, &cli.StringFlag{Name: name, Usage: usage, Destination: p}, nil)
}

// checked binds a string that valid must accept.
func (b binder) checked(name, usage string, p *string, valid func(string) error) *cli.StringFlag {
	return bind(b, &cli.StringFlag{Name: name, Usage: usage, Destination: p}, valid)
}

func (b binder) list(name, usage string, p *[]string) *cli.StringSliceFlag {
	return bind(b, &cli.StringSliceFlag{Name: name, Usage: usage, Destination: p}, nil)
}

func (b binder) dur(name, usage string, p *time.Duration) *cli.DurationFlag {
	return bind(b, &cli.DurationFlag{Name: name, Usage: usage, Destination: p}, nil)
}

func (b binder) int(name, usage string, p *int) *cli.IntFlag {
	return bind(b, &cli.IntFlag{Name: name, Usage: usage, Destination: p}, nil)
}

func (b binder) int64(name, usage string, p *int64) *cli.Int64Flag {
	return bind(b, &cli.Int64Flag{Name: name, Usage: usage, Destination: p}, nil)
}

func (b binder) uint64(name, usage string, p *uint64) *cli.Uint64Flag {
	return bind(b, &cli.Uint64Flag{Name: name, Usage: usage, Destination: p}, nil)
}

func (b binder) float(name, usage string, p *float64) *cli.FloatFlag {
	return bind(b, &cli.FloatFlag{Name: name, Usage: usage, Destination: p}, nil)
}

func (b binder) bool(name, usage string, p *bool) *cli.BoolFlag {
	return bind(b, &cli.BoolFlag{Name: name, Usage: usage, Destination: p}, nil)
}

// optional binds a string whose absence differs from every value, the empty
// string included: given records that the flag was set. absent is what help
// shows as the default; valid, if not nil, refuses values.
func (b binder) optional(name, usage, absent string, p *string, given *bool, valid func(string) error) *cli.StringFlag {
	return bind(b, &cli.StringFlag{Name: name, Usage: usage, Value: *p, DefaultText: absent,
		Action: func(_ context.Context, _ *cli.Command, v string) error {
			*p, *given = v, true
			return nil
		}}, valid)
}

// choice binds a named value (a policy, a mode): the flag takes format's
// names and parse turns them back; a name parse refuses is a usage error
// naming the flag or its variable.
func choice[T any](b binder, name, usage string, p *T, format func(T) string, parse func(string) (T, error)) *cli.StringFlag {
	return bind(b, &cli.StringFlag{Name: name, Usage: usage, Value: format(*p),
		Action: func(_ context.Context, _ *cli.Command, v string) error {
			x, err := parse(v)
			if err != nil {
				return usageError("--%s: %v", name, err)
			}
			*p = x
			return nil
		}}, func(v string) error {
		_, err := parse(v)
		return err
	})
}

// oneOf is a parse function for a choice among plain strings.
func oneOf(names ...string) func(string) (string, error) {
	return func(v string) (string, error) {
		for _, n := range names {
			if v == n {
				return v, nil
			}
		}
		return "", fmt.Errorf("unknown value %q (want %s)", v, orList(names))
	}
}

// orList joins names as "a, b or c".
func orList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

func identity(s string) string { return s }

// learnedOr checks a value that is either empty (learned elsewhere) or
// one parse accepts.
func learnedOr[T any](parse func(string) (T, error)) func(string) error {
	return func(v string) error {
		if v == "" {
			return nil
		}
		_, err := parse(v)
		return err
	}
}

// parseLogLevel reads --log-level.
var parseLogLevel = oneOf("debug", "info", "warn", "error")

// defaultText replaces the printed default where the zero value has a
// meaning of its own ("learned from the pods").
func defaultText[T any, C any, VC cli.ValueCreator[T, C]](f *cli.FlagBase[T, C, VC], text string) *cli.FlagBase[T, C, VC] {
	f.DefaultText = text
	return f
}
