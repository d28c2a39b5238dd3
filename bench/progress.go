package bench

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress shows a policy's run as it goes: a bar on a terminal, a line
// every few seconds otherwise. It also keeps the first detail of each
// error kind, for the log.
type progress struct {
	out      io.Writer
	terminal bool
	every    time.Duration

	policy              string
	total               int
	nSent, nDone, nFail atomic.Int64
	start               time.Time
	bar                 *progressbar.ProgressBar
	stop                chan struct{}
	wg                  sync.WaitGroup

	mu       sync.Mutex
	firstErr map[string]error
}

func newProgress(out io.Writer, terminal bool, every time.Duration) *progress {
	return &progress{out: out, terminal: terminal, every: every}
}

// begin starts showing one policy's run of total requests.
func (p *progress) begin(policy string, total int) {
	p.policy, p.total = policy, total
	p.nSent.Store(0)
	p.nDone.Store(0)
	p.nFail.Store(0)
	p.firstErr = map[string]error{}
	p.start = time.Now()
	p.stop = make(chan struct{})
	if p.out == nil {
		return
	}
	if p.terminal {
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(p.out),
			progressbar.OptionSetDescription(fmt.Sprintf("%-12s", policy)),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
	}
	p.wg.Add(1)
	go p.tick()
}

func (p *progress) tick() {
	defer p.wg.Done()
	t := time.NewTicker(p.every)
	if p.terminal {
		t.Reset(200 * time.Millisecond)
	}
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			if p.bar != nil {
				_ = p.bar.Set(int(p.nDone.Load()))
				p.bar.Describe(fmt.Sprintf("%-12s %d in flight, %d errors", p.policy, p.nSent.Load()-p.nDone.Load(), p.nFail.Load()))
				continue
			}
			fmt.Fprintf(p.out, "bench: %s: %d/%d answered or failed, %d in flight, %d errors, %s\n",
				p.policy, p.nDone.Load(), p.total, p.nSent.Load()-p.nDone.Load(), p.nFail.Load(), time.Since(p.start).Round(time.Second))
		}
	}
}

// end stops the display of the current policy.
func (p *progress) end() {
	if p.stop == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	p.stop = nil
	if p.bar != nil {
		_ = p.bar.Finish()
		p.bar = nil
	}
}

func (p *progress) sent() { p.nSent.Add(1) }

func (p *progress) done(failed bool) {
	p.nDone.Add(1)
	if failed {
		p.nFail.Add(1)
	}
}

// failure keeps the first detail of an error kind.
func (p *progress) failure(kind string, detail error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.firstErr[kind]; !ok {
		p.firstErr[kind] = detail
	}
}

// firstErrors returns the first detail of each error kind of the policy.
func (p *progress) firstErrors() map[string]error {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]error, len(p.firstErr))
	for k, v := range p.firstErr {
		out[k] = v
	}
	return out
}
