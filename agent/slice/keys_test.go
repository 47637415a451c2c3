package slice

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/images/seed"
	"github.com/gpuaas/gpuaas/proto"
)

// seedKeys returns the authorized keys of an allocation's seed ISO.
func seedKeys(t *testing.T, e *env, alloc string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(e.opts.StateDir, alloc, "seed.iso"))
	require.NoError(t, err)
	defer f.Close()
	_, files, err := seed.Read(f)
	require.NoError(t, err)
	keys, err := seedList(string(files[seed.UserData]), "ssh_authorized_keys:")
	require.NoError(t, err)
	return keys
}

func record(t *testing.T, e *env, alloc string) Record {
	t.Helper()
	rec, ok, err := e.journal.Get(alloc)
	require.NoError(t, err)
	require.True(t, ok, alloc)
	return rec
}

// secondRequest is alloc-2 on its own address.
func secondRequest(t *testing.T) ProvisionRequest {
	req := testRequest(t)
	req.AllocationID = "alloc-2"
	for i := range req.Plan.Devices {
		req.Plan.Devices[i].MAC = "52:54:00:00:00:2" + string(rune('0'+i))
		req.Plan.Devices[i].IP = "10.200.0.2" + string(rune('0'+i))
	}
	return req
}

// Each allocation gets its own key: its seed authorizes it (beside the
// tenant's keys) and nothing else of the agent's, and the readiness gate
// logs in with it (the fake guest, like sshd, accepts only its seed's keys).
func TestAgentKeyPerAllocation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.hv.onStart = func(string) { e.dh.grant(testAlloc); e.dh.grant("alloc-2") }
	req1, req2 := testRequest(t), secondRequest(t)
	_, err := e.rt.Provision(ctx, req1, nil)
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(provisionTranscript, e.tr.take()))
	_, err = e.rt.Provision(ctx, req2, nil)
	require.NoError(t, err)
	calls := e.tr.take()
	assert.Empty(t, cmp.Diff([]string{
		`ssh 10.200.0.20 as "gpuaas-agent alloc-2": "cat /run/gpuaas/instance-id"`,
		`ssh 10.200.0.20 as "gpuaas-agent alloc-2": "shasum -a 256 /disk/gpuaas/marker || sha256sum /disk/gpuaas/marker"`,
	}, calls[len(calls)-2:]))

	rec1, rec2 := record(t, e, testAlloc), record(t, e, "alloc-2")
	require.NotNil(t, rec1.AgentKey)
	require.NotNil(t, rec2.AgentKey)
	assert.NotEqual(t, rec1.AgentKey.Public, rec2.AgentKey.Public)
	assert.NotEqual(t, rec1.AgentKey.Private, rec2.AgentKey.Private)
	assert.Regexp(t, `^ssh-ed25519 \S+ gpuaas-agent alloc-1$`, rec1.AgentKey.Public)
	assert.Equal(t, "j22u15-s0@3,j22u15-s1@3", rec1.AgentKey.Generation)
	s1, err := rec1.AgentKey.Signer()
	require.NoError(t, err)
	assert.Equal(t, rec1.AgentKey.Public, authorizedLine(s1, "gpuaas-agent alloc-1"), "the stored private key is the seeded one")

	// The seeds: the tenant's key and the allocation's own, never the
	// agent-wide key nor another allocation's.
	assert.Equal(t, []string{req1.SSHKeys[0], rec1.AgentKey.Public}, seedKeys(t, e, testAlloc))
	assert.Equal(t, []string{req2.SSHKeys[0], rec2.AgentKey.Public}, seedKeys(t, e, "alloc-2"))
	for _, alloc := range []string{testAlloc, "alloc-2"} {
		assert.NotContains(t, seedKeys(t, e, alloc), authorizedLine(e.agentKey, "gpuaas-agent"))
	}

	// The journal holding the private keys is 0600.
	st, err := os.Stat(filepath.Join(e.journalDir, JournalFile))
	require.NoError(t, err)
	assert.Equal(t, JournalMode, st.Mode().Perm())

	// alloc-1's key does not open alloc-2's guest.
	_, err = e.guest.Run(ctx, netip.MustParseAddr("10.200.0.20"), s1, "cat /run/gpuaas/instance-id")
	assert.ErrorContains(t, err, "unable to authenticate")
}

// A restarted agent (a new Runtime on the reopened journal, without any
// agent-wide key) probes the live guest with the allocation's stored key.
func TestAgentKeySurvivesRestart(t *testing.T) {
	t.Parallel()
	e := provisioned(t)
	before := record(t, e, testAlloc).AgentKey
	require.NoError(t, e.journal.Close())
	j, err := OpenJournal(e.journalDir)
	require.NoError(t, err)
	t.Cleanup(func() { j.Close() })
	e.journal, e.agentKey = j, nil
	rt := e.newRuntime(t)

	r, err := rt.Reconcile(context.Background(), []string{testAlloc})
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(reconcileIdle, e.tr.take()))
	assert.Empty(t, cmp.Diff(Reconciliation{Guests: []GuestProbe{healthyProbe}}, r))
	assert.Equal(t, before, record(t, e, testAlloc).AgentKey)
}

// A record from before per-allocation keys has none: its guest was seeded
// with the agent-wide key, which the probe falls back to.
func TestAgentKeyLegacyRecordFallsBack(t *testing.T) {
	t.Parallel()
	e := provisioned(t)
	rec := record(t, e, testAlloc)
	rec.AgentKey = nil
	require.NoError(t, e.journal.Put(rec))
	// The guest as an older agent seeded it.
	e.guest.bootWith(netip.MustParseAddr(rec.IP), []string{authorizedKey(t, "tenant"), authorizedLine(e.agentKey, "gpuaas-agent")})

	r, err := e.rt.Reconcile(context.Background(), []string{testAlloc})
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(append(reconcileIdle[:2:2], `ssh 10.200.0.10 as "gpuaas-agent": "cat /run/gpuaas/instance-id"`), e.tr.take()))
	want := healthyProbe
	want.Key, want.Evidence = KeyAgent, "ssh 10.200.0.10 with the agent key: instance-id i-test matches the seed"
	assert.Empty(t, cmp.Diff(Reconciliation{Guests: []GuestProbe{want}}, r))

	// An agent without the agent-wide key cannot probe it: drift, no login.
	e.agentKey = nil
	r, err = e.newRuntime(t).Reconcile(context.Background(), []string{testAlloc})
	require.NoError(t, err)
	assert.Equal(t, []string{"allocation alloc-1: guest not probed: allocation alloc-1: no agent key in its record and no agent-wide key"}, r.Drift)
	assert.Empty(t, cmp.Diff(reconcileIdle[:2], e.tr.take()))
}

// An interrupted provision of a live allocation keeps its key for the
// re-delivered task, which seeds the same key again; new slot claims
// (another generation) get a fresh one.
func TestAgentKeyReusedByRerun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		bump    bool
		sameKey bool
	}{{"same generation reuses", false, true}, {"new generation replaces", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.fp.Exit = func(code int) { panic(crash{code}) }
			e.fp.Set("slice/after-define_start", ActionCrash)
			req := testRequest(t)
			require.True(t, provisionUntilCrash(e.rt, req))
			k1 := record(t, e, testAlloc).AgentKey
			require.NotNil(t, k1, "the key is durable before the seed")

			e.fp.Set("slice/after-define_start", "")
			rt := e.newRuntime(t)
			r, err := rt.Reconcile(context.Background(), []string{testAlloc})
			require.NoError(t, err)
			require.Equal(t, []string{testAlloc}, r.TornDown)
			rec := record(t, e, testAlloc)
			require.Equal(t, PhaseInterrupted, rec.Phase)
			require.Equal(t, k1, rec.AgentKey, "kept for the re-delivered provision")

			if tc.bump {
				for i := range req.Slots {
					req.Slots[i].Generation++
				}
			}
			_, err = rt.Provision(context.Background(), req, nil)
			require.NoError(t, err)
			k2 := record(t, e, testAlloc).AgentKey
			require.NotNil(t, k2)
			assert.Equal(t, tc.sameKey, k1.Public == k2.Public)
			assert.Equal(t, []string{req.SSHKeys[0], k2.Public}, seedKeys(t, e, testAlloc))
		})
	}
}

// The key is destroyed once nothing may log in to the guest again.
func TestAgentKeyDestroyed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("release", func(t *testing.T) {
		t.Parallel()
		e := provisioned(t)
		k := record(t, e, testAlloc).AgentKey
		require.NotNil(t, k)
		_, err := e.rt.Release(ctx, ReleaseRequest{AllocationID: testAlloc}, nil)
		require.NoError(t, err)
		rec := record(t, e, testAlloc)
		assert.Nil(t, rec.AgentKey)
		for _, s := range rec.Slots {
			assert.NotNil(t, s.Proof, "destroyed after the wipe")
		}
	})
	t.Run("reconcile releases a dead allocation", func(t *testing.T) {
		t.Parallel()
		e := provisioned(t)
		r, err := e.rt.Reconcile(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, []string{testAlloc}, r.Released)
		assert.Nil(t, record(t, e, testAlloc).AgentKey)
	})
	t.Run("provision failed", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.hv.onStart = nil // no lease: fails after the seed and the boot
		_, err := e.rt.Provision(ctx, testRequest(t), nil)
		require.Error(t, err)
		rec := record(t, e, testAlloc)
		assert.Equal(t, PhaseFailed, rec.Phase)
		assert.False(t, rec.Defined, "torn down first")
		assert.Nil(t, rec.AgentKey)
	})
	t.Run("interrupted and no longer live", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.fp.Exit = func(code int) { panic(crash{code}) }
		e.fp.Set("slice/after-define_start", ActionCrash)
		require.True(t, provisionUntilCrash(e.rt, testRequest(t)))
		e.fp.Set("slice/after-define_start", "")
		r, err := e.newRuntime(t).Reconcile(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, []string{"j22u15-s0", "j22u15-s1"}, r.Wiped)
		assert.Nil(t, record(t, e, testAlloc).AgentKey)
	})
	t.Run("cleanup of the last touched slot", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.fp.Exit = func(code int) { panic(crash{code}) }
		e.fp.Set("slice/after-define_start", ActionCrash)
		req := testRequest(t)
		require.True(t, provisionUntilCrash(e.rt, req))
		e.fp.Set("slice/after-define_start", "")
		rt := e.newRuntime(t)
		_, err := rt.Reconcile(ctx, []string{testAlloc}) // live: torn down, key kept
		require.NoError(t, err)
		require.NotNil(t, record(t, e, testAlloc).AgentKey)
		_, err = rt.Cleanup(ctx, proto.SlotCleanupPayload{SlotID: "j22u15-s0", Capacity: req.Slots[0].Capacity}, nil)
		require.NoError(t, err)
		assert.NotNil(t, record(t, e, testAlloc).AgentKey, "slot 1 is still touched")
		_, err = rt.Cleanup(ctx, proto.SlotCleanupPayload{SlotID: "j22u15-s1", Capacity: req.Slots[1].Capacity}, nil)
		require.NoError(t, err)
		assert.Nil(t, record(t, e, testAlloc).AgentKey)
	})
}

func TestOpenJournalRestrictsMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	j, err := OpenJournal(dir)
	require.NoError(t, err)
	require.NoError(t, j.Close())
	path := filepath.Join(dir, JournalFile)
	require.NoError(t, os.Chmod(path, 0o644))
	j, err = OpenJournal(dir)
	require.NoError(t, err)
	defer j.Close()
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, JournalMode, st.Mode().Perm())
}

func TestAgentKeyParts(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "a@2,b@1", keyGeneration([]proto.Slot{{ID: "b", Generation: 1}, {ID: "a", Generation: 2}}))
	k, err := NewAgentKey("a1", "g", time.Unix(5, 0))
	require.NoError(t, err)
	s, err := k.Signer()
	require.NoError(t, err)
	assert.Equal(t, k.Public, authorizedLine(s, KeyComment("a1")))
	assert.Equal(t, time.Unix(5, 0).UTC(), k.CreatedAt)
	_, err = (&AgentKey{Private: "garbage"}).Signer()
	assert.ErrorContains(t, err, "parse agent key")
	var none *AgentKey
	_, err = none.Signer()
	assert.Error(t, err)
	for phase, want := range map[string][2]bool{ // [live, not live]
		PhaseActive: {true, true}, PhaseProvisioning: {true, true}, PhaseReleasing: {true, true},
		PhaseInterrupted: {true, false}, PhaseFailed: {false, false}, PhaseReleased: {false, false},
	} {
		assert.Equal(t, want, [2]bool{keyNeeded(phase, true), keyNeeded(phase, false)}, phase)
	}
}
