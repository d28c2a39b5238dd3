// Package logbuf owns a log sink for tests: a buffer that log handlers on
// any goroutine may write while the test reads the lines so far.
package logbuf

import (
	"strings"
	"sync"
)

// Buffer collects written text. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write implements io.Writer.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Lines returns the lines written so far that contain every one of parts.
func (l *Buffer) Lines(parts ...string) []string {
	var out []string
next:
	for _, line := range strings.Split(l.String(), "\n") {
		if line == "" {
			continue
		}
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}
