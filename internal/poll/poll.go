// Package poll is the one way the project's tests wait for something that
// happens on another goroutine, socket or process: they poll a condition
// until it holds. The deadline only turns a hang into a failure; it
// asserts nothing about speed (the machines are shared and noisy).
package poll

import (
	"testing"
	"time"
)

// Deadline is how long Until waits before it fails the test.
const Deadline = 20 * time.Second

// interval is the pause between two looks at the condition.
const interval = 10 * time.Millisecond

// Until polls cond until it holds, failing t after Deadline with what it
// waited for.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Within(t, Deadline, what, cond)
}

// Within is Until with a deadline of its own, for waits that are long by
// nature (a process starting, a timeout under test).
func Within(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(interval)
	}
}
