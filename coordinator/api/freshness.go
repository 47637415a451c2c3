package api

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// Reads that do not go back in time. A read is served from the local
// replica's ledger by default, which is fast and, under a partition,
// available; three rules keep what a client sees from moving backwards:
//
//   - a replica that has not yet applied the commit index it learned from
//     a leader after starting (a restarted replica replaying its log) does
//     not answer from its ledger: it forwards the read to the leader, or
//     answers 503 when it knows none;
//   - ?min_index=N (the X-Gpuaas-Index of the client's last write, or the
//     X-Gpuaas-Applied-Index of anything it read) makes the read wait,
//     bounded, until this replica has applied N; a replica that cannot
//     catch up in time forwards the read to the leader. That is
//     read-your-writes on any replica, which the CLI uses;
//   - ?consistent=true is linearizable: the leader answers after a Raft
//     barrier (a quorum round), so a deposed leader cannot answer it.
//
// ?stale asks for the local ledger even while the replica catches up
// (Consul's stale mode: any replica answers, leader or not). Every answer
// from a local ledger says how stale it may be: X-Gpuaas-Last-Contact
// (milliseconds since the leader was last heard) and X-Gpuaas-Known-Leader;
// every response carries X-Gpuaas-Applied-Index.

// minIndexWait bounds how long a read waits for ?min_index before it is
// forwarded to the leader: a replica that is connected lags by
// milliseconds.
const minIndexWait = 2 * time.Second

// CatchUpReporter is the part of a Backend that says whether the replica
// has caught up since it started (a *server.Server is one). A backend
// without it is always caught up.
type CatchUpReporter interface {
	CaughtUp() (bool, string)
}

// freshness is a read's parsed ?stale and ?min_index.
type freshness struct {
	stale    bool
	minIndex uint64
}

func parseFreshness(q url.Values, consistent bool) (freshness, error) {
	var f freshness
	if q.Has("stale") {
		f.stale = true
		if v := q.Get("stale"); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return f, proto.Errorf(proto.CodeInvalidArgument, "stale=%q is not a boolean (true or false; ?stale alone is true)", v)
			}
			f.stale = b
		}
	}
	if f.stale && consistent {
		return f, proto.Errorf(proto.CodeInvalidArgument, "stale and consistent=true contradict each other; give one")
	}
	if v := q.Get("min_index"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return f, proto.Errorf(proto.CodeInvalidArgument, "min_index=%q is not a non-negative integer", v)
		}
		f.minIndex = n
	}
	return f, nil
}

// fresh checks that this replica may answer c from its ledger under f:
// it has caught up since starting (unless stale) and applied min_index
// (waiting up to minIndexWait). A replica that may not answer returns a
// not-leader error, which forwards the read to the leader, or, for a
// request already forwarded, unavailable.
func (c *call) fresh(ctx context.Context, f freshness) error {
	forwarded := c.r.Header.Get(proto.ForwardedHeader) != ""
	refuse := func(why string) error {
		if forwarded || c.a.b.IsLeader() {
			return proto.Errorf(proto.CodeUnavailable, "%s; retry shortly", why)
		}
		return proto.Errorf(proto.CodeNotLeader, "%s", why)
	}
	if !f.stale {
		if cu, ok := c.a.b.(CatchUpReporter); ok {
			if ok, why := cu.CaughtUp(); !ok {
				return refuse("this replica has not caught up since it started (" + why + "); add ?stale to read its ledger anyway")
			}
		}
	}
	if f.minIndex > 0 && !c.a.awaitApplied(ctx, f.minIndex, min(minIndexWait, remaining(ctx))) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return refuse("this replica has applied index " + strconv.FormatUint(c.a.appliedIndex(), 10) +
			", behind min_index " + strconv.FormatUint(f.minIndex, 10))
	}
	return nil
}

// remaining is the time left before ctx's deadline (an hour without one).
func remaining(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return time.Until(d)
	}
	return time.Hour
}

// appliedIndex is the index this replica's ledger has applied.
func (a *API) appliedIndex() uint64 {
	st := a.b.Store()
	if st == nil {
		return 0
	}
	return st.Snapshot().Index()
}

// replicaHeaders sets the headers every response carries, just before
// its header is sent.
func (a *API) replicaHeaders(h http.Header) {
	if a.b.Store() != nil {
		h.Set(proto.AppliedIndexHeader, strconv.FormatUint(a.appliedIndex(), 10))
	}
}

// staleness sets the headers of an answer from the local ledger.
func (a *API) staleness(h http.Header) {
	h.Set(proto.KnownLeaderHeader, strconv.FormatBool(a.b.IsLeader() || a.b.LeaderHTTPAddr() != ""))
	var ms int64
	if !a.b.IsLeader() {
		if cv, ok := a.b.(ClusterView); ok {
			if lc := cv.LastContact(); !lc.IsZero() {
				ms = time.Since(lc).Milliseconds()
			} else {
				ms = -1
			}
		}
	}
	if ms >= 0 {
		h.Set(proto.LastContactHeader, strconv.FormatInt(ms, 10))
	}
}
