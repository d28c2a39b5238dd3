package health

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/prefixrouter/prefixrouter/internal/hostname"
)

// DNSSpec is one --discover-dns entry: a name resolved on an interval, each
// address becoming one endpoint on Port. The text form is
//
//	NAME:PORT[?events-port=5557&replay-port=5558&dp=2&model=NAME&role=decode&scheme=http]
//
// Event and replay ports follow the vLLM convention (events on 5557, no
// replay) unless overridden; dp, model and role mean what they mean in an
// endpoint spec.
type DNSSpec struct {
	Name       string
	Port       int
	Scheme     string
	EventsPort int
	// EventsImplied is set when events-port was not given (see
	// Spec.EventsImplied).
	EventsImplied bool
	ReplayPort    int // 0: no replay socket
	DP            int
	Models        []string
	Role          Role
}

// ParseDNSSpec parses one --discover-dns entry.
func ParseDNSSpec(s string) (DNSSpec, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return DNSSpec{}, fmt.Errorf("empty --discover-dns entry")
	}
	if len(s) > maxSpecLen {
		return DNSSpec{}, fmt.Errorf("--discover-dns entry longer than %d bytes", maxSpecLen)
	}
	hp, rawq, _ := strings.Cut(s, "?")
	name, port, err := net.SplitHostPort(hp)
	if err != nil {
		return DNSSpec{}, fmt.Errorf("--discover-dns %q: want NAME:PORT: %w", s, err)
	}
	if name == "" || !hostname.Valid(name) {
		return DNSSpec{}, fmt.Errorf("--discover-dns %q: invalid name %q", s, name)
	}
	d := DNSSpec{Name: strings.ToLower(name), Scheme: "http", EventsPort: DefaultEventsPort, EventsImplied: true, DP: 1, Role: RoleBoth}
	if d.Port, err = parsePort(port); err != nil {
		return DNSSpec{}, fmt.Errorf("--discover-dns %q: %w", s, err)
	}
	q, err := url.ParseQuery(rawq)
	if err != nil {
		return DNSSpec{}, fmt.Errorf("--discover-dns %q: options: %w", s, err)
	}
	err = eachOption(q, func(key string, vals []string) error {
		if shared, err := parseSharedOption(key, vals, &d.DP, &d.Models, &d.Role); shared {
			return err
		}
		var err error
		switch v := vals[0]; key {
		case "events-port":
			if d.EventsPort, err = parsePort(v); err != nil {
				return fmt.Errorf("events-port: %w", err)
			}
			d.EventsImplied = false
		case "replay-port":
			if d.ReplayPort, err = parsePort(v); err != nil {
				return fmt.Errorf("replay-port: %w", err)
			}
		case "scheme":
			if v != "http" && v != "https" {
				return fmt.Errorf("scheme=%q: want http or https", v)
			}
			d.Scheme = v
		default:
			return fmt.Errorf("unknown option %q (known: events-port, replay-port, dp, model, role, scheme)", key)
		}
		return nil
	})
	if err != nil {
		return DNSSpec{}, fmt.Errorf("--discover-dns %q: %w", s, err)
	}
	for name, p := range map[string]int{"events-port": d.EventsPort, "replay-port": d.ReplayPort} {
		if p != 0 && p+d.DP-1 > 65535 {
			return DNSSpec{}, fmt.Errorf("--discover-dns %q: %s %d + dp %d exceeds 65535", s, name, p, d.DP)
		}
	}
	return d, nil
}

// SpecFor builds the endpoint spec of one resolved address.
func (d DNSSpec) SpecFor(addr string) (Spec, error) {
	ip := net.ParseIP(addr)
	if ip == nil {
		return Spec{}, fmt.Errorf("dns %s: resolver returned %q, not an IP address", d.Name, addr)
	}
	host := ip.String()
	s := Spec{
		Endpoint:      d.Scheme + "://" + net.JoinHostPort(host, strconv.Itoa(d.Port)),
		Events:        "tcp://" + net.JoinHostPort(host, strconv.Itoa(d.EventsPort)),
		EventsImplied: d.EventsImplied,
		DP:            d.DP,
		Models:        slices.Clone(d.Models),
		Role:          d.Role,
	}
	if d.ReplayPort != 0 {
		s.Replay = "tcp://" + net.JoinHostPort(host, strconv.Itoa(d.ReplayPort))
	}
	return s, nil
}
