package peers

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/prefixrouter/prefixrouter/internal/hostname"
	"github.com/prefixrouter/prefixrouter/kvindex"
)

// Spec is one --peers entry: tcp://HOST:PORT, one replica (HOST an IP
// address or a name resolved like the others), or dns:NAME:PORT, every
// address NAME resolves to (a headless Service: one per replica, this one
// among them), re-resolved every resolve interval.
type Spec struct {
	Text string
	DNS  bool
	Host string
	Port int
}

// ParseSpec reads one --peers entry.
func ParseSpec(s string) (Spec, error) {
	s = strings.TrimSpace(s)
	var hp string
	var dns bool
	switch {
	case strings.HasPrefix(s, "tcp://"):
		hp = strings.TrimPrefix(s, "tcp://")
	case strings.HasPrefix(s, "dns:"):
		hp, dns = strings.TrimPrefix(s, "dns:"), true
	default:
		return Spec{}, fmt.Errorf("%q: want tcp://HOST:PORT or dns:NAME:PORT", s)
	}
	host, ps, err := net.SplitHostPort(hp)
	if err != nil {
		return Spec{}, fmt.Errorf("%q: want tcp://HOST:PORT or dns:NAME:PORT: %w", s, err)
	}
	if !hostname.Valid(host) {
		return Spec{}, fmt.Errorf("%q: %q is neither an IP address nor a host name", s, host)
	}
	if dns && net.ParseIP(host) != nil {
		return Spec{}, fmt.Errorf("%q: dns: names a DNS name; give an address as tcp://%s", s, hp)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != ps {
		return Spec{}, fmt.Errorf("%q: port %q: want 1..65535", s, ps)
	}
	return Spec{Text: s, DNS: dns, Host: strings.ToLower(host), Port: port}, nil
}

// Resolver looks names up (net.DefaultResolver; a test's fake).
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// resolve returns the spec's peer addresses, tcp://IP:PORT.
func (s Spec) resolve(ctx context.Context, r Resolver) ([]string, error) {
	if ip := net.ParseIP(s.Host); ip != nil {
		return []string{addrOf(ip.String(), s.Port)}, nil
	}
	hosts, err := r.LookupHost(ctx, s.Host)
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", s.Host, err)
	}
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		out = append(out, addrOf(h, s.Port))
	}
	return out, nil
}

func addrOf(host string, port int) string {
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// localAddrs are the addresses a replica bound at listen answers on: its
// listen host's, or every interface's for a wildcard.
func localAddrs(ctx context.Context, listen string, r Resolver) (map[string]bool, error) {
	host, port, err := kvindex.ParseListenAddr(listen)
	if err != nil {
		return nil, err
	}
	var ips []string
	switch host {
	case "*", "0.0.0.0", "::":
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return nil, fmt.Errorf("listing interface addresses: %w", err)
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				ips = append(ips, n.IP.String())
			}
		}
	default:
		if ip := net.ParseIP(host); ip != nil {
			ips = []string{ip.String()}
		} else if ips, err = r.LookupHost(ctx, host); err != nil {
			return nil, fmt.Errorf("resolving --peer-listen host %s: %w", host, err)
		}
	}
	out := make(map[string]bool, len(ips))
	for _, ip := range ips {
		out[addrOf(ip, port)] = true
	}
	return out, nil
}
