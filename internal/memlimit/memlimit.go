// Package memlimit owns what the process knows of its memory limit: the
// container's (cgroup v2 memory.max, or v1 memory.limit_in_bytes), the Go
// runtime's soft limit (GOMEMLIMIT) set from it, and the heap the runtime
// counts against that limit. The router sizes its body budget and sheds
// load from these; nothing here decides what to refuse.
package memlimit

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
)

// RuntimeShare is the part of the container's limit given to the Go
// runtime as its soft limit: the rest is headroom for what the runtime
// does not count (libzmq's buffers, thread stacks, the C allocator).
const RuntimeShare = 0.9

// cgroupFiles are where a container's memory limit is read, cgroup v2
// first. The v1 file says a number near 2^63 when there is no limit.
var cgroupFiles = []string{"memory.max", "memory/memory.limit_in_bytes"}

// Container reads the memory limit of the cgroup the process runs in,
// under root (normally /sys/fs/cgroup). It returns 0 and no error when
// there is none.
func Container(root string) (int64, error) {
	for _, name := range cgroupFiles {
		b, err := os.ReadFile(filepath.Join(root, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("memory limit: %w", err)
		}
		return parseLimit(string(b))
	}
	return 0, nil
}

// parseLimit reads one cgroup limit file's content: "max" or a byte count;
// a count past 2^62 is v1's way of saying there is no limit.
func parseLimit(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" || s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("memory limit %q: %w", s, err)
	}
	if n == 0 || n >= 1<<62 {
		return 0, nil
	}
	return int64(n), nil
}

// Decision is how the runtime's soft limit came to be.
type Decision struct {
	// Limit is the runtime's soft limit in bytes; 0 when there is none.
	Limit int64
	// Source says where it came from: "GOMEMLIMIT", "cgroup" or "none".
	Source string
	// Container is the cgroup's limit (0: none or unknown).
	Container int64
}

// Apply sets the runtime's soft limit to RuntimeShare of the container's
// limit under root, unless GOMEMLIMIT already set one (which wins, as the
// runtime reads it at start). It reports what it found.
func Apply(root string) (Decision, error) {
	c, err := Container(root)
	d := Decision{Container: c, Source: "none"}
	if os.Getenv("GOMEMLIMIT") != "" {
		d.Limit, d.Source = Current(), "GOMEMLIMIT"
		return d, err
	}
	if c > 0 {
		d.Limit, d.Source = int64(float64(c)*RuntimeShare), "cgroup"
		debug.SetMemoryLimit(d.Limit)
	}
	return d, err
}

// Current is the runtime's soft limit in bytes, 0 when none is set.
func Current() int64 {
	l := debug.SetMemoryLimit(-1)
	if l <= 0 || l == math.MaxInt64 {
		return 0
	}
	return l
}

// Heap measures the memory the runtime counts against its soft limit
// (everything it mapped, less what it returned to the system). Each
// value owns its sample buffer: one per goroutine that reads it.
type Heap struct {
	samples []metrics.Sample
}

// NewHeap prepares a Heap.
func NewHeap() *Heap {
	return &Heap{samples: []metrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
	}}
}

// Bytes reads the counted memory now.
func (h *Heap) Bytes() int64 {
	metrics.Read(h.samples)
	total, released := h.samples[0].Value, h.samples[1].Value
	if total.Kind() != metrics.KindUint64 || released.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(total.Uint64() - released.Uint64())
}
