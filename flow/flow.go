package flow

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Class is a priority class: requests of an earlier class in Config.Classes
// leave the line before any of a later one. Objective is the time to first
// token the class is promised (0: none), from which a request's deadline
// runs.
type Class struct {
	Name      string
	Objective time.Duration
}

// Config is the line's classes, shares and bounds.
type Config struct {
	// Classes are the priority classes, highest first.
	Classes []Class
	// DefaultClass is the class of a request that names none.
	DefaultClass string
	// Shares weighs the tenants named in it within their class (a tenant
	// not named weighs 1): a tenant of weight 2 is served twice the
	// tokens of one of weight 1 while both wait.
	Shares map[string]float64
	// MaxRequests and MaxTokens bound the line, in requests and in tokens
	// (prompt plus expected output).
	MaxRequests int
	MaxTokens   int64
}

// DefaultConfig is two classes, interactive (2 s to first token) before
// batch (60 s), interactive the default, every tenant weighing 1, and a
// line of up to 4,096 requests and 32 Mi tokens.
func DefaultConfig() Config {
	return Config{
		Classes:      []Class{{Name: "interactive", Objective: 2 * time.Second}, {Name: "batch", Objective: time.Minute}},
		DefaultClass: "interactive",
		MaxRequests:  4096,
		MaxTokens:    32 << 20,
	}
}

// Validate reports every fault of the config at once, each naming the
// serve flag that sets it.
func (c Config) Validate() error {
	var errs []error
	if len(c.Classes) == 0 {
		errs = append(errs, errors.New("--slo-ttft: at least one class"))
	}
	seen := map[string]bool{}
	for _, cl := range c.Classes {
		switch {
		case !validName(cl.Name):
			errs = append(errs, fmt.Errorf("--slo-ttft: class name %q must be 1 to 64 letters, digits, '-', '_' or '.'", cl.Name))
		case seen[cl.Name]:
			errs = append(errs, fmt.Errorf("--slo-ttft: class %q given twice", cl.Name))
		}
		seen[cl.Name] = true
		if cl.Objective < 0 {
			errs = append(errs, fmt.Errorf("--slo-ttft %s=%v: the objective must not be negative", cl.Name, cl.Objective))
		}
	}
	if c.DefaultClass != "" && !seen[c.DefaultClass] {
		errs = append(errs, fmt.Errorf("--default-class %q is none of the classes of --slo-ttft", c.DefaultClass))
	}
	for t, w := range c.Shares {
		if !(w > 0) || math.IsInf(w, 0) {
			errs = append(errs, fmt.Errorf("--tenant-share %s=%v: a share must be a positive finite number", t, w))
		}
	}
	if c.MaxRequests <= 0 {
		errs = append(errs, fmt.Errorf("--queue-max-requests %d must be positive", c.MaxRequests))
	}
	if c.MaxTokens <= 0 {
		errs = append(errs, fmt.Errorf("--queue-max-tokens %d must be positive", c.MaxTokens))
	}
	return errors.Join(errs...)
}

func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// ParseClass parses one --slo-ttft value, CLASS=DURATION.
func ParseClass(s string) (Class, error) {
	name, d, ok := strings.Cut(s, "=")
	if !ok {
		return Class{}, fmt.Errorf("--slo-ttft %q: want CLASS=DURATION, such as interactive=2s", s)
	}
	obj, err := time.ParseDuration(d)
	if err != nil {
		return Class{}, fmt.Errorf("--slo-ttft %q: %w", s, err)
	}
	return Class{Name: name, Objective: obj}, nil
}

// ParseShare parses one --tenant-share value, TENANT=WEIGHT.
func ParseShare(s string) (string, float64, error) {
	name, w, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return "", 0, fmt.Errorf("--tenant-share %q: want TENANT=WEIGHT, such as team-a=2", s)
	}
	v, err := strconv.ParseFloat(w, 64)
	if err != nil {
		return "", 0, fmt.Errorf("--tenant-share %q: %w", s, err)
	}
	return name, v, nil
}

// ClassIndex is the priority of the class named name (0 the highest), or
// -1 when there is none of that name.
func (c Config) ClassIndex(name string) int {
	return slices.IndexFunc(c.Classes, func(cl Class) bool { return cl.Name == name })
}

// ErrFull: the line holds its bound of requests or tokens.
var ErrFull = errors.New("the waiting line is full")

// Ticket is one request in the line. The caller fills the exported fields
// before Push and may read them at any time.
type Ticket struct {
	// Class is the request's priority (an index into Config.Classes).
	Class int
	// Tenant is whom the request is charged to.
	Tenant string
	// Tokens is what the request costs its tenant's share: prompt plus
	// expected output. Work is what it costs the pods before its first
	// token: its prompt.
	Tokens, Work int64
	// Arrived is when the request reached the router; Deadline when its
	// first token is due (zero: no deadline).
	Arrived, Deadline time.Time
	// Value is the caller's.
	Value any

	// start and finish are the ticket's tags in its class's virtual time;
	// cum is its tenant's tokens and work pushed up to and with it.
	start, finish float64
	cum           Amount
	tenant        *tenantLine
	queued        bool
}

// Queued reports whether the ticket is in the line.
func (t *Ticket) Queued() bool { return t.queued }

// Line is the waiting line of one pool of pods. It is not safe for
// concurrent use.
type Line struct {
	cfg     Config
	classes []classLine
	n       int
	sum     Amount
}

// Amount is tokens and work (see Ticket) summed over tickets.
type Amount struct{ Tokens, Work int64 }

func (a Amount) add(b Amount) Amount { return Amount{a.Tokens + b.Tokens, a.Work + b.Work} }
func (a Amount) sub(b Amount) Amount { return Amount{a.Tokens - b.Tokens, a.Work - b.Work} }

func (t *Ticket) amount() Amount { return Amount{t.Tokens, t.Work} }

// classLine is one class's waiting requests, a FIFO per tenant.
type classLine struct {
	// tenants are those waiting, and those whose last tags lie ahead of
	// the virtual time (pushed again, they start after them).
	tenants map[string]*tenantLine
	// busy orders the tenants with requests waiting by their next
	// ticket's start tag; idle holds the others until the virtual time
	// passes their last finish tag, when they are forgotten.
	busy busyHeap
	idle idleHeap
	// vtime is the class's virtual time: the start tag of the ticket
	// that left last.
	vtime float64
	n     int
	sum   Amount
}

type tenantLine struct {
	name   string
	weight float64
	fifo   []*Ticket
	// lastFinish is the finish tag of the tenant's last ticket pushed;
	// pushed the tokens pushed, popped the cum of its last ticket gone.
	lastFinish float64
	pushed     Amount
	popped     Amount
	busyAt     int // its index in busy (-1: not waiting)
}

// before orders two waiting tenants by their next tickets: the earlier
// start tag, then the earlier arrival.
func (a *tenantLine) before(b *tenantLine) bool {
	x, y := a.fifo[0], b.fifo[0]
	return x.start < y.start || x.start == y.start && x.Arrived.Before(y.Arrived)
}

type busyHeap []*tenantLine

func (h busyHeap) Len() int           { return len(h) }
func (h busyHeap) Less(i, j int) bool { return h[i].before(h[j]) }
func (h busyHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].busyAt, h[j].busyAt = i, j
}
func (h *busyHeap) Push(x any) {
	tl := x.(*tenantLine)
	tl.busyAt = len(*h)
	*h = append(*h, tl)
}
func (h *busyHeap) Pop() any {
	old := *h
	tl := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	tl.busyAt = -1
	return tl
}

// idleEntry is a tenant that had nothing waiting as of its lastFinish;
// entries go stale when it pushes again, and are skipped then.
type idleEntry struct {
	tl         *tenantLine
	lastFinish float64
}

type idleHeap []idleEntry

func (h idleHeap) Len() int           { return len(h) }
func (h idleHeap) Less(i, j int) bool { return h[i].lastFinish < h[j].lastFinish }
func (h idleHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *idleHeap) Push(x any)        { *h = append(*h, x.(idleEntry)) }
func (h *idleHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// New is an empty line. The config must be valid.
func New(cfg Config) *Line {
	l := &Line{cfg: cfg, classes: make([]classLine, len(cfg.Classes))}
	for i := range l.classes {
		l.classes[i].tenants = map[string]*tenantLine{}
	}
	return l
}

// Len is the requests waiting.
func (l *Line) Len() int { return l.n }

// Sum is the tokens and work of the requests waiting.
func (l *Line) Sum() Amount { return l.sum }

// ClassLen is the requests of class c waiting, and their tokens.
func (l *Line) ClassLen(c int) (int, int64) { return l.classes[c].n, l.classes[c].sum.Tokens }

// OldestOf is class c's longest waiting ticket (nil: none waits).
func (l *Line) OldestOf(c int) *Ticket {
	var old *Ticket
	for _, tl := range l.classes[c].busy {
		if t := tl.fifo[0]; old == nil || t.Arrived.Before(old.Arrived) {
			old = t
		}
	}
	return old
}

func (l *Line) weight(tenant string) float64 {
	if w, ok := l.cfg.Shares[tenant]; ok {
		return w
	}
	return 1
}

// Fits reports whether a ticket of tokens would fit within the bounds.
func (l *Line) Fits(tokens int64) bool {
	return l.n < l.cfg.MaxRequests && l.sum.Tokens+tokens <= l.cfg.MaxTokens
}

// tag is where a ticket of tenant and tokens would start and finish in
// class c's virtual time if pushed now.
func (l *Line) tag(c int, tenant string, tokens int64) (start, finish float64, tl *tenantLine) {
	cl := &l.classes[c]
	tl = cl.tenants[tenant]
	start = cl.vtime
	w := l.weight(tenant)
	if tl != nil {
		start = math.Max(start, tl.lastFinish)
		w = tl.weight
	}
	return start, start + float64(max(tokens, 1))/w, tl
}

// Ahead is the tokens and work the line would let leave before a ticket
// of class c, tenant and tokens pushed now: every waiting request of a
// higher class, and those of its own class whose start tag comes first.
func (l *Line) Ahead(c int, tenant string, tokens int64) Amount {
	var ahead Amount
	for i := 0; i < c; i++ {
		ahead = ahead.add(l.classes[i].sum)
	}
	start, _, _ := l.tag(c, tenant, tokens)
	for _, tl := range l.classes[c].busy {
		q := tl.fifo
		// The tenant's tags rise along its FIFO: the first k start no
		// later (at an equal tag the earlier arrival leaves first).
		k := sort.Search(len(q), func(i int) bool { return q[i].start > start })
		if tl.name == tenant {
			k = len(q)
		}
		if k > 0 {
			ahead = ahead.add(q[k-1].cum.sub(tl.popped))
		}
	}
	return ahead
}

// Push puts t in the line, or fails with ErrFull.
func (l *Line) Push(t *Ticket) error {
	if t.queued {
		return errors.New("flow: ticket pushed twice")
	}
	if t.Class < 0 || t.Class >= len(l.classes) {
		return fmt.Errorf("flow: no class %d", t.Class)
	}
	if !l.Fits(t.Tokens) {
		return ErrFull
	}
	cl := &l.classes[t.Class]
	start, finish, tl := l.tag(t.Class, t.Tenant, t.Tokens)
	if tl == nil {
		tl = &tenantLine{name: t.Tenant, weight: l.weight(t.Tenant), busyAt: -1}
		cl.tenants[t.Tenant] = tl
	}
	tl.lastFinish = finish
	tl.pushed = tl.pushed.add(t.amount())
	t.start, t.finish, t.cum, t.tenant, t.queued = start, finish, tl.pushed, tl, true
	tl.fifo = append(tl.fifo, t)
	if tl.busyAt < 0 {
		heap.Push(&cl.busy, tl)
	}
	cl.n++
	cl.sum = cl.sum.add(t.amount())
	l.n++
	l.sum = l.sum.add(t.amount())
	return nil
}

// Head is the ticket that leaves next (nil: the line is empty): the
// highest class's, of the tenant whose next ticket starts first.
func (l *Line) Head() *Ticket {
	for c := range l.classes {
		if b := l.classes[c].busy; len(b) > 0 {
			return b[0].fifo[0]
		}
	}
	return nil
}

// Pop takes the head out of the line and returns it (nil: empty).
func (l *Line) Pop() *Ticket {
	t := l.Head()
	if t == nil {
		return nil
	}
	cl := &l.classes[t.Class]
	cl.vtime = math.Max(cl.vtime, t.start)
	l.remove(t)
	l.prune(cl)
	return t
}

// Remove takes t out of the line wherever it stands (a client that gave
// up, a deadline passed); a ticket not queued is left alone.
func (l *Line) Remove(t *Ticket) {
	if !t.queued {
		return
	}
	l.remove(t)
	l.prune(&l.classes[t.Class])
}

func (l *Line) remove(t *Ticket) {
	tl := t.tenant
	cl := &l.classes[t.Class]
	i := slices.Index(tl.fifo, t)
	if i == 0 {
		tl.popped = t.cum
		tl.fifo[0] = nil
		tl.fifo = tl.fifo[1:]
	} else {
		// The tickets after it no longer have its tokens before them.
		for _, u := range tl.fifo[i+1:] {
			u.cum = u.cum.sub(t.amount())
		}
		tl.pushed = tl.pushed.sub(t.amount())
		tl.fifo = slices.Delete(tl.fifo, i, i+1)
	}
	switch {
	case len(tl.fifo) == 0:
		tl.fifo = nil
		heap.Remove(&cl.busy, tl.busyAt)
		heap.Push(&cl.idle, idleEntry{tl, tl.lastFinish})
	case i == 0:
		heap.Fix(&cl.busy, tl.busyAt)
	}
	cl.n--
	cl.sum = cl.sum.sub(t.amount())
	l.n--
	l.sum = l.sum.sub(t.amount())
	t.queued, t.tenant = false, nil
}

// prune forgets the tenants with nothing waiting whose tags the class's
// virtual time has passed (pushed again, they would start at the virtual
// time anyway), and every one once the class has nothing waiting: the
// tenants remembered are bounded by the requests waiting and those served
// within the last tags.
func (l *Line) prune(cl *classLine) {
	if cl.n == 0 {
		clear(cl.tenants)
		cl.idle = nil
		return
	}
	for len(cl.idle) > 0 && cl.idle[0].lastFinish <= cl.vtime {
		e := heap.Pop(&cl.idle).(idleEntry)
		if tl := e.tl; len(tl.fifo) == 0 && tl.lastFinish <= cl.vtime && cl.tenants[tl.name] == tl {
			delete(cl.tenants, tl.name)
		}
	}
}

// Overdue takes out of the line, and returns, the tickets whose deadline
// is before now.
func (l *Line) Overdue(now time.Time, out []*Ticket) []*Ticket {
	for c := range l.classes {
		for _, tl := range l.classes[c].tenants {
			for _, t := range tl.fifo {
				if !t.Deadline.IsZero() && t.Deadline.Before(now) {
					out = append(out, t)
				}
			}
		}
	}
	for _, t := range out {
		l.Remove(t)
	}
	return out
}
