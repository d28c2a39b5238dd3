package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/peers"
)

// The second run: a router that binds a KV-event bus (--events-listen)
// and shares with peer replicas under a key (--peer-listen,
// --peer-key-file), one simulated pod whose publisher connects to the
// bus under its topic kv@HOST:PORT@MODEL, and the harness as a forger of
// KV events (this file) and as rogue peers (peers.go).

// The pod's block keys: the sim's defaults (seed "0", sha256) and the tiny
// profile's block size, given to serve so that its keys are vLLM-exact
// from the start.
const (
	simSeed      = "0"
	simBlockSize = 16
)

// floodMessages is how many messages just under the bus's bound the
// oversized section sends from a forger's address (-flood).
var floodMessages = 256

// ownerIdle is serve's --events-owner-idle default, which the run keeps.
const ownerIdle = 10 * time.Second

type eventRun struct {
	sim, router *proc
	routerLog   *logTail
	api, admin  string // base URLs
	simBase     string
	busPort     int
	topic       string
	hasher      *kvindex.Hasher
	pid         int

	peerListen string
	roguePort  int // a --peers address where the harness binds a PUB without the key
	keyedPort  int // a --peers address where the harness binds a PUB holding the key
	key        peers.Key
	// prompts numbers the run's prompts, so that each is new.
	prompts int
}

func runEvents(bin string) error {
	dir, err := os.MkdirTemp("", "hostile-events")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ports := make([]int, 8)
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return err
		}
	}
	simPort, evPort, busPort, apiPort, admPort, peerPort, roguePort, keyedPort := ports[0], ports[1], ports[2], ports[3], ports[4], ports[5], ports[6], ports[7]
	keyFile := dir + "/peer.key"
	if out, err := exec.Command(bin, "peer-keygen", "--out", keyFile).CombinedOutput(); err != nil {
		return fmt.Errorf("peer-keygen: %v: %s", err, out)
	}
	key, err := peers.LoadKey(keyFile)
	if err != nil {
		return err
	}
	h, err := kvindex.NewHasher(kvindex.AlgoSHA256, simSeed, simBlockSize)
	if err != nil {
		return err
	}
	e := &eventRun{
		busPort: busPort, hasher: h, key: key, roguePort: roguePort, keyedPort: keyedPort,
		peerListen: fmt.Sprintf("tcp://127.0.0.1:%d", peerPort),
		simBase:    fmt.Sprintf("http://127.0.0.1:%d", simPort),
		api:        fmt.Sprintf("http://127.0.0.1:%d", apiPort),
		admin:      fmt.Sprintf("http://127.0.0.1:%d", admPort),
		topic:      fmt.Sprintf("kv@127.0.0.1:%d@sim", simPort),
		routerLog:  &logTail{max: 1 << 20},
	}
	bus := fmt.Sprintf("tcp://127.0.0.1:%d", busPort)
	e.sim, err = start("sim", bin, nil, "sim", "--pods", "1", "--model", "sim", "--profile", "tiny",
		"--listen", fmt.Sprintf("127.0.0.1:%d", simPort), "--events-port", strconv.Itoa(evPort),
		"--events-connect", bus, "--log-level", "warn")
	if err != nil {
		return err
	}
	defer e.sim.stop()
	if !e.sim.out.Scan() {
		return errors.New("sim printed no endpoint")
	}
	endpoint := strings.TrimSpace(e.sim.out.Text())

	// The rogue peers bind before the router subscribes to them; they
	// publish only when their section runs.
	rogue, err := newMonitored(zmq.PUB, fmt.Sprintf("tcp://127.0.0.1:%d", roguePort), true, nil)
	if err != nil {
		return fmt.Errorf("rogue peer: %w", err)
	}
	defer rogue.close()
	keyed, err := newMonitored(zmq.PUB, fmt.Sprintf("tcp://127.0.0.1:%d", keyedPort), true, func(s *zmq.Socket) error {
		return errors.Join(s.SetCurveServer(1), s.SetCurvePublickey(key.Public), s.SetCurveSecretkey(key.Secret))
	})
	if err != nil {
		return fmt.Errorf("keyed peer: %w", err)
	}
	defer keyed.close()

	e.router, err = startLogging("router", bin, routerEnv, e.routerLog, "serve", "--endpoint", endpoint,
		"--listen", fmt.Sprintf("127.0.0.1:%d", apiPort), "--admin-listen", fmt.Sprintf("127.0.0.1:%d", admPort),
		"--events-listen", bus, "--hash-seed", simSeed, "--hash-algo", "sha256", "--block-size", strconv.Itoa(simBlockSize),
		"--peer-listen", e.peerListen, "--peer-key-file", keyFile, "--replica-id", "router-under-attack",
		"--peers", fmt.Sprintf("tcp://127.0.0.1:%d", roguePort), "--peers", fmt.Sprintf("tcp://127.0.0.1:%d", keyedPort),
		"--log-level", "warn")
	if err != nil {
		return err
	}
	defer e.router.stop()
	if err := waitReady(e.api + "/ready"); err != nil {
		return err
	}
	e.pid = e.router.cmd.Process.Pid
	fmt.Printf("KV events and peers: router pid %d collecting on %s (--events-listen) in front of %s\n", e.pid, bus, endpoint)
	fmt.Printf("  the pod publishes under %s from 127.0.0.1; the router shares on %s with --peer-key-file\n\n", e.topic, e.peerListen)

	if err := e.forgedEvents(); err != nil {
		return fmt.Errorf("forged events: %w", err)
	}
	if err := e.oversized(); err != nil {
		return fmt.Errorf("oversized events: %w", err)
	}
	if err := e.roguePeers(rogue, keyed); err != nil {
		return fmt.Errorf("rogue peers: %w", err)
	}
	return nil
}

// prompt is a new prompt of about 14 blocks, labelled.
func (e *eventRun) prompt(label string) string {
	e.prompts++
	// The number first: no two prompts share a block.
	return fmt.Sprintf("%d.%d %s: ", e.prompts, time.Now().UnixNano(), label) +
		strings.Repeat("the quick brown fox jumps over the lazy dog ", 5)
}

// tokens asks the pod's open /tokenize how it tokenizes prompt.
func (e *eventRun) tokens(prompt string) ([]uint32, error) {
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	err := postJSON(e.simBase+"/tokenize", map[string]any{"model": "sim", "prompt": prompt}, &out)
	return out.Tokens, err
}

// storedBatch is the BlockStored batch a pod publishes for prompt's full
// blocks, with their true vLLM-exact hashes, encoded as the sim encodes
// it; it returns the payload and the number of blocks.
func (e *eventRun) storedBatch(prompt string) ([]byte, int, error) {
	toks, err := e.tokens(prompt)
	if err != nil {
		return nil, 0, err
	}
	keys, err := e.hasher.Keys(nil, toks, kvindex.RequestExtras{})
	if err != nil {
		return nil, 0, err
	}
	bs := e.hasher.BlockSize()
	ev := events.Event{
		Kind: events.KindBlockStored, TokenIDs: toks[:len(keys)*bs], BlockSize: bs, Medium: events.MediumGPU,
		GroupIdx: 0, HasGroupIdx: true, SpecKind: events.SpecFullAttention, HasExtraKeys: true,
	}
	for _, k := range keys {
		ev.BlockHashes = append(ev.BlockHashes, uint64(k))
		ev.ExtraKeys = append(ev.ExtraKeys, nil)
	}
	b, err := events.Encode(&events.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: []events.Event{ev}}, events.EncodingMap)
	return b, len(keys), err
}

// publisher is a PUB socket connecting to the bus from source (an address
// of the loopback), as a pod's publisher connects.
type publisher struct {
	*monitored
	topic string
	seq   uint64
	last  time.Time // when it last sent
}

func (e *eventRun) connect(source string, sndhwm int) (*publisher, error) {
	addr := fmt.Sprintf("tcp://%s:0;127.0.0.1:%d", source, e.busPort)
	m, err := newMonitored(zmq.PUB, addr, false, func(s *zmq.Socket) error {
		if sndhwm > 0 {
			return s.SetSndhwm(sndhwm)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	p := &publisher{monitored: m, topic: e.topic}
	// A PUB socket drops what it sends before the bus's subscription
	// reached it: wait for the handshake, then a moment.
	if _, ok := m.wait(zmq.EVENT_HANDSHAKE_SUCCEEDED, 5*time.Second); !ok {
		m.close()
		return nil, fmt.Errorf("no handshake with the bus from %s within 5 s", source)
	}
	time.Sleep(200 * time.Millisecond)
	return p, nil
}

func (p *publisher) send(payload []byte) error {
	_, err := p.sock.SendMessage(p.topic, events.SeqFrame(p.seq), payload)
	p.seq++
	p.last = time.Now()
	return err
}

// forgeOutcome is what one forgery did.
type forgeOutcome struct {
	blocks, sent int
	confirmed    int            // the forged prompt's confirmed blocks afterwards
	refused      map[string]int // refusals counted meanwhile, by reason
	last         time.Time      // the forger's last batch
}

func (o forgeOutcome) String() string {
	return fmt.Sprintf("%d batch(es) sent; confirmed blocks of the forged prompt: %d of %d; refusals counted: %s",
		o.sent, o.confirmed, o.blocks, countsText(o.refused))
}

// countsText is refusal counts as "reason +n, ...", sorted.
func countsText(c map[string]int) string {
	if len(c) == 0 {
		return "none"
	}
	var r []string
	for _, k := range slices.Sorted(maps.Keys(c)) {
		r = append(r, fmt.Sprintf("%s +%d", k, c[k]))
	}
	return strings.Join(r, ", ")
}

// forge connects from source and publishes, under the pod's topic, the
// BlockStored batch of a prompt nobody sent, once a second up to 3 times,
// until the router either confirms a block of it or counts a refusal. It
// returns what the dry run and /metrics say afterwards.
func (e *eventRun) forge(source, prompt string) (forgeOutcome, error) {
	var o forgeOutcome
	payload, blocks, err := e.storedBatch(prompt)
	if err != nil {
		return o, err
	}
	o.blocks = blocks
	before, err := e.refusals()
	if err != nil {
		return o, err
	}
	p, err := e.connect(source, 0)
	if err != nil {
		return o, err
	}
	defer p.close()
	for range 3 {
		if err := p.send(payload); err != nil {
			return o, err
		}
		o.sent++
		done, err := poll(time.Second, 50*time.Millisecond, func() (bool, error) {
			n, _, err := confirmed(e.admin, prompt)
			if err != nil || n > 0 {
				return n > 0, err
			}
			after, err := e.refusals()
			return err == nil && after.total() > before.total(), err
		})
		if err != nil {
			return o, err
		}
		if done {
			break
		}
	}
	o.last = p.last
	// A moment for a batch the router accepted to be applied.
	time.Sleep(300 * time.Millisecond)
	if o.confirmed, _, err = confirmed(e.admin, prompt); err != nil {
		return o, err
	}
	after, err := e.refusals()
	if err != nil {
		return o, err
	}
	o.refused = after.minus(before)
	return o, nil
}

// refusalCounts are prefixrouter_kv_refused_total's samples summed by
// reason.
type refusalCounts map[string]int

func (r refusalCounts) total() int {
	n := 0
	for _, v := range r {
		n += v
	}
	return n
}

func (r refusalCounts) minus(o refusalCounts) map[string]int {
	out := map[string]int{}
	for k, v := range r {
		if d := v - o[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

func (e *eventRun) refusals() (refusalCounts, error) {
	ss, err := scrape(e.admin)
	if err != nil {
		return nil, err
	}
	out := refusalCounts{}
	for _, s := range ss {
		if s.name == "prefixrouter_kv_refused_total" {
			out[labelValue(s.labels, "reason")] += int(s.value)
		}
	}
	return out, nil
}

// complete sends prompt through the router as a client would and returns
// the answer's status.
func (e *eventRun) complete(prompt string) (int, error) {
	b, err := json.Marshal(map[string]any{"model": "sim", "prompt": prompt, "max_tokens": 4})
	if err != nil {
		return 0, err
	}
	resp, err := adminClient.Post(e.api+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, nil
}

// served sends prompt through the router and waits up to 5 s for the
// pod's blocks of it to show confirmed; it returns them and the prompt's
// blocks.
func (e *eventRun) served(prompt string) (int, int, error) {
	status, err := e.complete(prompt)
	if err != nil {
		return 0, 0, err
	}
	if status != http.StatusOK {
		return 0, 0, fmt.Errorf("a normal completion through the router: HTTP %d", status)
	}
	var n, blocks int
	_, err = poll(5*time.Second, 100*time.Millisecond, func() (bool, error) {
		var err error
		n, blocks, err = confirmed(e.admin, prompt)
		return err == nil && n > 0, err
	})
	return n, blocks, err
}

// forgedEvents: BlockStored batches with true block hashes for prompts
// nobody sent, under the pod's topic, from an address that is not the
// pod's (127.0.0.2), and from the pod's own address over a connection of
// its own.
func (e *eventRun) forgedEvents() error {
	fmt.Println("forged KV events (BlockStored with the true vLLM-exact hashes of a prompt nobody sent, under the pod's topic):")

	// Before the pod published anything: nobody owns the topic yet.
	p1 := e.prompt("forged from 127.0.0.2")
	o, err := e.forge("127.0.0.2", p1)
	if err != nil {
		return err
	}
	fmt.Printf("  from 127.0.0.2, before the pod's first batch: %s (goal: 0 confirmed)\n", o)

	// Control: the same forgery from the pod's own address, while no
	// connection owns the topic yet.
	p2 := e.prompt("forged from 127.0.0.1 first")
	o2, err := e.forge("127.0.0.1", p2)
	if err != nil {
		return err
	}
	fmt.Printf("  control, from 127.0.0.1 (the address the topic names) before the pod's first batch: %s\n", o2)
	if o2.confirmed > 0 {
		fmt.Println("    -> accepted: the first connection to publish under a topic from its host's address owns it")
	}

	// The pod's first batches, while the forger's connection owns the
	// topic (closed now, silent since its last batch).
	pc := e.prompt("served while the forger owns the topic")
	before, err := e.refusals()
	if err != nil {
		return err
	}
	if status, err := e.complete(pc); err != nil || status != http.StatusOK {
		return fmt.Errorf("completion: HTTP %d, %v", status, err)
	}
	var nc, bc int
	if _, err := poll(3*time.Second, 100*time.Millisecond, func() (bool, error) {
		var err error
		nc, bc, err = confirmed(e.admin, pc)
		if err != nil || nc > 0 {
			return nc > 0, err
		}
		after, err := e.refusals()
		return err == nil && after.total() > before.total(), err
	}); err != nil {
		return err
	}
	after, err := e.refusals()
	if err != nil {
		return err
	}
	fmt.Printf("  the pod's own batch for a prompt served within %s of the forger's last batch: %d of %d blocks confirmed; refusals counted: %s\n",
		time.Since(o2.last).Round(100*time.Millisecond), nc, bc, countsText(after.minus(before)))

	// Once the forger's connection has been silent for --events-owner-idle
	// the pod's connection takes the topic over.
	if wait := time.Until(o2.last.Add(ownerIdle + 500*time.Millisecond)); wait > 0 {
		fmt.Printf("  waiting %s for --events-owner-idle (%s) to pass since the forger's last batch\n", wait.Round(100*time.Millisecond), ownerIdle)
		time.Sleep(wait)
	}
	pd := e.prompt("served after the owner idled")
	nd, bd, err := e.served(pd)
	if err != nil {
		return err
	}
	n2, _, err := confirmed(e.admin, p2)
	if err != nil {
		return err
	}
	nc, _, err = confirmed(e.admin, pc)
	if err != nil {
		return err
	}
	fmt.Printf("  then a prompt served: %d of %d blocks confirmed (the pod's connection owns the topic); the control's forged prompt: %d of %d still confirmed; the earlier refused prompt: %d of %d\n",
		nd, bd, n2, o2.blocks, nc, bc)
	if v, err := debugTargets(e.admin); err == nil && len(v.EventBuses) > 0 {
		for _, t := range v.EventBuses[0].Topics {
			fmt.Printf("  bus view: topic %s from %s, %d batches, %d gaps, %d replayed, %d unrecovered, %d restarts\n",
				t.Topic, t.From, t.Batches, t.Gaps, t.Replayed, t.Unrecovered, t.Restarts)
		}
	}

	// While the pod owns the topic and publishes.
	if _, _, err := e.served(e.prompt("served")); err != nil {
		return err
	}
	p3 := e.prompt("forged from 127.0.0.2 while the pod publishes")
	o3, err := e.forge("127.0.0.2", p3)
	if err != nil {
		return err
	}
	fmt.Printf("  from 127.0.0.2, while the pod owns the topic: %s (goal: 0 confirmed)\n", o3)
	if _, _, err := e.served(e.prompt("served")); err != nil {
		return err
	}
	p4 := e.prompt("forged from 127.0.0.1 while the pod publishes")
	o4, err := e.forge("127.0.0.1", p4)
	if err != nil {
		return err
	}
	fmt.Printf("  from 127.0.0.1 over a second connection, while the pod owns the topic: %s (goal: 0 confirmed)\n", o4)
	pe := e.prompt("served after the forgeries")
	ne, be, err := e.served(pe)
	if err != nil {
		return err
	}
	fmt.Printf("  a prompt served after them: %d of %d blocks confirmed\n", ne, be)
	// The fault's detail is as of the plane's last judgement
	// (--events-eval-interval, 500 ms).
	time.Sleep(time.Second)

	ss, err := scrape(e.admin)
	if err != nil {
		return err
	}
	fmt.Printf("  prefixrouter_kv_refused_total by reason: %s; prefixrouter_kv_bus_refused_total: %s\n",
		byLabel(ss, "prefixrouter_kv_refused_total", "reason"), byLabel(ss, "prefixrouter_kv_bus_refused_total", "reason"))
	fmt.Printf("  prefixrouter_target_wiring_fault{fault=\"events_refused\"}: %g\n", sumOf(ss, "prefixrouter_target_wiring_fault", `fault="events_refused"`))
	v, err := debugTargets(e.admin)
	if err != nil {
		return err
	}
	for _, t := range v.Health.Targets {
		shown := false
		for _, f := range t.WiringFaults {
			if f.Fault == "events_refused" {
				fmt.Printf("  /debug/targets: state %s (%s), fault events_refused: %s\n", t.State, t.Reason, f.Detail)
				shown = true
			}
		}
		if !shown {
			fmt.Printf("  /debug/targets: state %s (%s), NO events_refused fault (faults %+v)\n", t.State, t.Reason, t.WiringFaults)
		}
	}
	for _, line := range e.routerLog.lines(1, "event stream wiring fault", "events_refused") {
		fmt.Printf("  router log: %s\n", line)
	}
	for _, line := range e.routerLog.lines(3, "KV events refused") {
		fmt.Printf("  router log: %s\n", line)
	}
	fmt.Println()
	return nil
}

// oversized sends 8 messages of 10 MiB under the pod's topic from the
// pod's address, then a flood of messages just under the bus's 4 MiB
// bound from another address, and measures the router's memory.
func (e *eventRun) oversized() error {
	const n, size = 8, 10 << 20
	fmt.Printf("oversized KV events: %d messages of %d MiB under the pod's topic from 127.0.0.1 (--events-max-message-bytes 4 MiB):\n", n, size>>20)
	ss, err := scrape(e.admin)
	if err != nil {
		return err
	}
	conns0 := sumOf(ss, "prefixrouter_kv_bus_connections_total")
	refused0 := sumOf(ss, "prefixrouter_kv_refused_total")
	time.Sleep(500 * time.Millisecond)
	idle := rss(e.pid)
	stop := make(chan struct{})
	peak := peakRSS(e.pid, stop)
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i)
	}
	p, err := e.connect("127.0.0.1", 0)
	if err != nil {
		close(stop)
		<-peak
		return err
	}
	sent, dropped := 0, 0
	for i := range n {
		if i > 0 {
			// libzmq reconnects on its own after the router dropped the
			// connection; a PUB socket drops what it sends before then.
			if _, ok := p.wait(zmq.EVENT_HANDSHAKE_SUCCEEDED, 5*time.Second); !ok {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err := p.send(payload); err != nil {
			p.close()
			close(stop)
			<-peak
			return err
		}
		sent++
		if _, ok := p.wait(zmq.EVENT_DISCONNECTED, 5*time.Second); ok {
			dropped++
		}
	}
	p.close()
	time.Sleep(time.Second)
	close(stop)
	pk := <-peak
	ss, err = scrape(e.admin)
	if err != nil {
		return err
	}
	fmt.Printf("  sent %d, connections the router dropped after one: %d; bus connections +%g; KV refusals +%g (the bus never saw them)\n",
		sent, dropped, sumOf(ss, "prefixrouter_kv_bus_connections_total")-conns0, sumOf(ss, "prefixrouter_kv_refused_total")-refused0)
	fmt.Printf("  router RSS before %.1f MiB, peak during and 1 s after %.1f MiB: %+.1f MiB (goal: at most +128 MiB)\n", mib(idle), mib(pk), mib(pk-idle))
	pf := e.prompt("served after the oversized messages")
	nf, bf, err := e.served(pf)
	if err != nil {
		return err
	}
	fmt.Printf("  the pod's events after them: a prompt served, %d of %d blocks confirmed (goal: all)\n", nf, bf)

	// Messages the bound admits (4 MiB less 64 KiB) from an address that
	// is not the pod's: each is received whole and then refused.
	const near = 4<<20 - 64<<10
	flood := floodMessages
	fmt.Printf("  then %d messages of %.2f MiB (under the bound) from 127.0.0.2 under the pod's topic, as fast as a PUB sends:\n", flood, float64(near)/(1<<20))
	before, err := e.refusals()
	if err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	idle = rss(e.pid)
	stop = make(chan struct{})
	peak = peakRSS(e.pid, stop)
	q, err := e.connect("127.0.0.2", flood)
	if err != nil {
		close(stop)
		<-peak
		return err
	}
	big := payload[:near]
	t0 := time.Now()
	for range flood {
		if err := q.send(big); err != nil {
			break
		}
	}
	var got int
	_, err = poll(10*time.Second, 100*time.Millisecond, func() (bool, error) {
		after, err := e.refusals()
		if err != nil {
			return false, err
		}
		got = after["source_address"] - before["source_address"]
		return got >= flood, nil
	})
	took := time.Since(t0)
	q.close()
	time.Sleep(time.Second)
	close(stop)
	pk = <-peak
	if err != nil {
		return err
	}
	fmt.Printf("  refused (source_address): %d of %d within %s; router RSS before %.1f MiB, peak %.1f MiB: %+.1f MiB\n",
		got, flood, took.Round(100*time.Millisecond), mib(idle), mib(pk), mib(pk-idle))
	pg := e.prompt("served after the flood")
	ng, bg, err := e.served(pg)
	if err != nil {
		return err
	}
	fmt.Printf("  a prompt served after the flood: %d of %d blocks confirmed\n\n", ng, bg)
	return nil
}
