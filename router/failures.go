package router

import (
	"time"

	"github.com/prefixrouter/prefixrouter/targetid"
)

// upstreamFailure is the last failure the proxy saw on a target. A client
// hears only that the model server failed, without addresses (errors.go);
// the operator finds the detail here, in GET /debug/targets on the admin
// listener, by the request id the client got, and in the log.
type upstreamFailure struct {
	At        time.Time `json:"at"`
	Reason    string    `json:"reason"` // prefixrouter_upstream_errors_total's
	Detail    string    `json:"detail"`
	RequestID string    `json:"request_id"`
}

// upstreamFailed counts a failure of the attempt's target by reason and
// keeps it as the target's last.
func (a *attempt) upstreamFailed(reason, detail string) {
	a.r.met.upstreamErrors.WithLabelValues(a.name, reason).Inc()
	id := a.d.Target().Target.ID
	a.r.failures.Store(id, &upstreamFailure{At: time.Now(), Reason: reason, Detail: detail, RequestID: a.x.id})
}

// lastFailure is target id's last upstream failure, or nil.
func (r *Router) lastFailure(id targetid.ID) *upstreamFailure {
	if f, ok := r.failures.Load(id); ok {
		return f.(*upstreamFailure)
	}
	return nil
}
