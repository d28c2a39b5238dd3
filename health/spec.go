package health

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/prefixrouter/prefixrouter/internal/hostname"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// Role says which phase of a disaggregated fleet a target serves.
type Role string

// Roles. RoleBoth is the default: the pod serves prefill and decode.
const (
	RoleBoth    Role = "both"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// DefaultEventsPort is the port vLLM's KV-event publisher binds by default
// (tcp://*:5557).
const DefaultEventsPort = 5557

// MaxDataParallel bounds the dp option; larger values are rejected as typos.
const MaxDataParallel = 256

// maxSpecLen bounds the length of one endpoint spec.
const maxSpecLen = 4096

// Spec is one parsed endpoint spec: an HTTP endpoint serving one vLLM
// server, which may run several data-parallel ranks.
//
// The text form is a URL whose query carries options:
//
//	http://10.0.0.7:8000?events=tcp://10.0.0.7:5557&replay=tcp://10.0.0.7:5558&dp=2&model=NAME&role=prefill
//
//	events  ZMQ address of rank 0's KV-event publisher (default tcp://HOST:5557;
//	        with serve --events-listen, a spec without events= is expected to
//	        publish on the bus instead)
//	topic   the topic the pod publishes on the bus (default: matched by the
//	        topic's HOST:PORT, kv@HOST:PORT@MODEL)
//	replay  ZMQ address of rank 0's replay socket (default: none)
//	dp      number of data-parallel ranks (default 1); rank r publishes on the
//	        events port + r and replays on the replay port + r
//	model   served model name; repeatable (LoRA adapters); default: learned
//	        from GET /v1/models
//	role    prefill, decode or both (default both)
type Spec struct {
	// Endpoint is the normalized base URL without query (scheme and host in
	// lower case, no trailing slash). It is the Endpoint of every targetid.ID
	// the spec yields.
	Endpoint string
	// Events is rank 0's KV-event publisher address.
	Events string
	// EventsImplied is set when the spec gave no events=: Events is vLLM's
	// default address, and a router collecting events on a bus
	// (--events-listen) expects the pod there instead.
	EventsImplied bool
	// Topic is the topic the pod's publishers send on a bus, when it is
	// not found from the topic's HOST:PORT; empty: matched that way.
	Topic string
	// Replay is rank 0's replay address, empty when the pod has none.
	Replay string
	// DP is the number of data-parallel ranks, at least 1.
	DP int
	// Models are the configured model names; empty means learn them.
	Models []string
	// Role is the disaggregation role.
	Role Role
}

// TargetSpec is one event source and routing destination: one rank of a Spec.
type TargetSpec struct {
	ID     targetid.ID
	Events string // this rank's publisher address
	// EventsImplied: Events was not given (Spec.EventsImplied).
	EventsImplied bool
	// Topic is the pod's topic on a bus (Spec.Topic), the same for
	// every rank.
	Topic  string
	Replay string // this rank's replay address, empty when none
	DP     int    // ranks of the endpoint, for the X-data-parallel-rank header
	Models []string
	Role   Role
}

// ParseSpec parses one endpoint spec. Errors name the offending part; the
// caller names the spec (--endpoint "…": or the endpoints file's item).
func ParseSpec(s string) (Spec, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Spec{}, errors.New("empty endpoint spec")
	}
	if len(s) > maxSpecLen {
		return Spec{}, fmt.Errorf("endpoint spec longer than %d bytes", maxSpecLen)
	}
	if !strings.Contains(s, "://") {
		return Spec{}, errors.New("missing scheme (want http://HOST:PORT)")
	}
	u, err := url.Parse(s)
	if err != nil {
		return Spec{}, err
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		return Spec{}, fmt.Errorf("scheme %q not supported (want http or https)", u.Scheme)
	}
	if u.Opaque != "" {
		return Spec{}, errors.New("malformed URL")
	}
	if u.User != nil {
		return Spec{}, errors.New("credentials in the URL are not supported")
	}
	if u.Fragment != "" || strings.Contains(s, "#") {
		return Spec{}, errors.New("fragments are not allowed")
	}
	host := u.Hostname()
	if host == "" {
		return Spec{}, errors.New("missing host")
	}
	if !hostname.Valid(host) {
		return Spec{}, fmt.Errorf("invalid host %q", host)
	}
	port := u.Port()
	if port != "" {
		if _, err := parsePort(port); err != nil {
			return Spec{}, err
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return Spec{}, errors.New("empty port")
	}
	path := strings.TrimRight(u.EscapedPath(), "/")
	if strings.HasSuffix(path, "/v1") {
		return Spec{}, errors.New("give the server's root URL, not the OpenAI /v1 base")
	}
	hostport := strings.ToLower(host)
	if port != "" {
		hostport = net.JoinHostPort(hostport, port)
	} else if strings.Contains(hostport, ":") {
		hostport = "[" + hostport + "]"
	}
	spec := Spec{
		Endpoint: scheme + "://" + hostport + path,
		DP:       1,
		Role:     RoleBoth,
	}

	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return Spec{}, fmt.Errorf("query: %w", err)
	}
	err = eachOption(q, func(key string, vals []string) error {
		if shared, err := parseSharedOption(key, vals, &spec.DP, &spec.Models, &spec.Role); shared {
			return err
		}
		var err error
		switch key {
		case "events":
			if spec.Events, err = parseZMQAddr(vals[0]); err != nil {
				return fmt.Errorf("events: %w", err)
			}
		case "replay":
			if spec.Replay, err = parseZMQAddr(vals[0]); err != nil {
				return fmt.Errorf("replay: %w", err)
			}
		case "topic":
			if spec.Topic, err = checkTopic(vals[0]); err != nil {
				return fmt.Errorf("topic: %w", err)
			}
		default:
			return fmt.Errorf("unknown option %q (known: events, replay, topic, dp, model, role)", key)
		}
		return nil
	})
	if err != nil {
		return Spec{}, err
	}
	if spec.Events == "" {
		spec.EventsImplied = true
		spec.Events = "tcp://" + net.JoinHostPort(strings.ToLower(host), strconv.Itoa(DefaultEventsPort))
	}
	if spec.DP > 1 {
		for name, addr := range map[string]string{"events": spec.Events, "replay": spec.Replay} {
			if addr == "" {
				continue
			}
			if _, err := rankAddr(addr, spec.DP-1); err != nil {
				return Spec{}, fmt.Errorf("%s with dp=%d: %w", name, spec.DP, err)
			}
		}
	}
	return spec, nil
}

// String renders the spec in its canonical text form; ParseSpec of the
// result yields an equal Spec.
func (s Spec) String() string {
	q := url.Values{}
	if !s.EventsImplied {
		q.Set("events", s.Events)
	}
	if s.Replay != "" {
		q.Set("replay", s.Replay)
	}
	if s.Topic != "" {
		q.Set("topic", s.Topic)
	}
	if s.DP > 1 {
		q.Set("dp", strconv.Itoa(s.DP))
	}
	for _, m := range s.Models {
		q.Add("model", m)
	}
	if s.Role != "" && s.Role != RoleBoth {
		q.Set("role", string(s.Role))
	}
	if len(q) == 0 {
		return s.Endpoint
	}
	return s.Endpoint + "?" + q.Encode()
}

// Equal reports whether two specs describe the same targets with the same
// options.
func (s Spec) Equal(o Spec) bool {
	return s.Endpoint == o.Endpoint && s.Events == o.Events && s.EventsImplied == o.EventsImplied &&
		s.Replay == o.Replay && s.Topic == o.Topic &&
		s.DP == o.DP && s.Role == o.Role && slices.Equal(s.Models, o.Models)
}

// Targets expands the spec into one TargetSpec per data-parallel rank.
// Addresses were validated by ParseSpec; a Spec built by hand with an address
// that cannot be offset yields an error.
func (s Spec) Targets() ([]TargetSpec, error) {
	dp := max(s.DP, 1)
	out := make([]TargetSpec, 0, dp)
	for r := range dp {
		ev, err := rankAddr(s.Events, r)
		if err != nil {
			return nil, fmt.Errorf("endpoint %s rank %d events: %w", s.Endpoint, r, err)
		}
		var rp string
		if s.Replay != "" {
			if rp, err = rankAddr(s.Replay, r); err != nil {
				return nil, fmt.Errorf("endpoint %s rank %d replay: %w", s.Endpoint, r, err)
			}
		}
		role := s.Role
		if role == "" {
			role = RoleBoth
		}
		out = append(out, TargetSpec{
			ID:            targetid.ID{Endpoint: s.Endpoint, Rank: r},
			Events:        ev,
			EventsImplied: s.EventsImplied,
			Topic:         s.Topic,
			Replay:        rp,
			DP:            dp,
			Models:        slices.Clone(s.Models),
			Role:          role,
		})
	}
	return out, nil
}

// eachOption calls fn for every option of a spec's query, in key order, after
// rejecting repeated options (only model may repeat).
func eachOption(q url.Values, fn func(key string, vals []string) error) error {
	for _, key := range slices.Sorted(maps.Keys(q)) {
		vals := q[key]
		if key != "model" && len(vals) > 1 {
			return fmt.Errorf("option %q given %d times", key, len(vals))
		}
		if err := fn(key, vals); err != nil {
			return err
		}
	}
	return nil
}

// parseSharedOption applies the options endpoint specs and DNS specs share
// (dp, model, role), so both syntaxes accept and reject the same values. It
// reports whether key was one of them; the error does not name the spec.
func parseSharedOption(key string, vals []string, dp *int, models *[]string, role *Role) (bool, error) {
	switch key {
	case "dp":
		n, err := strconv.Atoi(vals[0])
		if err != nil || n < 1 || n > MaxDataParallel {
			return true, fmt.Errorf("dp=%q: want an integer in 1..%d", vals[0], MaxDataParallel)
		}
		*dp = n
	case "model":
		for _, m := range vals {
			if err := checkModelName(m); err != nil {
				return true, fmt.Errorf("model: %w", err)
			}
			if !slices.Contains(*models, m) {
				*models = append(*models, m)
			}
		}
	case "role":
		switch r := Role(strings.ToLower(vals[0])); r {
		case RoleBoth, RolePrefill, RoleDecode:
			*role = r
		default:
			return true, fmt.Errorf("role=%q: want prefill, decode or both", vals[0])
		}
	default:
		return false, nil
	}
	return true, nil
}

// parseZMQAddr validates a ZMQ endpoint: tcp://HOST:PORT or ipc://PATH.
func parseZMQAddr(v string) (string, error) {
	v = strings.TrimSpace(v)
	switch {
	case strings.HasPrefix(v, "tcp://"):
		hp := strings.TrimPrefix(v, "tcp://")
		host, port, err := net.SplitHostPort(hp)
		if err != nil {
			return "", fmt.Errorf("%q: want tcp://HOST:PORT: %w", v, err)
		}
		if host == "" || host == "*" {
			return "", fmt.Errorf("%q: a subscriber needs a concrete host", v)
		}
		if !hostname.Valid(host) {
			return "", fmt.Errorf("%q: invalid host", v)
		}
		if _, err := parsePort(port); err != nil {
			return "", fmt.Errorf("%q: %w", v, err)
		}
		return "tcp://" + net.JoinHostPort(strings.ToLower(host), port), nil
	case strings.HasPrefix(v, "ipc://"):
		if len(v) == len("ipc://") || strings.ContainsAny(v, "\x00\r\n") {
			return "", fmt.Errorf("%q: want ipc://PATH", v)
		}
		return v, nil
	default:
		return "", fmt.Errorf("%q: want tcp://HOST:PORT or ipc://PATH", v)
	}
}

// rankAddr offsets a tcp address's port by rank; rank 0 returns addr.
func rankAddr(addr string, rank int) (string, error) {
	if rank == 0 {
		return addr, nil
	}
	if !strings.HasPrefix(addr, "tcp://") {
		return "", fmt.Errorf("%q: data-parallel ranks need a tcp address (port + rank)", addr)
	}
	host, port, err := net.SplitHostPort(strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		return "", fmt.Errorf("%q: %w", addr, err)
	}
	p, err := parsePort(port)
	if err != nil {
		return "", fmt.Errorf("%q: %w", addr, err)
	}
	if p+rank > 65535 {
		return "", fmt.Errorf("%q: port %d + rank %d exceeds 65535", addr, p, rank)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+rank)), nil
}

func parsePort(p string) (int, error) {
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != p {
		return 0, fmt.Errorf("port %q: want 1..65535", p)
	}
	return n, nil
}

// checkTopic accepts a topic frame a pod may publish: printable UTF-8, at
// most 1,024 bytes (the bus reads longer ones as matching no target).
func checkTopic(t string) (string, error) {
	switch {
	case t == "":
		return "", errors.New("empty topic")
	case len(t) > 1024:
		return "", errors.New("topic longer than 1024 bytes")
	case !utf8.ValidString(t) || strings.ContainsFunc(t, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return "", fmt.Errorf("topic %q is not printable UTF-8", t)
	}
	return t, nil
}

func checkModelName(m string) error {
	if strings.TrimSpace(m) == "" {
		return errors.New("empty model name")
	}
	if len(m) > 512 {
		return errors.New("model name longer than 512 bytes")
	}
	if !utf8.ValidString(m) {
		return errors.New("model name is not valid UTF-8")
	}
	for _, r := range m {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("model name %q contains a control character", m)
		}
	}
	return nil
}
