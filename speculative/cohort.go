package speculative

import "time"

// cohortWindow groups predictions by insertion time: a cohort holds the
// predictions of the requests dispatched within one window.
const cohortWindow = 5 * time.Second

// recentCohorts is how many mature cohorts the recent rates and trust
// cover: five minutes of insertions at cohortWindow.
const recentCohorts = 60

// The trust prior: a Beta prior on the block-confirmation rate with mean
// priorMean worth priorStrength blocks of evidence (α = 204.8 confirmed,
// β = 51.2 expired), about two 2,000-token prompts at block size 16. One
// early failed request of 125 blocks takes trust to 0.54, not to 0; one
// confirmed takes it to 0.87, not to 1; after ten thousand blocks the
// prior weighs under 3%.
const (
	priorMean     = 0.8
	priorStrength = 256.0
)

// outcome indexes a cohort's counts.
type outcome uint8

const (
	outcomeInserted outcome = iota
	outcomeConfirmed
	// outcomeExpired counts every expiry; outcomeEarly those of them a
	// confirmation followed within the grace window (stale = expired −
	// early).
	outcomeExpired
	outcomeEarly
	outcomeInvalidated
	outcomeWithdrawn
	outcomeUnknown
	numOutcomes
)

// counts are a cohort's predictions (blocks and tokens) by outcome and
// its requests. Rates are taken over decided predictions (confirmed or
// expired): pending ones are not decided yet, and invalidated, withdrawn
// and unknown ones say nothing of how well predictions are kept.
type counts struct {
	blocks, tokens [numOutcomes]int64
	// requests counts the requests with decided predictions when the
	// cohort matured; requestConfirmed sums each one's confirmed share.
	requests         int64
	requestConfirmed float64
	cohorts          int64
}

func (c *counts) addAll(o *counts) {
	for i := range c.blocks {
		c.blocks[i] += o.blocks[i]
		c.tokens[i] += o.tokens[i]
	}
	c.requests += o.requests
	c.requestConfirmed += o.requestConfirmed
	c.cohorts += o.cohorts
}

// decided is the rates' denominator in blocks.
func (c *counts) decided() int64 { return c.blocks[outcomeConfirmed] + c.blocks[outcomeExpired] }

// ended counts the predictions that reached a terminal state.
func (c *counts) ended() int64 {
	return c.blocks[outcomeConfirmed] + c.blocks[outcomeExpired] + c.blocks[outcomeInvalidated] +
		c.blocks[outcomeWithdrawn] + c.blocks[outcomeUnknown]
}

// posterior is the block-confirmation rate under the trust prior.
func (c *counts) posterior() float64 {
	a := priorMean * priorStrength
	return (float64(c.blocks[outcomeConfirmed]) + a) / (float64(c.decided()) + priorStrength)
}

// cohort is the predictions inserted in one window on one target.
type cohort struct {
	start int64
	// lastDeadline is the latest deadline of its predictions: the cohort
	// is mature once its window closed and lastDeadline plus the ingestion
	// allowance passed.
	lastDeadline int64
	mature       bool
	c            counts
	// reqs are the requests whose first predictions it holds, weighed
	// when it matures.
	reqs []*Placement
}

func (c *cohort) add(o outcome, tokens int64) {
	c.c.blocks[o]++
	c.c.tokens[o] += tokens
}

// cohortBook is a target's cohorts: the open (immature) ones, the recent
// mature ones and the total of all mature ones.
type cohortBook struct {
	open    []*cohort // by start
	recent  [recentCohorts]counts
	matured int64 // cohorts matured ever
	total   counts
}

// current is the cohort of insertions at now.
func (b *cohortBook) current(now int64) *cohort {
	w := int64(cohortWindow)
	start := now - now%w
	if now%w < 0 {
		start -= w
	}
	if n := len(b.open); n > 0 && b.open[n-1].start == start {
		return b.open[n-1]
	}
	c := &cohort{start: start}
	b.open = append(b.open, c)
	return c
}

// mature moves every cohort whose window has closed and whose last
// deadline plus allowance has passed into the mature totals. The caller
// has processed expiries up to now, so a mature cohort holds no pending
// prediction; the allowance is the grace window, so its early and stale
// expiries are final too.
func (b *cohortBook) mature(now, allowance int64) {
	keep := b.open[:0]
	for _, c := range b.open {
		if now < c.start+int64(cohortWindow) || now < c.lastDeadline+allowance {
			keep = append(keep, c)
			continue
		}
		c.mature = true
		for _, h := range c.reqs {
			if d := h.confirmed + h.expired; d > 0 {
				c.c.requests++
				c.c.requestConfirmed += float64(h.confirmed) / float64(d)
			}
		}
		c.reqs = nil
		c.c.cohorts = 1
		b.total.addAll(&c.c)
		b.recent[b.matured%recentCohorts] = c.c
		b.matured++
	}
	clear(b.open[len(keep):])
	b.open = keep
}

// recentSum is the recent mature cohorts' counts.
func (b *cohortBook) recentSum() counts {
	var s counts
	for i := range min(b.matured, recentCohorts) {
		s.addAll(&b.recent[i])
	}
	return s
}

// pendingSum is the open cohorts' counts.
func (b *cohortBook) pendingSum() counts {
	var s counts
	for _, c := range b.open {
		s.addAll(&c.c)
		s.cohorts++
	}
	return s
}
