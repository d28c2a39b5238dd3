package bench

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prefixrouter/prefixrouter/bench/report"
	"github.com/prefixrouter/prefixrouter/bench/workload"
)

// errDrainBound cancels the requests still running when the drain bound
// passes.
var errDrainBound = errors.New("drain bound reached")

// errEarlierTurn marks the turns a session never sent because an earlier
// turn failed.
const errEarlierTurn = "not sent: an earlier turn failed"

// router picks where a prompt goes: a fixed URL, or the oracle's choice.
type routeFunc func(ctx context.Context, prompt string) (dest, error)

// drive runs a workload open-loop: each session starts at its time
// (model time / scale on the wall clock), whatever the server does; the
// turns of a session follow each other's answers after their think time.
// Once the last session has started, requests still running after drain
// (wall time) are cancelled and counted as unfinished.
type driver struct {
	w      *workload.Workload
	scale  float64
	route  routeFunc
	client *client
	podOf  func(answer, dest) string
	drain  time.Duration
	prog   *progress
}

func (d *driver) run(ctx context.Context) []report.Record {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu   sync.Mutex
		recs = make([]report.Record, 0, d.w.Requests())
		wg   sync.WaitGroup
	)
	start := time.Now()
	wall := func(model time.Duration) time.Duration { return time.Duration(float64(model) / d.scale) }
	model := func(wall time.Duration) float64 { return wall.Seconds() * d.scale }
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
sessions:
	for i := range d.w.Sessions {
		s := &d.w.Sessions[i]
		if wait := time.Until(start.Add(wall(s.Start))); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				break sessions
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers := make([]string, 0, len(s.Turns))
			// skip records the turns from k on as never sent.
			skip := func(k int, sent float64, why string) {
				mu.Lock()
				defer mu.Unlock()
				for j := k; j < len(s.Turns); j++ {
					recs = append(recs, report.Record{Session: i, Turn: j, Group: s.Group, Stage: s.Turns[j].Stage, Sent: sent, Err: why})
					d.prog.done(true)
				}
			}
			for k := range s.Turns {
				t := &s.Turns[k]
				rec := report.Record{Session: i, Turn: k, Group: s.Group, Stage: t.Stage}
				if k > 0 && t.Think > 0 {
					if !sleepCtx(ctx, wall(t.Think)) {
						skip(k, model(time.Since(start)), d.client.cancelled(ctx, errNoAnswer))
						return
					}
				}
				sent := time.Now()
				rec.Sent = model(sent.Sub(start))
				d.prog.sent()
				a := d.send(ctx, s, k, answers)
				rec.Status, rec.Err, rec.APIError = a.status, a.err, a.apiError
				if a.err == "" {
					rec.TTFT, rec.E2E = model(a.ttft), model(a.e2e)
					rec.PromptTokens, rec.CachedTokens, rec.OutputTokens = a.prompt, a.cached, a.output
					rec.Pod = a.pod
				}
				d.prog.done(a.err != "")
				mu.Lock()
				recs = append(recs, rec)
				mu.Unlock()
				if a.err != "" {
					// The conversation cannot go on without this answer.
					skip(k+1, rec.Sent, errEarlierTurn)
					return
				}
				answers = append(answers, a.text)
			}
		}()
	}
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()
	bound := time.NewTimer(d.drain)
	defer bound.Stop()
	select {
	case <-finished:
	case <-bound.C:
		cancel(errDrainBound)
		<-finished
	case <-ctx.Done():
		<-finished
	}
	return recs
}

// sentAnswer is an answer with the pod it came from.
type sentAnswer struct {
	answer
	pod string
}

func (d *driver) send(ctx context.Context, s *workload.Session, k int, answers []string) sentAnswer {
	prompt := s.Prompt(k, answers)
	to, err := d.route(ctx, prompt)
	if err != nil {
		return sentAnswer{answer: answer{err: d.client.cancelled(ctx, errNoAnswer), detail: err}}
	}
	a := d.client.do(ctx, to, prompt, s.Turns[k].MaxTokens, len(s.Turns) > 1)
	if a.detail != nil {
		d.prog.failure(a.err, a.detail)
	}
	return sentAnswer{answer: a, pod: d.podOf(a, to)}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
