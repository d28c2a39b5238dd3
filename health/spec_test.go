package health

import (
	"reflect"
	"strings"
	"testing"

	"github.com/prefixrouter/prefixrouter/targetid"
)

func TestParseSpec(t *testing.T) {
	tests := []struct {
		in      string
		want    Spec
		wantErr string
	}{
		{in: "http://10.0.0.7:8000", want: Spec{Endpoint: "http://10.0.0.7:8000", Events: "tcp://10.0.0.7:5557", EventsImplied: true, DP: 1, Role: RoleBoth}},
		{in: "  HTTP://Pod-A.Example:8000/  ", want: Spec{Endpoint: "http://pod-a.example:8000", Events: "tcp://pod-a.example:5557", EventsImplied: true, DP: 1, Role: RoleBoth}},
		{
			in: "http://10.0.0.7:8000?events=tcp://10.0.0.7:5557&replay=tcp://10.0.0.7:5558&dp=2&model=NAME&role=prefill",
			want: Spec{Endpoint: "http://10.0.0.7:8000", Events: "tcp://10.0.0.7:5557", Replay: "tcp://10.0.0.7:5558",
				DP: 2, Models: []string{"NAME"}, Role: RolePrefill},
		},
		{in: "https://[::1]:8443/v?model=a&model=b&model=a&role=Decode", want: Spec{Endpoint: "https://[::1]:8443/v", Events: "tcp://[::1]:5557", EventsImplied: true, DP: 1, Models: []string{"a", "b"}, Role: RoleDecode}},
		{in: "http://host", want: Spec{Endpoint: "http://host", Events: "tcp://host:5557", EventsImplied: true, DP: 1, Role: RoleBoth}},
		{in: "http://h:1?events=ipc:///tmp/kv", want: Spec{Endpoint: "http://h:1", Events: "ipc:///tmp/kv", DP: 1, Role: RoleBoth}},
		{in: "http://h:1?topic=kv@pod-7@m&replay=tcp://h:5600", want: Spec{Endpoint: "http://h:1", Events: "tcp://h:5557", EventsImplied: true, Replay: "tcp://h:5600", Topic: "kv@pod-7@m", DP: 1, Role: RoleBoth}},
		{in: "http://h:1?topic=", wantErr: "empty topic"},
		{in: "http://h:1?topic=a%0Ab", wantErr: "not printable"},
		{in: "", wantErr: "empty"},
		{in: "10.0.0.7:8000", wantErr: "missing scheme"},
		{in: "ftp://h:1", wantErr: "scheme"},
		{in: "http://:8000", wantErr: "missing host"},
		{in: "http://h:0", wantErr: "port"},
		{in: "http://h:99999", wantErr: "port"},
		{in: "http://h:", wantErr: "empty port"},
		{in: "http://u:p@h:1", wantErr: "credentials"},
		{in: "http://h:1#frag", wantErr: "fragment"},
		{in: "http://h:1?dp=0", wantErr: "dp"},
		{in: "http://h:1?dp=x", wantErr: "dp"},
		{in: "http://h:1?dp=1000", wantErr: "dp"},
		{in: "http://h:1?dp=2&dp=3", wantErr: "given 2 times"},
		{in: "http://h:1?role=leader", wantErr: "role"},
		{in: "http://h:1?evnets=tcp://h:1", wantErr: "unknown option"},
		{in: "http://h:1?events=h:5557", wantErr: "events"},
		{in: "http://h:1?events=tcp://*:5557", wantErr: "concrete host"},
		{in: "http://h:1?events=tcp://h", wantErr: "events"},
		{in: "http://h:1?replay=tcp://h:70000", wantErr: "replay"},
		{in: "http://h:1?events=tcp://h:65535&dp=2", wantErr: "exceeds 65535"},
		{in: "http://h:1?events=ipc:///x&dp=2", wantErr: "tcp address"},
		{in: "http://h:1?model=", wantErr: "empty model"},
		{in: "http://h:1?model=a%0Ab", wantErr: "control character"},
		{in: "http://h:1?%zz", wantErr: "query"},
		{in: "http://h:8000/v1/", wantErr: "not the OpenAI /v1 base"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSpec(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseSpec(%q) err = %v, want containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSpec(%q): %v", tt.in, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseSpec(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
			again, err := ParseSpec(got.String())
			if err != nil || !again.Equal(got) {
				t.Fatalf("round trip of %q via %q: %+v, %v", tt.in, got.String(), again, err)
			}
		})
	}
}

func TestSpecTargetsPerRank(t *testing.T) {
	s, err := ParseSpec("http://10.0.0.7:8000?replay=tcp://10.0.0.7:6000&dp=3&model=m&role=decode")
	if err != nil {
		t.Fatal(err)
	}
	ts, err := s.Targets()
	if err != nil {
		t.Fatal(err)
	}
	want := []TargetSpec{
		{ID: targetid.ID{Endpoint: "http://10.0.0.7:8000", Rank: 0}, Events: "tcp://10.0.0.7:5557", EventsImplied: true, Replay: "tcp://10.0.0.7:6000", DP: 3, Models: []string{"m"}, Role: RoleDecode},
		{ID: targetid.ID{Endpoint: "http://10.0.0.7:8000", Rank: 1}, Events: "tcp://10.0.0.7:5558", EventsImplied: true, Replay: "tcp://10.0.0.7:6001", DP: 3, Models: []string{"m"}, Role: RoleDecode},
		{ID: targetid.ID{Endpoint: "http://10.0.0.7:8000", Rank: 2}, Events: "tcp://10.0.0.7:5559", EventsImplied: true, Replay: "tcp://10.0.0.7:6002", DP: 3, Models: []string{"m"}, Role: RoleDecode},
	}
	if !reflect.DeepEqual(ts, want) {
		t.Fatalf("Targets() =\n%+v\nwant\n%+v", ts, want)
	}
	// The label is targetid.ID's, rank always present, so health and kv
	// series join.
	for i, want := range []string{"http://10.0.0.7:8000#0", "http://10.0.0.7:8000#1", "http://10.0.0.7:8000#2"} {
		if got := ts[i].ID.String(); got != want {
			t.Fatalf("rank %d label %q, want %q", i, got, want)
		}
	}
}

func TestParseDNSSpec(t *testing.T) {
	tests := []struct {
		in      string
		want    DNSSpec
		wantErr string
	}{
		{in: "vllm.ns.svc.cluster.local:8000", want: DNSSpec{Name: "vllm.ns.svc.cluster.local", Port: 8000, Scheme: "http", EventsPort: 5557, EventsImplied: true, DP: 1, Role: RoleBoth}},
		{in: "vllm:8000?events-port=6000&replay-port=6100&dp=2&model=m&role=prefill&scheme=https",
			want: DNSSpec{Name: "vllm", Port: 8000, Scheme: "https", EventsPort: 6000, ReplayPort: 6100, DP: 2, Models: []string{"m"}, Role: RolePrefill}},
		{in: "vllm", wantErr: "NAME:PORT"},
		{in: ":8000", wantErr: "invalid name"},
		{in: "vllm:0", wantErr: "port"},
		{in: "vllm:8000?events-port=x", wantErr: "events-port"},
		{in: "vllm:8000?events-port=65535&dp=2", wantErr: "exceeds"},
		{in: "vllm:8000?foo=1", wantErr: "unknown option"},
		{in: "vllm:8000?scheme=ftp", wantErr: "scheme"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseDNSSpec(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	d, _ := ParseDNSSpec("vllm:8000?replay-port=5558&dp=2")
	s, err := d.SpecFor("fd00::7")
	if err != nil {
		t.Fatal(err)
	}
	want := Spec{Endpoint: "http://[fd00::7]:8000", Events: "tcp://[fd00::7]:5557", EventsImplied: true, Replay: "tcp://[fd00::7]:5558", DP: 2, Role: RoleBoth}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("SpecFor = %+v, want %+v", s, want)
	}
	if _, err := d.SpecFor("not-an-ip"); err == nil {
		t.Fatal("SpecFor accepted a name")
	}
	// A DNS-built spec is a valid spec.
	if again, err := ParseSpec(s.String()); err != nil || !again.Equal(s) {
		t.Fatalf("DNS spec does not round-trip: %v %+v", err, again)
	}
}

func TestParseEndpointsFile(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []string
		wantErr string
	}{
		{name: "yaml list", in: "# fleet\n- http://a:8000?dp=2\n- http://b:8000\n", want: []string{"http://a:8000", "http://b:8000"}},
		{name: "json list", in: `["http://a:8000", "http://b:8000?model=m"]`, want: []string{"http://a:8000", "http://b:8000"}},
		{name: "json object", in: `{"endpoints": ["http://a:8000"]}`, want: []string{"http://a:8000"}},
		{name: "yaml object", in: "endpoints:\n  - http://a:8000\n", want: []string{"http://a:8000"}},
		{name: "explicit empty", in: "[]", want: []string{}},
		{name: "blank", in: " \n", wantErr: "empty"},
		{name: "bad spec", in: "- http://a:8000?dp=0\n", wantErr: "item 0"},
		{name: "duplicate", in: "- http://a:8000\n- http://A:8000/\n", wantErr: "twice"},
		{name: "not a list", in: "foo: bar\n", wantErr: "want a list"},
		{name: "scalar", in: "http://a:8000\n", wantErr: "want a list"},
		{name: "object item", in: "- {url: http://a:8000}\n", wantErr: "spec string"},
		{name: "broken yaml", in: "- [\n", wantErr: "endpoints file"},
		{name: "null", in: "~\n", wantErr: "no list"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			specs, err := ParseEndpointsFile([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := []string{}
			for _, s := range specs {
				got = append(got, s.Endpoint)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{
		"http://10.0.0.7:8000?events=tcp://10.0.0.7:5557&replay=tcp://10.0.0.7:5558&dp=2&model=NAME&role=prefill",
		"https://[::1]:8443/v?model=a&model=b", "http://h", "http://h:1?events=ipc:///tmp/x", "x://", "http://h:1?dp=256",
		"http://h:1?events=tcp://h:65000&dp=200",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := ParseSpec(s)
		if err != nil {
			return
		}
		if spec.DP < 1 || spec.DP > MaxDataParallel || spec.Events == "" || spec.Endpoint == "" {
			t.Fatalf("ParseSpec(%q) accepted %+v", s, spec)
		}
		ts, err := spec.Targets()
		if err != nil {
			t.Fatalf("accepted spec %q does not expand: %v", s, err)
		}
		if len(ts) != spec.DP {
			t.Fatalf("%d targets for dp=%d", len(ts), spec.DP)
		}
		again, err := ParseSpec(spec.String())
		if err != nil {
			t.Fatalf("canonical form %q of %q does not parse: %v", spec.String(), s, err)
		}
		if !again.Equal(spec) {
			t.Fatalf("round trip of %q: %+v != %+v", s, again, spec)
		}
	})
}

func FuzzParseDNSSpec(f *testing.F) {
	for _, s := range []string{"vllm:8000", "vllm:8000?events-port=6000&replay-port=6100&dp=2&model=m&role=prefill", "[::1]:1?dp=3"} {
		f.Add(s, "10.0.0.1")
	}
	f.Fuzz(func(t *testing.T, s, addr string) {
		d, err := ParseDNSSpec(s)
		if err != nil {
			return
		}
		spec, err := d.SpecFor(addr)
		if err != nil {
			return
		}
		if _, err := spec.Targets(); err != nil {
			t.Fatalf("spec from %q/%q does not expand: %v", s, addr, err)
		}
		if again, err := ParseSpec(spec.String()); err != nil || !again.Equal(spec) {
			t.Fatalf("spec from %q/%q: %q does not round-trip: %v", s, addr, spec.String(), err)
		}
	})
}

func FuzzParseEndpointsFile(f *testing.F) {
	for _, s := range []string{"- http://a:8000?dp=2\n- http://b:8000\n", `{"endpoints": ["http://a:8000"]}`, "[]", "- [\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		specs, err := ParseEndpointsFile(b)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, s := range specs {
			if seen[s.Endpoint] {
				t.Fatalf("duplicate %s accepted", s.Endpoint)
			}
			seen[s.Endpoint] = true
		}
	})
}

// TestSharedOptionsAgree: dp, model and role mean the same in an endpoint
// spec and a --discover-dns entry: same values accepted, same results, same
// error text after each syntax's prefix.
func TestSharedOptionsAgree(t *testing.T) {
	tests := []struct {
		query   string
		wantErr string
		dp      int
		models  []string
		role    Role
	}{
		{query: "", dp: 1, role: RoleBoth},
		{query: "dp=4", dp: 4, role: RoleBoth},
		{query: "dp=256", dp: 256, role: RoleBoth},
		{query: "dp=0", wantErr: `dp="0": want an integer in 1..256`},
		{query: "dp=257", wantErr: `dp="257": want an integer in 1..256`},
		{query: "dp=two", wantErr: `dp="two"`},
		{query: "dp=1&dp=2", wantErr: `option "dp" given 2 times`},
		{query: "model=a&model=b&model=a", dp: 1, models: []string{"a", "b"}, role: RoleBoth},
		{query: "model=", wantErr: "model: empty model name"},
		{query: "model=%01", wantErr: "control character"},
		{query: "role=Prefill", dp: 1, role: RolePrefill},
		{query: "role=decode", dp: 1, role: RoleDecode},
		{query: "role=router", wantErr: `role="router": want prefill, decode or both`},
		{query: "role=both&role=decode", wantErr: `option "role" given 2 times`},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			s, serr := ParseSpec("http://10.0.0.7:8000?" + tt.query)
			d, derr := ParseDNSSpec("vllm:8000?" + tt.query)
			for name, err := range map[string]error{"endpoint": serr, "dns": derr} {
				if tt.wantErr == "" && err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
					t.Fatalf("%s: err %v, want containing %q", name, err, tt.wantErr)
				}
			}
			if tt.wantErr != "" {
				return
			}
			if s.DP != tt.dp || d.DP != tt.dp || s.Role != tt.role || d.Role != tt.role ||
				!reflect.DeepEqual(s.Models, tt.models) || !reflect.DeepEqual(d.Models, tt.models) {
				t.Fatalf("endpoint %+v, dns %+v; want dp %d models %v role %s", s, d, tt.dp, tt.models, tt.role)
			}
		})
	}
}
