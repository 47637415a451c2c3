package api

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/blobs"
	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// lateLeader is a leader whose ledger has not yet applied its log until
// ready is set.
type lateLeader struct {
	*ledgerBackend
	ready atomic.Bool
}

func (l *lateLeader) LeaderReady() (bool, string) {
	if l.ready.Load() {
		return true, ""
	}
	return false, "became the leader at index 9, applied 0"
}

// TestWriteWaitsForALeaderToApplyItsLog: a newly elected leader whose
// ledger lags its log does not check writes against it: a write waits
// (bounded) until the ledger has caught up, and is refused unrun with
// 503 if it does not in time; reads are not held.
func TestWriteWaitsForALeaderToApplyItsLog(t *testing.T) {
	t.Parallel()
	lb := newLedgerBackend()
	ll := &lateLeader{ledgerBackend: lb}
	e := newEnvWith(t, ll)
	e.lb = lb

	r, took := timed(func() resp {
		return e.do(RoleAdmin, http.MethodPut, "/v1/regions/late", proto.RegionPutBody{})
	})
	p := r.requireProblem(t, http.StatusServiceUnavailable, proto.CodeUnavailable)
	assert.Contains(t, p.Detail, "has not applied its log yet")
	assert.Contains(t, p.Detail, "applied 0")
	assert.Contains(t, p.Detail, "not run")
	assert.GreaterOrEqual(t, took, leaderReadyWait)
	assert.Less(t, took, leaderReadyWait+time.Second)
	_, ok := lb.Store().Snapshot().Region("late")
	assert.False(t, ok, "not applied")

	// Reads are served meanwhile.
	require.Equal(t, http.StatusOK, e.do(RoleViewer, http.MethodGet, "/v1/regions", nil).status)

	// Caught up while the write waits: it is served.
	time.AfterFunc(200*time.Millisecond, func() { ll.ready.Store(true) })
	r = e.do(RoleAdmin, http.MethodPut, "/v1/regions/late", proto.RegionPutBody{})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	_, ok = lb.Store().Snapshot().Region("late")
	assert.True(t, ok)
}

// TestWriteWaitingForALeaderWaitsForItToApplyItsLog: a write that came
// to a follower while no leader was known waits for one; when this
// replica wins the election meanwhile (a replica restarted moments ago:
// it holds the log but its ledger has not applied it), the write is not
// checked against the unapplied ledger: it waits for the ledger like any
// write on a new leader, and is refused unrun (503) if it does not catch
// up in time. The fault rig caught such a write answered 404 ("region
// does not exist") for a region the log held.
func TestWriteWaitingForALeaderWaitsForItToApplyItsLog(t *testing.T) {
	t.Parallel()
	lb := newLedgerBackend()
	ll := &lateLeader{ledgerBackend: lb}
	e := newEnvWith(t, ll)
	e.lb = lb
	win := func() {
		lb.mu.Lock()
		defer lb.mu.Unlock()
		lb.leader, lb.leaderAddr = true, ""
	}

	lb.setFollower("") // no leader known: the write waits for one
	time.AfterFunc(100*time.Millisecond, win)
	r, took := timed(func() resp {
		return e.do(RoleAdmin, http.MethodPut, "/v1/regions/late", proto.RegionPutBody{})
	})
	p := r.requireProblem(t, http.StatusServiceUnavailable, proto.CodeUnavailable)
	assert.Contains(t, p.Detail, "has not applied its log yet")
	assert.Contains(t, p.Detail, "not run")
	assert.GreaterOrEqual(t, took, leaderReadyWait)
	_, ok := lb.Store().Snapshot().Region("late")
	assert.False(t, ok, "a write was run against a ledger that had not applied the log")

	// The ledger catches up while the write waits: it is served.
	lb.setFollower("")
	time.AfterFunc(100*time.Millisecond, win)
	time.AfterFunc(300*time.Millisecond, func() { ll.ready.Store(true) })
	r = e.do(RoleAdmin, http.MethodPut, "/v1/regions/late", proto.RegionPutBody{})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	_, ok = lb.Store().Snapshot().Region("late")
	assert.True(t, ok)
}

// lateBlobLeader is a blob-serving leader whose ledger has not yet applied
// its log until ready is set.
type lateBlobLeader struct {
	blobLedger
	ready *atomic.Bool
}

func (l lateBlobLeader) LeaderReady() (bool, string) {
	if l.ready.Load() {
		return true, ""
	}
	return false, "became the leader at index 9, applied 0"
}

// TestBlobUploadWaitsForALeaderToApplyItsLog: an image upload (a streamed
// write that does not go through dispatch) to a newly elected leader
// whose ledger lags its log is not refused "not in the catalog" from
// that ledger: it is refused unrun (503) until the ledger has caught up,
// and only then told the entry does not exist.
func TestBlobUploadWaitsForALeaderToApplyItsLog(t *testing.T) {
	t.Parallel()
	st, err := blobs.Open(t.TempDir())
	require.NoError(t, err)
	bl := blobLedger{ledgerBackend: newLedgerBackend(), store: st, tab: enroll.New()}
	ll := lateBlobLeader{blobLedger: bl, ready: &atomic.Bool{}}
	e := newEnvWith(t, ll)
	e.lb = bl.ledgerBackend
	data, digest := blobOf(t, 1000)
	octet := []string{"Content-Type", "application/octet-stream"}

	p := e.do(RoleAdmin, http.MethodPut, "/v1/images/base/1/blob", data, octet...).requireProblem(t, http.StatusServiceUnavailable, proto.CodeUnavailable)
	assert.Contains(t, p.Detail, "has not applied its log yet")
	assert.False(t, st.Has(digest, int64(len(data))))

	ll.ready.Store(true)
	e.do(RoleAdmin, http.MethodPut, "/v1/images/base/1/blob", data, octet...).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
}
