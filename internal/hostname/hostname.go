// Package hostname owns the one rule the packages that read addresses
// share for a host: an IP address or a DNS name.
package hostname

import "net"

// Valid accepts an IP address or a DNS name (letters, digits, '-', '_' and
// '.', at most 253 bytes).
func Valid(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	if h == "" || len(h) > 253 {
		return false
	}
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
		default:
			return false
		}
	}
	return true
}
