package router

import (
	"context"
	"time"

	"github.com/prefixrouter/prefixrouter/eventplane"
	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// The router composes health and the event plane, and data flows one way:
// health's registry changes and snapshots go through the router into the
// plane (followTarget, feedCaches); the request path reads both and tells
// each what concerns it (health the flight, the plane the expectation).
// Neither leaf knows the other.

// followTarget hands a registry change to the event plane. It runs on
// health's notifying goroutine and must not block for long.
func (r *Router) followTarget(c health.Change) {
	id := c.Target.ID
	switch c.Kind {
	case health.Added, health.Updated:
		r.ev.SetTarget(id, eventplane.Source{Events: c.Target.Events, EventsImplied: c.Target.EventsImplied,
			Replay: c.Target.Replay, Topic: c.Target.Topic})
	case health.Restarted:
		r.ev.TargetRestarted(id)
	case health.Removed:
		r.ev.RemoveTarget(id)
	}
}

// feedCaches hands the event plane what health says of each pod (serving
// or not, and its cache configuration) from every new health snapshot
// until ctx ends: it configures block keys, expected blocks,
// prefix-caching verdicts and placement caps, and tells a pod still
// starting from a serving pod whose stream is not wired.
func (r *Router) feedCaches(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	var seen uint64
	for {
		if snap := r.mon.Snapshot(); snap != nil && snap.Version != seen {
			seen = snap.Version
			r.ev.SetCaches(cachesOf(snap))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// cachesOf translates health's view of each pod for the event plane. A pod
// that did not report its block size takes the one its model's pods agree
// on.
func cachesOf(s *health.Snapshot) map[targetid.ID]eventplane.Cache {
	out := make(map[targetid.ID]eventplane.Cache, len(s.Targets))
	for _, t := range s.Targets {
		c := eventplane.Cache{
			Serving:               t.State == health.StateRoutable || t.State == health.StateDegraded,
			Reported:              t.Cache.Known && t.Cache.BlockSize > 0,
			HashAlgo:              t.Cache.HashAlgo,
			NumGPUBlocks:          t.Cache.NumGPUBlocks,
			PrefixCachingDisabled: t.Cache.PrefixCachingDisabled(),
			PrefixCaching:         t.Cache.PrefixCaching,
		}
		if c.Reported {
			c.BlockSize = t.Cache.BlockSize
		} else {
			for _, mod := range t.Models {
				if bs := s.Models[mod].BlockSize; bs > 0 {
					c.BlockSize = bs
					break
				}
			}
		}
		out[t.ID] = c
	}
	return out
}
