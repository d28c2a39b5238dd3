package main

import (
	"context"
	"time"

	"github.com/urfave/cli/v3"
)

// binder makes flags bound to the fields they set: a flag's default is the
// field's value when the flag is made, parsing writes the field, and the
// environment variable PREFIXROUTER_<FLAG> is a source. category groups the
// flags in help and in docs/configuration.md.
type binder struct{ category string }

func (b binder) str(name, usage string, p *string) *cli.StringFlag {
	return &cli.StringFlag{Name: name, Category: b.category, Usage: usage, Value: *p, Destination: p, Sources: envVar(name)}
}

func (b binder) list(name, usage string, p *[]string) *cli.StringSliceFlag {
	return &cli.StringSliceFlag{Name: name, Category: b.category, Usage: usage, Value: *p, Destination: p, Sources: envVar(name)}
}

func (b binder) dur(name, usage string, p *time.Duration) *cli.DurationFlag {
	return &cli.DurationFlag{Name: name, Category: b.category, Usage: usage, Value: *p, Destination: p, Sources: envVar(name)}
}

func (b binder) int(name, usage string, p *int) *cli.IntFlag {
	return &cli.IntFlag{Name: name, Category: b.category, Usage: usage, Value: *p, Destination: p, Sources: envVar(name)}
}

func (b binder) int64(name, usage string, p *int64) *cli.Int64Flag {
	return &cli.Int64Flag{Name: name, Category: b.category, Usage: usage, Value: *p, Destination: p, Sources: envVar(name)}
}

func (b binder) float(name, usage string, p *float64) *cli.FloatFlag {
	return &cli.FloatFlag{Name: name, Category: b.category, Usage: usage, Value: *p, Destination: p, Sources: envVar(name)}
}

func (b binder) bool(name, usage string, p *bool) *cli.BoolFlag {
	return &cli.BoolFlag{Name: name, Category: b.category, Usage: usage, Value: *p, Destination: p, Sources: envVar(name)}
}

// optional binds a string whose absence differs from every value, the empty
// string included: given records that the flag was set. absent is what help
// shows as the default.
func (b binder) optional(name, usage, absent string, p *string, given *bool) *cli.StringFlag {
	return &cli.StringFlag{Name: name, Category: b.category, Usage: usage, Value: *p, DefaultText: absent, Sources: envVar(name),
		Action: func(_ context.Context, _ *cli.Command, v string) error {
			*p, *given = v, true
			return nil
		}}
}

// choice binds a named value (a policy, a mode): the flag takes format's
// names, parse turns them back, and a name parse refuses is a usage error
// naming the flag.
func choice[T any](b binder, name, usage string, p *T, format func(T) string, parse func(string) (T, error)) *cli.StringFlag {
	return &cli.StringFlag{Name: name, Category: b.category, Usage: usage, Value: format(*p), Sources: envVar(name),
		Action: func(_ context.Context, _ *cli.Command, v string) error {
			x, err := parse(v)
			if err != nil {
				return usageError("--%s: %v", name, err)
			}
			*p = x
			return nil
		}}
}

// defaultText replaces the printed default where the zero value has a
// meaning of its own ("learned from the pods").
func defaultText[T any, C any, VC cli.ValueCreator[T, C]](f *cli.FlagBase[T, C, VC], text string) *cli.FlagBase[T, C, VC] {
	f.DefaultText = text
	return f
}
