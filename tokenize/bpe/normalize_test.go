package bpe

import (
	"strings"
	"testing"
)

// TestIsASCII: a byte above 0x7F is found at every position of texts that
// span the eight-byte loop and its tail.
func TestIsASCII(t *testing.T) {
	for n := range 20 {
		text := strings.Repeat("a", n)
		if !isASCII(text) {
			t.Fatalf("%d ASCII bytes reported as not ASCII", n)
		}
		for i := range n {
			b := []byte(text)
			b[i] = 0x80
			if isASCII(string(b)) {
				t.Fatalf("byte 0x80 at %d of %d missed", i, n)
			}
		}
	}
}
