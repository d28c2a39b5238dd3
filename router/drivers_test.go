package router

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/brain"
	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/internal/manualclock"
	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// The two drivers of the routing brain, the HTTP front door and the
// discrete-event engine's brain.Virtual, must decide alike: the same
// fleet, prompts and KV events give the same target, the same predicted
// cached tokens and the same confirmed run, request by request.
//
// Both are driven one request at a time, each answered (and, for the HTTP
// router, its flight released and its events confirmed in the index)
// before the next, so that every decision sees empty ledgers and the same
// index. A cost tie breaks at random in the HTTP router (the process's
// generator) and by a seed in Virtual, so the scenario has one tie only,
// its first request, among pods in the same state (empty): each driver's
// choice there names pod 0 of the scenario, and every later decision is
// compared by that naming, without ties.

// drvBlockSize is the fleet's block size; drvPods the fleet's size.
const (
	drvBlockSize = 16
	drvPods      = 3
)

// drvDecision is what one driver decided for a request, the targets named
// by the scenario's pod numbers.
type drvDecision struct {
	target    int
	predicted int
	confirmed int
	// failed is the pod the request's first attempt failed on (-1: none).
	failed int
}

// diff names the fields in which d and o differ.
func (d drvDecision) diff(o drvDecision) string {
	var f []string
	if d.target != o.target {
		f = append(f, "target")
	}
	if d.predicted != o.predicted {
		f = append(f, "predicted cached tokens")
	}
	if d.confirmed != o.confirmed {
		f = append(f, "confirmed blocks")
	}
	if d.failed != o.failed {
		f = append(f, "failed attempt")
	}
	return strings.Join(f, ", ")
}

func (d drvDecision) String() string {
	s := fmt.Sprintf("target pod %d, predicted cached %d tokens, confirmed %d blocks", d.target, d.predicted, d.confirmed)
	if d.failed >= 0 {
		s += fmt.Sprintf(", after failing on pod %d", d.failed)
	}
	return s
}

// drvStep is one step of the scenario: KV events alone (store), or a
// request (prompt).
type drvStep struct {
	name string
	// store publishes, from pod storePod, BlockStored for the first
	// storeBlocks blocks of prompt, with no request: what the pod
	// computed for a client the router did not see.
	storePod, storeBlocks int
	prompt                []uint32
	// tie: every pod is in the same state and the choice is any of them;
	// it names pod 0 from then on.
	tie bool
	// failFirst: the first attempt's pod fails before its first byte
	// (HTTP: answers 503), and the request is retried.
	failFirst bool
	// withhold: the pod that answered publishes its blocks only after the
	// next request (a follower before the events).
	withhold bool
	// want is the decision both drivers must make (the scenario's
	// expectation, per policy).
	want map[brain.Policy]drvDecision
}

// drvDriver is one way of driving the brain: it answers requests on its
// fleet and delivers its pods' KV events.
type drvDriver interface {
	// publish hands pod's BlockStored for keys[from:] of ids to the
	// router and returns once its index holds them.
	publish(pod int, ids []uint32, keys []kvindex.Key, from int)
	// send routes ids; cached says what each pod serves from its cache
	// (the pod's usage.prompt_tokens_details.cached_tokens).
	send(ids []uint32, failFirst bool, cached [drvPods]int) drvDecision
	// bind makes pod the physical target the driver chose.
	bind(pod, physical int)
}

// drvPerm maps the scenario's pod numbers to a driver's targets.
type drvPerm [drvPods]int

func identityPerm() drvPerm {
	var p drvPerm
	for i := range p {
		p[i] = i
	}
	return p
}

// bind swaps so that pod names physical.
func (p *drvPerm) bind(pod, physical int) {
	for i, ph := range p {
		if ph == physical {
			p[i], p[pod] = p[pod], ph
			return
		}
	}
}

// pod is the scenario's number of physical target ph.
func (p *drvPerm) pod(ph int) int {
	for i, x := range p {
		if x == ph {
			return i
		}
	}
	return -1
}

// httpDriver is the front door on real HTTP and ZMQ in front of fake pods
// whose events the test publishes.
type httpDriver struct {
	t      *testing.T
	r      *Router
	pods   [drvPods]*fakePod
	perm   drvPerm
	cached [drvPods]atomic.Int64
	// failNext makes the next attempt's pod, whichever it is, fail.
	failNext atomic.Bool
}

func newHTTPDriver(t *testing.T, cfg Config) *httpDriver {
	t.Helper()
	d := &httpDriver{t: t, perm: identityPerm()}
	var eps []string
	for i := range d.pods {
		p := newFakePod(t, "pod-"+strconv.Itoa(i), drvBlockSize, true)
		p.setHandler(d.answer(i))
		d.pods[i] = p
		eps = append(eps, p.endpoint())
	}
	cfg.Health = fastHealth(eps...)
	d.r = startRouter(t, cfg)
	waitFor(t, "every pod routable with a fresh event stream", func() bool { return freshCount(d.r, "m") == drvPods })
	waitFor(t, "block keys", d.r.KeysReady)
	return d
}

// answer is physical pod ph's completions handler: vLLM's answer with the
// cached tokens the test says the pod holds, or a 503 before any byte
// when the test set the next attempt to fail.
func (d *httpDriver) answer(ph int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt []uint32 `json:"prompt"`
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &req)
		if d.failNext.CompareAndSwap(true, false) {
			http.Error(w, `{"error":{"message":"engine overloaded","type":"server_error"}}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"."}],"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`,
			len(req.Prompt), len(req.Prompt)+1, d.cached[ph].Load())
	}
}

func (d *httpDriver) id(ph int) targetid.ID { return targetid.ID{Endpoint: d.pods[ph].srv.URL} }

func (d *httpDriver) bind(pod, physical int) { d.perm.bind(pod, physical) }

func (d *httpDriver) publish(pod int, ids []uint32, keys []kvindex.Key, from int) {
	d.t.Helper()
	ph := d.perm[pod]
	b := storedBatch(ids, keys, from)
	b.TS = float64(time.Now().UnixNano()) / 1e9
	if _, err := d.pods[ph].pub.Publish(&b, events.EncodingMap); err != nil {
		d.t.Fatal(err)
	}
	id := d.id(ph)
	waitFor(d.t, fmt.Sprintf("the index to hold %d blocks on pod %d", len(keys), pod), func() bool {
		for _, m := range d.r.ev.Index().Lookup(nil, keys) {
			if m.Target == id {
				return m.Blocks == len(keys)
			}
		}
		return false
	})
}

func (d *httpDriver) send(ids []uint32, failFirst bool, cached [drvPods]int) drvDecision {
	d.t.Helper()
	// Every decision on empty ledgers and trusted streams: the previous
	// request's flight is released after its answer reached the client.
	waitFor(d.t, "no request in flight and every stream fresh", func() bool {
		for _, tg := range d.r.mon.Snapshot().ForModel("m") {
			if tg.Busy().InFlight != 0 || d.r.ev.Verdict(tg.ID) != eventplane.VerdictFresh {
				return false
			}
		}
		return true
	})
	var before [drvPods]int64
	for ph := range d.pods {
		d.cached[ph].Store(int64(cached[d.perm.pod(ph)]))
		before[ph] = d.pods[ph].hits.Load()
	}
	d.failNext.Store(failFirst)
	parts := make([]string, len(ids))
	for i, x := range ids {
		parts[i] = strconv.FormatUint(uint64(x), 10)
	}
	code, hdr, out := post(d.t, "http://"+d.r.Addr()+"/v1/completions", `{"model":"m","prompt":[`+strings.Join(parts, ",")+`],"max_tokens":1}`)
	if code != 200 {
		d.t.Fatalf("status %d: %s", code, out)
	}
	if d.failNext.Swap(false) {
		d.t.Fatal("no attempt failed")
	}
	dec := drvDecision{target: -1, failed: -1}
	for ph := range d.pods {
		if targetName(d.pods[ph].srv.URL) == hdr.Get("X-Prefixrouter-Target") {
			dec.target = d.perm.pod(ph)
		} else if d.pods[ph].hits.Load() > before[ph] {
			dec.failed = d.perm.pod(ph)
		}
	}
	if dec.target < 0 {
		d.t.Fatalf("X-Prefixrouter-Target %q names no pod", hdr.Get("X-Prefixrouter-Target"))
	}
	dec.predicted, _ = strconv.Atoi(hdr.Get("X-Prefixrouter-Predicted-Cached-Tokens"))
	dec.confirmed, _ = strconv.Atoi(hdr.Get("X-Prefixrouter-Confirmed-Blocks"))
	return dec
}

// virtualDriver is brain.Virtual on a manual clock, fed the same batches
// in process.
type virtualDriver struct {
	t    *testing.T
	v    *brain.Virtual
	ids  []targetid.ID
	seqs [drvPods]uint64
	perm drvPerm
}

func newVirtualDriver(t *testing.T, cfg Config) *virtualDriver {
	t.Helper()
	d := &virtualDriver{t: t, perm: identityPerm()}
	for i := range drvPods {
		d.ids = append(d.ids, targetid.ID{Endpoint: "http://pod-" + strconv.Itoa(i) + ":8000"})
	}
	var err error
	d.v, err = brain.NewVirtual(brain.VirtualConfig{Policy: cfg.Policy, Cost: cfg.Cost, Events: cfg.Events, Speculative: cfg.Speculative,
		Health: cfg.Health, Model: "m", Targets: d.ids, NumGPUBlocks: 1000, Now: manualclock.New().Now, TieSeed: 1, MaxRetries: cfg.MaxRetries})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *virtualDriver) bind(pod, physical int) { d.perm.bind(pod, physical) }

func (d *virtualDriver) publish(pod int, ids []uint32, keys []kvindex.Key, from int) {
	d.t.Helper()
	ph := d.perm[pod]
	b := storedBatch(ids, keys, from)
	d.v.Deliver(d.ids[ph], d.seqs[ph], &b)
	d.seqs[ph]++
	d.v.Evaluate()
	if n, err := d.v.ConfirmedBlocks(d.ids[ph], ids[:len(keys)*drvBlockSize]); err != nil || n != len(keys) {
		d.t.Fatalf("virtual index holds %d blocks on pod %d after the batch, want %d (%v)", n, pod, len(keys), err)
	}
}

func (d *virtualDriver) podOf(id targetid.ID) int {
	for ph, x := range d.ids {
		if x == id {
			return d.perm.pod(ph)
		}
	}
	d.t.Fatalf("virtual router chose %s, no pod of the fleet", id)
	return -1
}

func (d *virtualDriver) send(ids []uint32, failFirst bool, cached [drvPods]int) drvDecision {
	d.t.Helper()
	vr, err := d.v.Route(ids, nil, "")
	if err != nil {
		d.t.Fatal(err)
	}
	dec := drvDecision{failed: -1}
	if failFirst {
		dec.failed = d.podOf(vr.Target())
		vr.Finish(false, 0)
		if vr = vr.Retry(); vr == nil {
			d.t.Fatal("no retry after a failure before the first byte")
		}
	}
	dec.target = d.podOf(vr.Target())
	dec.predicted, dec.confirmed = vr.PredictedCached(), vr.ConfirmedBlocks()
	vr.FirstByte()
	vr.Finish(true, cached[dec.target])
	return dec
}

// storedBatch is BlockStored for keys[from:], the blocks of ids a pod
// computed after the from it already held.
func storedBatch(ids []uint32, keys []kvindex.Key, from int) events.Batch {
	ev := events.Event{Kind: events.KindBlockStored, Medium: events.MediumGPU, BlockSize: drvBlockSize,
		TokenIDs: ids[from*drvBlockSize : len(keys)*drvBlockSize]}
	for _, k := range keys[from:] {
		ev.BlockHashes = append(ev.BlockHashes, uint64(k))
	}
	if from > 0 {
		ev.ParentHash, ev.HasParentHash = uint64(keys[from-1]), true
	}
	return events.Batch{Events: []events.Event{ev}}
}

// drvFleet is what the scenario's pods hold: the block keys each stored,
// by the scenario's pod numbers. Both drivers are handed the same events
// from it.
type drvFleet struct {
	h    *kvindex.Hasher
	held [drvPods]map[kvindex.Key]bool
}

func (f *drvFleet) keys(t *testing.T, ids []uint32) []kvindex.Key {
	t.Helper()
	keys, err := f.h.Keys(nil, ids, kvindex.RequestExtras{})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// run is how many of keys from the first pod holds.
func (f *drvFleet) run(pod int, keys []kvindex.Key) int {
	n := 0
	for n < len(keys) && f.held[pod][keys[n]] {
		n++
	}
	return n
}

// cached is what each pod serves of ids from its cache, as vLLM counts
// it: its run, short of the prompt's last token.
func (f *drvFleet) cached(t *testing.T, ids []uint32) [drvPods]int {
	keys := f.keys(t, ids[:len(ids)-1])
	var c [drvPods]int
	for pod := range c {
		c[pod] = f.run(pod, keys) * drvBlockSize
	}
	return c
}

// store publishes the blocks of ids's first n blocks pod does not hold
// yet, through every driver.
func (f *drvFleet) store(t *testing.T, drivers []drvDriver, pod int, ids []uint32, n int) {
	t.Helper()
	keys := f.keys(t, ids)[:n]
	from := f.run(pod, keys)
	if from == len(keys) {
		return
	}
	for _, d := range drivers {
		d.publish(pod, ids, keys, from)
	}
	for _, k := range keys {
		f.held[pod][k] = true
	}
}

// drvPrompt is n token ids from base.
func drvPrompt(base uint32, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = base + uint32(i)
	}
	return p
}

func drvExtend(p []uint32, base uint32, n int) []uint32 {
	return append(append([]uint32(nil), p...), drvPrompt(base, n)...)
}

// TestDriversDecideAlike runs one scenario through the HTTP router and
// brain.Virtual under the precise and speculative policies and compares
// their decisions request by request.
func TestDriversDecideAlike(t *testing.T) {
	t.Parallel()
	a := drvPrompt(1000, 8*drvBlockSize+5)                        // 8 full blocks
	a2 := drvExtend(a[:8*drvBlockSize], 5000, 4*drvBlockSize+5)   // A's 8 blocks, then 4 of its own
	a3 := drvExtend(a2[:12*drvBlockSize], 6000, 3*drvBlockSize+5) // A2's 12, then 3
	q := drvPrompt(2000, 10*drvBlockSize+3)                       // 10 full blocks
	q2 := drvExtend(q[:10*drvBlockSize], 7000, 4*drvBlockSize+1)  // Q's 10, then 4
	both := func(d drvDecision) map[brain.Policy]drvDecision {
		return map[brain.Policy]drvDecision{brain.PolicyPrecise: d, brain.PolicySpeculative: d}
	}
	steps := []drvStep{
		{name: "a prompt nobody holds", prompt: a, tie: true, want: both(drvDecision{target: 0, failed: -1})},
		{name: "a follower of the held prefix", prompt: a, want: both(drvDecision{target: 0, predicted: 128, confirmed: 8, failed: -1})},
		{name: "a prompt extending the held prefix", prompt: a2, want: both(drvDecision{target: 0, predicted: 128, confirmed: 8, failed: -1})},
		{name: "pod 1 stores 3 blocks of Q", storePod: 1, storeBlocks: 3, prompt: q},
		{name: "pod 2 stores 6 blocks of Q", storePod: 2, storeBlocks: 6, prompt: q},
		{name: "a prefix two pods hold to different lengths", prompt: q, want: both(drvDecision{target: 2, predicted: 96, confirmed: 6, failed: -1})},
		{name: "the holder fails before its first byte; the retry goes to the next longest run", prompt: q2, failFirst: true,
			want: both(drvDecision{target: 1, predicted: 48, confirmed: 3, failed: 2})},
		{name: "after the retry, the pod that answered holds the longer run", prompt: q2, want: both(drvDecision{target: 1, predicted: 224, confirmed: 14, failed: -1})},
		{name: "a prompt extending the held prefix, its events withheld", prompt: a3, withhold: true,
			want: both(drvDecision{target: 0, predicted: 192, confirmed: 12, failed: -1})},
		// Precise sees the confirmed run alone; speculative adds the
		// blocks the previous request is predicted to have stored.
		{name: "a follower before the events", prompt: a3, want: map[brain.Policy]drvDecision{
			brain.PolicyPrecise:     {target: 0, predicted: 192, confirmed: 12, failed: -1},
			brain.PolicySpeculative: {target: 0, predicted: 240, confirmed: 12, failed: -1}}},
	}
	for _, p := range []brain.Policy{brain.PolicyPrecise, brain.PolicySpeculative} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			cfg.Policy = p
			cfg.DebugHeaders = true
			cfg.Events.HashSeed, cfg.Events.HasHashSeed, cfg.Events.HashAlgo, cfg.Events.BlockSize = "0", true, "sha256", drvBlockSize
			// Every request in the speculative arm: the holdback's draw
			// is the process's in one driver and seeded in the other.
			cfg.Speculative.Holdback = 0
			hd := newHTTPDriver(t, cfg)
			cfg.Health = hd.r.cfg.Health
			vd := newVirtualDriver(t, cfg)
			drivers := []drvDriver{hd, vd}
			h, err := kvindex.NewHasher(kvindex.AlgoSHA256, "0", drvBlockSize)
			if err != nil {
				t.Fatal(err)
			}
			f := &drvFleet{h: h}
			for i := range f.held {
				f.held[i] = map[kvindex.Key]bool{}
			}
			var withheld func()
			for i, s := range steps {
				if s.storeBlocks > 0 {
					f.store(t, drivers, s.storePod, s.prompt, s.storeBlocks)
					continue
				}
				cached := f.cached(t, s.prompt)
				hdec := hd.send(s.prompt, s.failFirst, cached)
				vdec := vd.send(s.prompt, s.failFirst, cached)
				if s.tie {
					// Any pod, all in the same state: it is pod 0 from now.
					hd.bind(0, hd.perm[hdec.target])
					vd.bind(0, vd.perm[vdec.target])
					hdec.target, vdec.target = 0, 0
				}
				want := s.want[p]
				switch {
				case hdec != vdec:
					t.Errorf("step %d, %s (%d tokens): the drivers disagree on %s\n  http router:    %v\n  virtual router: %v\n  scenario wants: %v",
						i, s.name, len(s.prompt), hdec.diff(vdec), hdec, vdec, want)
				case hdec != want:
					t.Errorf("step %d, %s (%d tokens): both drivers differ from the scenario on %s\n  both drivers:   %v\n  scenario wants: %v",
						i, s.name, len(s.prompt), hdec.diff(want), hdec, want)
				}
				if withheld != nil {
					withheld()
					withheld = nil
				}
				// The pod that answered stores the prompt's full blocks.
				pod, prompt := hdec.target, s.prompt
				publish := func() { f.store(t, drivers, pod, prompt, len(prompt)/drvBlockSize) }
				if s.withhold {
					withheld = publish
				} else {
					publish()
				}
				if t.Failed() {
					// Later steps assume this one's placements.
					t.FailNow()
				}
			}
		})
	}
}
