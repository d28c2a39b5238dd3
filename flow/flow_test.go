package flow

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

var t0 = time.Unix(1000, 0)

func testConfig() Config {
	c := DefaultConfig()
	c.MaxRequests, c.MaxTokens = 100, 10_000
	return c
}

func ticket(class int, tenant string, tokens int64, at time.Duration) *Ticket {
	return &Ticket{Class: class, Tenant: tenant, Tokens: tokens, Work: tokens / 2, Arrived: t0.Add(at)}
}

// drain pops every ticket and names them class/tenant.
func drain(l *Line) []string {
	var out []string
	for t := l.Pop(); t != nil; t = l.Pop() {
		out = append(out, fmt.Sprintf("%d/%s", t.Class, t.Tenant))
	}
	return out
}

func TestOrder(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shares map[string]float64
		push   []*Ticket
		want   string
	}{
		{"higher class first, whatever the arrival", nil,
			[]*Ticket{ticket(1, "a", 10, 0), ticket(1, "a", 10, 1), ticket(0, "b", 10, 2)},
			"0/b 1/a 1/a"},
		{"within a class, tenants alternate by tokens", nil,
			[]*Ticket{ticket(0, "noisy", 10, 0), ticket(0, "noisy", 10, 1), ticket(0, "noisy", 10, 2), ticket(0, "noisy", 10, 3), ticket(0, "quiet", 10, 4), ticket(0, "quiet", 10, 5)},
			"0/noisy 0/quiet 0/noisy 0/quiet 0/noisy 0/noisy"},
		{"a tenant of big requests waits its tokens' worth", nil,
			[]*Ticket{ticket(0, "big", 30, 0), ticket(0, "big", 30, 1), ticket(0, "small", 10, 2), ticket(0, "small", 10, 3), ticket(0, "small", 10, 4), ticket(0, "small", 10, 5)},
			"0/big 0/small 0/small 0/small 0/big 0/small"},
		{"a share of 2 leaves twice as often", map[string]float64{"gold": 2},
			[]*Ticket{ticket(0, "gold", 10, 0), ticket(0, "gold", 10, 1), ticket(0, "gold", 10, 2), ticket(0, "gold", 10, 3), ticket(0, "base", 10, 4), ticket(0, "base", 10, 5)},
			"0/gold 0/base 0/gold 0/gold 0/base 0/gold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Shares = tc.shares
			l := New(cfg)
			for _, tk := range tc.push {
				if err := l.Push(tk); err != nil {
					t.Fatal(err)
				}
			}
			if got := strings.Join(drain(l), " "); got != tc.want {
				t.Fatalf("order %s, want %s", got, tc.want)
			}
			if l.Len() != 0 || l.Sum().Tokens != 0 {
				t.Fatalf("drained line holds %d requests, %d tokens", l.Len(), l.Sum().Tokens)
			}
		})
	}
}

// TestAheadIsThePopOrder: for any line, the tokens Ahead says would leave
// before a newcomer are exactly those popped before it once pushed.
func TestAheadIsThePopOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tenants := []string{"a", "b", "c", "d"}
	for round := range 200 {
		cfg := testConfig()
		cfg.MaxRequests, cfg.MaxTokens = 1000, 1<<40
		cfg.Shares = map[string]float64{"b": 2, "c": 0.5}
		l := New(cfg)
		var live []*Ticket
		for i := range 40 {
			switch rng.IntN(4) {
			case 0:
				l.Pop()
			case 1:
				if len(live) > 0 {
					l.Remove(live[rng.IntN(len(live))])
				}
			default:
				tk := ticket(rng.IntN(2), tenants[rng.IntN(len(tenants))], int64(1+rng.IntN(50)), time.Duration(i))
				if err := l.Push(tk); err != nil {
					t.Fatal(err)
				}
				live = append(live, tk)
			}
		}
		nt := ticket(rng.IntN(2), tenants[rng.IntN(len(tenants))], int64(1+rng.IntN(50)), time.Hour)
		want := l.Ahead(nt.Class, nt.Tenant, nt.Tokens)
		if err := l.Push(nt); err != nil {
			t.Fatal(err)
		}
		var before Amount
		for tk := l.Pop(); tk != nt; tk = l.Pop() {
			if tk == nil {
				t.Fatalf("round %d: the newcomer never left", round)
			}
			before = before.add(tk.amount())
		}
		if before != want {
			t.Fatalf("round %d: Ahead said %v, %v left before it", round, want, before)
		}
	}
}

func TestBounds(t *testing.T) {
	cfg := testConfig()
	cfg.MaxRequests, cfg.MaxTokens = 2, 100
	l := New(cfg)
	if err := l.Push(ticket(0, "a", 60, 0)); err != nil {
		t.Fatal(err)
	}
	if err := l.Push(ticket(0, "a", 50, 0)); !errors.Is(err, ErrFull) {
		t.Fatalf("past the token bound: %v, want ErrFull", err)
	}
	if err := l.Push(ticket(0, "b", 40, 0)); err != nil {
		t.Fatal(err)
	}
	if err := l.Push(ticket(0, "c", 1, 0)); !errors.Is(err, ErrFull) {
		t.Fatalf("past the request bound: %v, want ErrFull", err)
	}
	tk := ticket(0, "d", 1, 0)
	if err := l.Push(tk); !errors.Is(err, ErrFull) || tk.Queued() {
		t.Fatalf("refused ticket: %v, queued %v", err, tk.Queued())
	}
}

func TestRemoveAndOverdue(t *testing.T) {
	l := New(testConfig())
	a1, a2, a3 := ticket(0, "a", 10, 0), ticket(0, "a", 20, 1), ticket(0, "a", 30, 2)
	b := ticket(1, "b", 5, 3)
	b.Deadline = t0.Add(time.Second)
	for _, tk := range []*Ticket{a1, a2, a3, b} {
		if err := l.Push(tk); err != nil {
			t.Fatal(err)
		}
	}
	l.Remove(a2)
	l.Remove(a2) // gone already: nothing
	if l.Len() != 3 || l.Sum().Tokens != 45 || a2.Queued() {
		t.Fatalf("after a removal: %d requests, %d tokens", l.Len(), l.Sum().Tokens)
	}
	if got := l.Ahead(0, "a", 1); got != (Amount{40, 20}) {
		t.Fatalf("ahead of a's next %d tokens, want a1 and a3's 40", got)
	}
	if got := l.Overdue(t0.Add(time.Second), nil); len(got) != 0 {
		t.Fatalf("due at the deadline itself: %d overdue", len(got))
	}
	if got := l.Overdue(t0.Add(2*time.Second), nil); len(got) != 1 || got[0] != b || b.Queued() {
		t.Fatalf("overdue %v, want b out of the line", got)
	}
	if got := drain(l); strings.Join(got, " ") != "0/a 0/a" {
		t.Fatalf("left %v", got)
	}
}

// TestTenantsForgotten: a flood of tenants of one request each leaves no
// state behind once served.
func TestTenantsForgotten(t *testing.T) {
	cfg := testConfig()
	cfg.MaxRequests = 10_000
	cfg.MaxTokens = 1 << 40
	l := New(cfg)
	for i := range 5000 {
		if err := l.Push(ticket(0, fmt.Sprintf("user-%d", i), 10, 0)); err != nil {
			t.Fatal(err)
		}
	}
	drain(l)
	if n := len(l.classes[0].tenants); n > 1 {
		t.Fatalf("%d tenants remembered after the line drained", n)
	}
}

func TestConfigValidate(t *testing.T) {
	good := DefaultConfig()
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := Config{Classes: []Class{{Name: "a b"}, {Name: "x", Objective: -1}, {Name: "x"}}, DefaultClass: "nope",
		Shares: map[string]float64{"t": 0}, MaxRequests: 0, MaxTokens: -1}
	err := bad.Validate()
	if err == nil {
		t.Fatal("a bad config passed")
	}
	for _, want := range []string{`class name "a b"`, `class "x" given twice`, "must not be negative", `--default-class "nope"`, "--tenant-share t=0", "--queue-max-requests", "--queue-max-tokens"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Class
		wantErr string
	}{
		{"interactive=2s", Class{"interactive", 2 * time.Second}, ""},
		{"batch=1m30s", Class{"batch", 90 * time.Second}, ""},
		{"batch", Class{}, "want CLASS=DURATION"},
		{"batch=soon", Class{}, "invalid duration"},
	} {
		got, err := ParseClass(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseClass(%q) = %v, %v; want an error saying %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseClass(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	if n, w, err := ParseShare("team-a=2.5"); err != nil || n != "team-a" || w != 2.5 {
		t.Errorf("ParseShare: %q %v %v", n, w, err)
	}
	for _, in := range []string{"team", "=2", "t=x"} {
		if _, _, err := ParseShare(in); err == nil {
			t.Errorf("ParseShare(%q) passed", in)
		}
	}
}

// FuzzLine runs a sequence of operations drawn from the input and checks
// the line's counts and order invariants after each.
func FuzzLine(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{2, 2, 2, 0, 0, 1, 3, 3, 3, 3})
	f.Fuzz(func(t *testing.T, ops []byte) {
		cfg := testConfig()
		cfg.MaxRequests, cfg.MaxTokens = 20, 500
		cfg.Shares = map[string]float64{"t1": 3}
		l := New(cfg)
		var all []*Ticket
		for i, op := range ops {
			switch op % 4 {
			case 0:
				tk := ticket(int(op/4)%2, fmt.Sprintf("t%d", op/8%3), int64(op%37), time.Duration(i))
				if err := l.Push(tk); err != nil && !errors.Is(err, ErrFull) {
					t.Fatal(err)
				}
				all = append(all, tk)
			case 1:
				l.Pop()
			case 2:
				if len(all) > 0 {
					l.Remove(all[int(op)%len(all)])
				}
			case 3:
				l.Overdue(t0.Add(time.Duration(op)), nil)
			}
			n, tokens := 0, int64(0)
			for _, tk := range all {
				if tk.Queued() {
					n++
					tokens += tk.Tokens
				}
			}
			if n != l.Len() || tokens != l.Sum().Tokens {
				t.Fatalf("op %d: line says %d requests %d tokens, tickets say %d, %d", i, l.Len(), l.Sum().Tokens, n, tokens)
			}
			if o := l.OldestOf(0); o != nil && !o.Queued() {
				t.Fatalf("op %d: the oldest ticket is not queued", i)
			}
			if n > cfg.MaxRequests || tokens > cfg.MaxTokens {
				t.Fatalf("op %d: %d requests %d tokens past the bounds", i, n, tokens)
			}
			if h := l.Head(); (h == nil) != (n == 0) {
				t.Fatalf("op %d: head %v with %d waiting", i, h, n)
			}
		}
	})
}
