package positive

import (
	"strings"
	"testing"
	"time"
)

type config struct {
	Wait  time.Duration
	Tries int
}

func (c *config) fields() Fields {
	return Fields{Durations: []Duration{{"wait", &c.Wait}}, Ints: []Int{{"tries", &c.Tries}}}
}

func TestFillAndCheck(t *testing.T) {
	def := config{Wait: time.Second, Tries: 3}
	tests := []struct {
		name string
		in   config
		fill config   // after Fill
		errs []string // Check on the input as given
	}{
		{"zeros take the defaults", config{}, def, []string{"--wait must be positive, not 0s", "--tries must be at least 1, not 0"}},
		{"given values stay", config{Wait: time.Minute, Tries: 7}, config{Wait: time.Minute, Tries: 7}, nil},
		{"negatives stay and are refused", config{Wait: -time.Second, Tries: -1}, config{Wait: -time.Second, Tries: -1},
			[]string{"--wait must be positive, not -1s", "--tries must be at least 1, not -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.in
			errs := c.fields().Check()
			if len(errs) != len(tt.errs) {
				t.Fatalf("Check: %v, want %q", errs, tt.errs)
			}
			for i, e := range errs {
				if !strings.Contains(e.Error(), tt.errs[i]) {
					t.Errorf("error %q, want %q", e, tt.errs[i])
				}
			}
			c.fields().Fill(def.fields())
			if c != tt.fill {
				t.Fatalf("Fill: %+v, want %+v", c, tt.fill)
			}
		})
	}
}
