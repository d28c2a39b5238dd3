package sim

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Fleet is a set of simulated pods started together.
type Fleet struct {
	Pods     []*Pod
	cfg      Config
	once     sync.Once
	err      error
	closeTok func()
}

// StartFleet starts cfg.Pods pods and returns once all of them accept
// connections; it stops whatever it started when one fails. Close the fleet
// when done. ctx bounds nothing after startup: pods run until Close.
func StartFleet(ctx context.Context, cfg Config) (*Fleet, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("sim config: %w", err)
	}
	f := &Fleet{cfg: c, closeTok: func() {}}
	tok := c.TokenizerImpl
	if tok == nil {
		if tok, f.closeTok, err = newTokenizer(c.Model, c.Tokenizer, c.Logger); err != nil {
			return nil, err
		}
	}
	for i := 0; i < c.Pods; i++ {
		if err := ctx.Err(); err != nil {
			f.Close()
			return nil, err
		}
		p, err := startPod(ctx, c, i, tok)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.Pods = append(f.Pods, p)
	}
	return f, nil
}

// Config is the fleet's configuration with defaults filled in.
func (f *Fleet) Config() Config { return f.cfg }

// Endpoints returns each pod's `--endpoint` value, in pod order.
func (f *Fleet) Endpoints() []string {
	out := make([]string, len(f.Pods))
	for i, p := range f.Pods {
		out[i] = p.Endpoint()
	}
	return out
}

// Close stops every pod; it is safe to call more than once.
func (f *Fleet) Close() error {
	f.once.Do(func() {
		var wg sync.WaitGroup
		errs := make([]error, len(f.Pods))
		for i, p := range f.Pods {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = p.Close()
			}()
		}
		wg.Wait()
		f.closeTok()
		f.err = errors.Join(errs...)
	})
	return f.err
}
