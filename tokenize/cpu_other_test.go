//go:build !linux

package tokenize

import "time"

// threadCPU needs RUSAGE_THREAD (Linux); elsewhere it reports nothing and
// benchmarks leave out their CPU-time figures.
func threadCPU() time.Duration { return 0 }
