// Package positive owns the one rule the packages' configurations share for
// durations and counts: a field must be positive, a zero one stands for
// "take the default" where a configuration is filled in by hand (tests,
// embedders), and every error names the serve flag that sets the field.
package positive

import (
	"fmt"
	"time"
)

// Duration is a duration field and the flag that sets it.
type Duration struct {
	Flag string
	V    *time.Duration
}

// Int is a count field and the flag that sets it.
type Int struct {
	Flag string
	V    *int
}

// Fields are a configuration's fields that must be positive.
type Fields struct {
	Durations []Duration
	Ints      []Int
}

// Fill sets every zero field to the same field of defaults, which lists
// the default configuration's fields in the same order.
func (fs Fields) Fill(defaults Fields) {
	for i, f := range fs.Durations {
		if *f.V == 0 {
			*f.V = *defaults.Durations[i].V
		}
	}
	for i, f := range fs.Ints {
		if *f.V == 0 {
			*f.V = *defaults.Ints[i].V
		}
	}
}

// Check returns one error per field that is not positive.
func (fs Fields) Check() []error {
	var errs []error
	for _, f := range fs.Durations {
		if *f.V <= 0 {
			errs = append(errs, fmt.Errorf("--%s must be positive, not %s", f.Flag, *f.V))
		}
	}
	for _, f := range fs.Ints {
		if *f.V <= 0 {
			errs = append(errs, fmt.Errorf("--%s must be at least 1, not %d", f.Flag, *f.V))
		}
	}
	return errs
}
