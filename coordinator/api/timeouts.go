package api

import (
	"context"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// Request deadlines: no client waits on a route longer than
// proto.MaxBlockingWait for a blocking query (?index) or
// proto.MaxRequestTime for anything else. The deadline is the request
// context's: Raft applies and barriers take their timeout from it
// (server.timeout), forwarding gives up when it passes (forward.go) and
// blocking queries answer a little before it (query.go). Streams are
// exempt by name: they are bounded by the bytes they carry and the body
// timeout (limits.go), not by a clock. Blob routes (images.go) never come
// through dispatch and stream too.

// blockingAnswerMargin is how long before the deadline a blocking query
// stops waiting, to answer with the current state in time.
const blockingAnswerMargin = 250 * time.Millisecond

// maxRequestTime is proto.MaxRequestTime (a variable so tests can
// shorten it).
var maxRequestTime = proto.MaxRequestTime

// streamRoutes are the routes without a deadline, as "METHOD pattern".
var streamRoutes = map[string]bool{
	"GET /v1/bundles/{digest}/content": true,
}

// routeDeadline is the deadline of one request to c's route, 0 for none.
func routeDeadline(c *call) time.Duration {
	if streamRoutes[c.rt.Method+" "+c.rt.Pattern] {
		return 0
	}
	if c.r.URL.Query().Has("index") {
		return proto.MaxBlockingWait
	}
	return maxRequestTime
}

// withDeadline puts c's route deadline on its request context and
// returns the cancel to defer.
func (a *API) withDeadline(c *call) context.CancelFunc {
	d := routeDeadline(c)
	if d == 0 {
		return func() {}
	}
	ctx, cancel := context.WithTimeout(c.r.Context(), d)
	c.r = c.r.WithContext(ctx)
	return cancel
}
