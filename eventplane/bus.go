package eventplane

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/kvtransport"
)

// A bus (Config.EventsListen) is a bound SUB socket that every pod's
// publisher connects to; the topic frame says which pod a batch is from.
// The plane owns the map from topics to targets: a target's endpoint
// topic= first, else the topic's HOST[:PORT] (kv@HOST:PORT@MODEL) against
// the endpoints' own. The rank is the socket's: vLLM's rank r connects to
// the bus port + r.

// routeTopic maps a topic arriving on a bus's rank socket to its target's
// stream; the bus calls it on a topic's first batch (and again after a
// target changed), without its own lock held.
func (p *Plane) routeTopic(rank int, topic string) (kvtransport.BusRoute, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ingestor == nil || p.ctx == nil {
		return kvtransport.BusRoute{}, kvtransport.ErrRouteDeferred
	}
	s, host, err := p.topicTargetLocked(rank, topic)
	if err != nil {
		return kvtransport.BusRoute{}, err
	}
	id, in, l := s.id, p.ingestor, s.live
	replay := s.src.Replay
	if replay == "" && p.cfg.ReplayPort != 0 && p.cfg.ReplayPort+rank <= 65535 {
		replay = "tcp://" + net.JoinHostPort(host, strconv.Itoa(p.cfg.ReplayPort+rank))
	}
	// The pod publishes from its endpoint's host; a topic naming another
	// host (topic=) is accepted from there too.
	sources := []string{s.host}
	if tp, err := kvindex.ParseTopic(topic); err == nil && tp.Host != s.host {
		sources = append(sources, tp.Host)
	}
	return kvtransport.BusRoute{
		Target:    id,
		Sources:   sources,
		Replay:    replay,
		Handle:    func(_ uint64, b *events.Batch, _ bool) { in.Apply(id, b) },
		Restarted: func() { in.Reset(id); l.processRestarted() },
	}, nil
}

// topicTargetLocked finds the bus-fed stream topic names on rank's socket,
// and the host its replay socket is on. The error says why none matches:
// the bus lists it beside the topic.
func (p *Plane) topicTargetLocked(rank int, topic string) (*stream, string, error) {
	var named []*stream
	for _, s := range p.streams {
		if topic != "" && s.src.Topic == topic {
			named = append(named, s)
		}
	}
	if len(named) > 0 {
		return pickRank(named, rank, "topic= in its endpoint")
	}
	tp, err := kvindex.ParseTopic(topic)
	if err != nil {
		return nil, "", fmt.Errorf("no endpoint's topic= is %q, and it does not name a pod: %w", topic, err)
	}
	var match []*stream
	endpoints := map[string]bool{}
	for _, s := range p.streams {
		if s.src.Topic != "" || s.host != tp.Host || (tp.Port != 0 && s.port != tp.Port) {
			continue
		}
		match = append(match, s)
		endpoints[s.id.Endpoint] = true
	}
	switch len(endpoints) {
	case 0:
		return nil, "", fmt.Errorf("no target's endpoint is %s", tp.HostPort())
	case 1:
		s, _, err := pickRank(match, rank, "its endpoint")
		return s, tp.Host, err
	}
	names := make([]string, 0, len(endpoints))
	for e := range endpoints {
		names = append(names, e)
	}
	slices.Sort(names)
	return nil, "", fmt.Errorf("%s matches %d endpoints (%s): name the port in the topic, or set topic= in the endpoints", tp.HostPort(), len(names), strings.Join(names, ", "))
}

// pickRank picks the stream of rank among one endpoint's matching streams,
// refusing one with a subscriber of its own.
func pickRank(match []*stream, rank int, how string) (*stream, string, error) {
	for _, s := range match {
		if s.id.Rank != rank {
			continue
		}
		if !s.onBus {
			return nil, "", fmt.Errorf("matches %s by %s, but that endpoint names events= and is followed there", s.id.String(), how)
		}
		return s, s.host, nil
	}
	return nil, "", fmt.Errorf("matches %s by %s, which has no rank %d (rank r's publishers connect to the bus port + r)", match[0].id.Endpoint, how, rank)
}

// endpointHostPort is the host (lower case, no brackets) and port of a
// target's endpoint URL, the port the scheme's default when it names none.
func endpointHostPort(endpoint string) (string, int) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", 0
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		port = 80
		if u.Scheme == "https" {
			port = 443
		}
	}
	return strings.ToLower(u.Hostname()), port
}

// busStatus is a bus-fed stream's status, the bus it arrives on and
// its topic; ok is false while no batch of it arrived on any bus.
func (p *Plane) busStatus(t *stream) (status kvindex.SubscriberStatus, bus, topic string, ok bool) {
	for _, b := range p.buses {
		if st, tp, found := b.Status(t.id); found {
			return st, b.Listen(), tp, true
		}
	}
	return kvindex.SubscriberStatus{}, "", "", false
}

// expectedTopic is the topic a bus-fed target should publish.
func (t *stream) expectedTopic() string {
	if t.src.Topic != "" {
		return t.src.Topic
	}
	return "kv@" + net.JoinHostPort(t.host, strconv.Itoa(t.port)) + "@MODEL"
}

// busSilentDetail says what to check when a serving bus-fed pod answered
// requests that filled blocks and none of its batches reached a bus.
func (p *Plane) busSilentDetail(t *stream, dueAgo string) string {
	addrs := make([]string, 0, len(p.buses))
	for _, b := range p.buses {
		addrs = append(addrs, b.Listen())
	}
	return fmt.Sprintf(`requests answered %s ago filled new KV blocks, but no batch of this pod's reached the bus (%s): is vLLM started with --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://ROUTER:PORT","topic":%q}', ROUTER:PORT the router's --events-listen (rank r connects to PORT + r)? Publishers whose topic matches no target are listed under event_buses in /debug/targets. If the pod binds its own socket, set events= in its --endpoint`,
		dueAgo, strings.Join(addrs, ", "), t.expectedTopic())
}
