package main

import (
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestHeapPeakWritesAtEachNewPeak(t *testing.T) {
	tests := []struct {
		name   string
		live   []uint64
		fail   int // the write that fails (1-based; 0: none)
		writes int
	}{
		{"rising", []uint64{1, 2, 3}, 0, 3},
		{"falls after the peak", []uint64{5, 3, 4, 5}, 0, 1},
		{"a later, higher peak", []uint64{5, 3, 8, 2}, 0, 2},
		{"nothing live", []uint64{0, 0}, 0, 0},
		{"a failed write stops it", []uint64{1, 2, 3}, 2, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			writes := 0
			h := &heapPeak{write: func() error {
				writes++
				if writes == tc.fail {
					return errors.New("disk full")
				}
				return nil
			}}
			for _, l := range tc.live {
				h.observe(l)
			}
			if writes != tc.writes {
				t.Errorf("%d writes, want %d", writes, tc.writes)
			}
			if (h.err != nil) != (tc.fail > 0) {
				t.Errorf("error %v", h.err)
			}
		})
	}
}

func TestStartHeapProfileWritesAProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "heap.pprof")
	stop, err := startHeapProfile(path, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f) // pprof's format is gzipped protobuf
	if err != nil {
		t.Fatalf("not a pprof profile: %v", err)
	}
	if b, err := io.ReadAll(z); err != nil || len(b) == 0 {
		t.Fatalf("not a pprof profile: %d bytes, %v", len(b), err)
	}
}

func TestStartHeapProfileUnwritablePath(t *testing.T) {
	if _, err := startHeapProfile(filepath.Join(t.TempDir(), "missing", "heap.pprof"), time.Second); err == nil {
		t.Fatal("no error for a path in a missing directory")
	}
}
