package hostname

import (
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want bool
	}{
		{"10.0.0.7", true}, {"fd00::7", true}, {"pod-a.ns.svc", true}, {"Pod_A", true},
		{"", false}, {"bad host", false}, {"[fd00::7]", false}, {"a/b", false},
		{strings.Repeat("a", 253), true}, {strings.Repeat("a", 254), false},
	} {
		if got := Valid(tt.in); got != tt.want {
			t.Errorf("Valid(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
