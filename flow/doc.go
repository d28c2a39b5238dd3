// Package flow owns the router's waiting line for the time past saturation:
// the priority classes and their TTFT objectives, the tenants' weighted
// shares, the line's bounds in requests and tokens, and the order in which
// waiting requests leave it. Classes leave strictly by priority; within a
// class, tenants share by start-time fair queuing on tokens (prompt plus
// expected output), so that a tenant sending five times its share waits
// behind the others instead of taking five times the fleet. It knows
// nothing of pods, decisions or HTTP: brain decides when the head of the
// line may leave and whether a newcomer can meet its deadline, from the
// tokens the line puts ahead of it (Ahead).
package flow
