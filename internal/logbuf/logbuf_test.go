package logbuf

import (
	"log/slog"
	"sync"
	"testing"
)

func TestLinesFromManyWriters(t *testing.T) {
	var b Buffer
	log := slog.New(slog.NewTextHandler(&b, nil))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { log.Warn("wiring fault", "n", i) })
	}
	wg.Wait()
	log.Info("other")
	if n := len(b.Lines("level=WARN", "wiring fault")); n != 8 {
		t.Fatalf("%d warning lines, want 8 in %q", n, b.String())
	}
	if n := len(b.Lines()); n != 9 {
		t.Fatalf("%d lines, want 9", n)
	}
	if n := len(b.Lines("level=INFO", "wiring")); n != 0 {
		t.Fatalf("%d lines match both, want 0", n)
	}
}
