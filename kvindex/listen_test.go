package kvindex

import "testing"

func TestParseListenAddr(t *testing.T) {
	for _, tt := range []struct {
		in   string
		host string
		port int
		err  bool
	}{
		{in: "tcp://*:5557", host: "*", port: 5557},
		{in: "tcp://0.0.0.0:5557", host: "0.0.0.0", port: 5557},
		{in: "tcp://[::]:5557", host: "::", port: 5557},
		{in: "tcp://router.ns.svc:5557", host: "router.ns.svc", port: 5557},
		{in: "5557", err: true},
		{in: "ipc:///tmp/kv", err: true},
		{in: "tcp://*:0", err: true},
		{in: "tcp://*:*", err: true},
		{in: "tcp://*", err: true},
		{in: "tcp://bad host:1", err: true},
	} {
		host, port, err := ParseListenAddr(tt.in)
		if (err != nil) != tt.err || host != tt.host || port != tt.port {
			t.Errorf("ParseListenAddr(%q) = %q, %d, %v", tt.in, host, port, err)
		}
	}
}

// FuzzParseListenAddr: any string is an address or an error, never a
// panic, and what parses names a port in range.
func FuzzParseListenAddr(f *testing.F) {
	for _, s := range []string{"tcp://*:5557", "tcp://[::]:5557", "tcp://router.ns.svc:5557", "tcp://*:0", "ipc:///tmp/kv", "tcp://[::1]:65535"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		host, port, err := ParseListenAddr(s)
		if err == nil && (host == "" || port < 1 || port > 65535) {
			t.Fatalf("ParseListenAddr(%q) = %q, %d", s, host, port)
		}
	})
}
