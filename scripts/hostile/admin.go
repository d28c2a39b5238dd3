package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// What the harness reads of the router: the admin listener's dry run,
// /metrics and /debug/targets, each bounded by the client's timeout.

var adminClient = &http.Client{Timeout: 10 * time.Second}

// dryRun is the part of POST /debug/route/v1/completions the harness
// reads.
type dryRun struct {
	PromptTokens int `json:"prompt_tokens"`
	BlockSize    int `json:"block_size"`
	Blocks       int `json:"blocks"`
	Candidates   []struct {
		Target          string `json:"target"`
		Rank            int    `json:"rank"`
		ConfirmedBlocks int    `json:"confirmed_blocks"`
		Cost            float64
		Load            struct {
			InFlight             int64  `json:"in_flight"`
			Prefilling           int64  `json:"prefilling"`
			QueuedUncachedTokens int64  `json:"queued_uncached_tokens"`
			Events               string `json:"events"`
		} `json:"load"`
	} `json:"candidates"`
}

func postJSON(url string, body any, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	resp, err := adminClient.Post(url, "application/json", bytes.NewReader(b))
	return decodeJSON("POST "+url, resp, err, out)
}

func getJSON(url string, out any) error {
	resp, err := adminClient.Get(url)
	return decodeJSON("GET "+url, resp, err, out)
}

// decodeJSON reads a 200 answer's JSON body (at most 8 MiB) into out.
func decodeJSON(what string, resp *http.Response, err error, out any) error {
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d: %.200s", what, resp.StatusCode, data)
	}
	return json.Unmarshal(data, out)
}

// route asks the dry run what the router would do with prompt.
func route(admin, prompt string) (dryRun, error) {
	var d dryRun
	err := postJSON(admin+"/debug/route/v1/completions", map[string]any{"model": "sim", "prompt": prompt, "max_tokens": 4}, &d)
	if err == nil && len(d.Candidates) == 0 {
		err = errors.New("dry run: no candidates")
	}
	return d, err
}

// confirmed is the first candidate's confirmed run of prompt's blocks
// (the scenario has one pod), and the prompt's blocks.
func confirmed(admin, prompt string) (int, int, error) {
	d, err := route(admin, prompt)
	if err != nil {
		return 0, 0, err
	}
	return d.Candidates[0].ConfirmedBlocks, d.Blocks, nil
}

// series is one sample of a /metrics scrape.
type series struct {
	name   string
	labels string // the text between the braces
	value  float64
}

// scrape reads the admin listener's /metrics (text format).
func scrape(admin string) ([]series, error) {
	resp, err := adminClient.Get(admin + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: HTTP %d", resp.StatusCode)
	}
	var out []series
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 64<<20))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		s := series{name: line[:sp], value: v}
		if i := strings.IndexByte(s.name, '{'); i >= 0 {
			s.labels = strings.TrimSuffix(s.name[i+1:], "}")
			s.name = s.name[:i]
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// metricSum is the sum of name's samples whose labels hold every one of
// want (`reason="source_address"`); the scrape's error is returned.
func metricSum(admin, name string, want ...string) (float64, error) {
	ss, err := scrape(admin)
	if err != nil {
		return 0, err
	}
	return sumOf(ss, name, want...), nil
}

func sumOf(ss []series, name string, want ...string) float64 {
	var n float64
next:
	for _, s := range ss {
		if s.name != name {
			continue
		}
		for _, w := range want {
			if !strings.Contains(s.labels, w) {
				continue next
			}
		}
		n += s.value
	}
	return n
}

// byLabel sums name's samples by the value of label, those that are 0
// left out, as "a=1 b=2".
func byLabel(ss []series, name, label string) string {
	sums := map[string]float64{}
	var order []string
	for _, s := range ss {
		if s.name != name || s.value == 0 {
			continue
		}
		v := labelValue(s.labels, label)
		if _, ok := sums[v]; !ok {
			order = append(order, v)
		}
		sums[v] += s.value
	}
	if len(order) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(order))
	for _, v := range order {
		parts = append(parts, fmt.Sprintf("%s=%g", v, sums[v]))
	}
	return strings.Join(parts, " ")
}

func labelValue(labels, label string) string {
	_, rest, ok := strings.Cut(labels, label+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// targetsView is the part of GET /debug/targets the harness reads.
type targetsView struct {
	Health struct {
		Targets []struct {
			Endpoint     string `json:"endpoint"`
			State        string `json:"state"`
			Reason       string `json:"reason"`
			WiringFaults []struct {
				Fault  string `json:"fault"`
				Detail string `json:"detail"`
			} `json:"wiring_faults"`
			EventStream struct {
				Verdict  string `json:"verdict"`
				Source   string `json:"source"`
				Topic    string `json:"topic"`
				LastSeq  uint64 `json:"last_seq"`
				Gaps     uint64 `json:"gaps"`
				Restarts uint64 `json:"restarts"`
			} `json:"event_stream"`
		} `json:"targets"`
	} `json:"health"`
	EventBuses []struct {
		Topics []struct {
			Topic       string            `json:"topic"`
			From        string            `json:"from"`
			Batches     uint64            `json:"batches"`
			Gaps        uint64            `json:"gaps"`
			Replayed    uint64            `json:"replayed_batches"`
			Unrecovered uint64            `json:"unrecovered_batches"`
			Restarts    uint64            `json:"restarts"`
			Refused     map[string]uint64 `json:"refused"`
		} `json:"topics"`
		Malformed uint64 `json:"malformed_messages"`
	} `json:"event_buses"`
	Peers *struct {
		Security          string `json:"security"`
		HandshakesRefused uint64 `json:"handshakes_refused"`
		Peers             []struct {
			Peer      string            `json:"peer"`
			Origin    string            `json:"origin"`
			State     string            `json:"state"`
			Reason    string            `json:"reason"`
			Connected bool              `json:"connected"`
			Fault     string            `json:"fault"`
			Messages  uint64            `json:"messages"`
			Rejected  map[string]uint64 `json:"rejected"`
			Flights   struct {
				Targets              int   `json:"targets"`
				QueuedUncachedTokens int64 `json:"queued_uncached_tokens"`
			} `json:"flights"`
		} `json:"peers"`
	} `json:"peers"`
}

func debugTargets(admin string) (targetsView, error) {
	var v targetsView
	err := getJSON(admin+"/debug/targets", &v)
	return v, err
}

// poll calls cond every interval until it holds or timeout passes, and
// reports whether it held; cond's error ends the wait.
func poll(timeout, interval time.Duration, cond func() (bool, error)) (bool, error) {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil || ok {
			return ok, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		time.Sleep(interval)
	}
}

// logTail keeps the last bytes a child wrote to its standard error, so
// that the harness can quote the router's own log lines.
type logTail struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if over := len(l.buf) - l.max; over > 0 {
		l.buf = append(l.buf[:0], l.buf[over:]...)
	}
	return len(p), nil
}

// lines returns the whole lines holding every one of want, at most n,
// the last ones.
func (l *logTail) lines(n int, want ...string) []string {
	l.mu.Lock()
	text := string(l.buf)
	l.mu.Unlock()
	var out []string
next:
	for _, line := range strings.Split(text, "\n") {
		for _, w := range want {
			if !strings.Contains(line, w) {
				continue next
			}
		}
		if line != "" {
			out = append(out, line)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out
}
