package kvtransport

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// sourceResolver answers which addresses a host name stands for, so that a
// bus can tell a pod's own publisher from one elsewhere: IP literals
// directly, names through DNS, each lookup bounded by timeout and its
// answer (or failure) kept for ttl. The cache holds at most max names;
// the names come from the targets' endpoints and topic= settings, so it
// stays small unless the fleet is huge.
type sourceResolver struct {
	lookup  func(ctx context.Context, host string) ([]netip.Addr, error)
	timeout time.Duration
	ttl     time.Duration
	max     int
	now     func() time.Time

	mu    sync.Mutex
	cache map[string]resolvedHost
}

type resolvedHost struct {
	addrs []netip.Addr
	until time.Time
}

func newSourceResolver(lookup func(ctx context.Context, host string) ([]netip.Addr, error)) *sourceResolver {
	if lookup == nil {
		lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	return &sourceResolver{lookup: lookup, timeout: 2 * time.Second, ttl: 30 * time.Second, max: 4096, now: time.Now,
		cache: make(map[string]resolvedHost)}
}

// allows reports whether peer is one of host's addresses. A failed lookup
// keeps the addresses last resolved.
func (r *sourceResolver) allows(ctx context.Context, host string, peer netip.Addr) bool {
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap() == peer
	}
	if host == "localhost" {
		return peer.IsLoopback()
	}
	now := r.now()
	r.mu.Lock()
	e, ok := r.cache[host]
	r.mu.Unlock()
	if !ok || !now.Before(e.until) {
		lctx, cancel := context.WithTimeout(ctx, r.timeout)
		addrs, err := r.lookup(lctx, host)
		cancel()
		if err == nil {
			e.addrs = addrs
		}
		e.until = now.Add(r.ttl)
		r.mu.Lock()
		if len(r.cache) >= r.max {
			clear(r.cache)
		}
		r.cache[host] = e
		r.mu.Unlock()
	}
	for _, a := range e.addrs {
		if a.Unmap() == peer {
			return true
		}
	}
	return false
}
