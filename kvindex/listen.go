package kvindex

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/prefixrouter/prefixrouter/internal/hostname"
)

// ParseListenAddr checks a listen address (an event bus's, the peer
// mesh's), tcp://ADDR:PORT with ADDR an IP address, a host name or *
// (every interface), and returns its parts.
func ParseListenAddr(addr string) (string, int, error) {
	hp, ok := strings.CutPrefix(addr, "tcp://")
	if !ok {
		return "", 0, fmt.Errorf("%q: want tcp://ADDR:PORT", addr)
	}
	host, ps, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, fmt.Errorf("%q: want tcp://ADDR:PORT: %w", addr, err)
	}
	if host != "*" && !hostname.Valid(host) {
		return "", 0, fmt.Errorf("%q: address %q is neither an IP address, a host name nor *", addr, host)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != ps {
		return "", 0, fmt.Errorf("%q: port %q: want 1..65535", addr, ps)
	}
	return host, port, nil
}
