package leases

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func lease(slot, alloc string, gen uint64) Lease {
	return Lease{SlotID: slot, AllocationID: alloc, ClaimID: "c-" + alloc + "-" + slot, Generation: gen,
		Plan: json.RawMessage(`{"allocation_id":"` + alloc + `"}`), TakenAt: t0}
}

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestLeaseContract(t *testing.T) {
	t.Parallel()
	s := open(t, t.TempDir())

	got, err := s.Take([]Lease{lease("n-s0", "a1", 1), lease("n-s1", "a1", 1)})
	require.NoError(t, err)
	assert.Len(t, got, 2)

	// Same allocation/generation again: idempotent, the original kept.
	again := lease("n-s0", "a1", 1)
	again.TakenAt = t0.Add(time.Hour)
	got, err = s.Take([]Lease{again})
	require.NoError(t, err)
	assert.Equal(t, t0, got[0].TakenAt, "the held lease is returned unchanged")

	// A conflicting live lease is refused; nothing of the set is taken.
	_, err = s.Take([]Lease{lease("n-s2", "a2", 1), lease("n-s1", "a2", 2)})
	require.ErrorIs(t, err, sched.ErrLeaseConflict)
	_, ok, err := s.Get("n-s2")
	require.NoError(t, err)
	assert.False(t, ok, "all-or-nothing: n-s2 was not taken")

	// Taking the other allocation's slots after a1's release works.
	rel, err := s.Release("a1")
	require.NoError(t, err)
	assert.Len(t, rel, 2)
	_, err = s.Take([]Lease{lease("n-s2", "a2", 1), lease("n-s1", "a2", 2)})
	require.NoError(t, err)
}

func TestFencing(t *testing.T) {
	t.Parallel()
	s := open(t, t.TempDir())
	_, err := s.Take([]Lease{lease("n-s0", "a5", 5)})
	require.NoError(t, err)
	_, err = s.Take([]Lease{lease("n-s0", "a4", 4)})
	require.ErrorIs(t, err, sched.ErrLeaseFenced)

	// A stale release does not drop the newer lease.
	err = s.ReleaseSlot("n-s0", 4)
	require.ErrorIs(t, err, sched.ErrLeaseFenced)
	l, ok, err := s.Get("n-s0")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, "a5", l.AllocationID)
	require.NoError(t, s.ReleaseSlot("n-s0", 5))
	assert.True(t, errors.Is(s.ReleaseSlot("n-s0", 5), ErrNoLease))
}

func TestSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(dir)
	require.NoError(t, err)
	_, err = s.Take([]Lease{lease("n-s0", "a1", 1), lease("n-s1", "a1", 1), lease("n-s2", "a2", 3)})
	require.NoError(t, err)
	_, fresh, err := s.BeginTask(proto.Task{ID: "t1", Type: proto.TaskTopologyDiscover}, t0)
	require.NoError(t, err)
	require.True(t, fresh)
	_, err = s.FinishTask("t1", json.RawMessage(`{"ok":true}`), nil, t0)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	s = open(t, dir)
	ls, err := s.List()
	require.NoError(t, err)
	require.Len(t, ls, 3)
	assert.Equal(t, lease("n-s2", "a2", 3).Key(), ls[2].Key())
	assert.JSONEq(t, `{"allocation_id":"a2"}`, string(ls[2].Plan))

	// The task does not run again after the restart.
	rec, fresh, err := s.BeginTask(proto.Task{ID: "t1", Type: proto.TaskTopologyDiscover}, t0.Add(time.Minute))
	require.NoError(t, err)
	assert.False(t, fresh)
	assert.Equal(t, TaskDone, rec.State)
	assert.JSONEq(t, `{"ok":true}`, string(rec.Result))

	rel, err := s.Release("a1")
	require.NoError(t, err)
	assert.Len(t, rel, 2)
	ls, err = s.List()
	require.NoError(t, err)
	assert.Len(t, ls, 1)
}

func TestTaskJournal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	_, fresh, err := s.BeginTask(proto.Task{ID: "t2", Type: proto.TaskSliceProvision, AllocationID: "a1"}, t0)
	require.NoError(t, err)
	require.True(t, fresh)
	// Crash while running: a re-delivery counts an attempt and is not fresh.
	rec, fresh, err := s.BeginTask(proto.Task{ID: "t2"}, t0)
	require.NoError(t, err)
	assert.False(t, fresh)
	assert.Equal(t, TaskRunning, rec.State)
	assert.Equal(t, 2, rec.Attempts)

	rec, err = s.FinishTask("t2", nil, errors.New("clone failed"), t0)
	require.NoError(t, err)
	assert.Equal(t, TaskFailed, rec.State)
	require.NoError(t, s.MarkReported("t2"))
	rec, ok, err := s.Task("t2")
	require.NoError(t, err)
	require.True(t, ok)
	assert.True(t, rec.Reported)
	assert.Equal(t, "clone failed", rec.Error)

	_, _, err = s.BeginTask(proto.Task{}, t0)
	assert.Error(t, err)
	_, err = s.FinishTask("nope", nil, nil, t0)
	assert.ErrorContains(t, err, "not journaled")
}

func TestSecondOpenTimesOut(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open(t, dir)
	_, err := Open(dir)
	require.Error(t, err, "bbolt holds an exclusive lock: a second agent on the same state dir is refused")
}
